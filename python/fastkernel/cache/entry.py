"""The entry file format: an untrusted file of a fixed prefix, a JSON header with the launch
metadata, and the cubin, checksummed; encoding, and decoding with every field checked
(docs/cache.md, "Entry files")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import keyword
import logging
import os
import pathlib
import re
import struct
import types
import typing
from collections.abc import Mapping
from typing import Any

from .. import _arguments
from .. import _triton_abi as abi
from . import files as _fs

log = logging.getLogger("fastkernel.cache")

#: Bumped whenever the file layout, the header schema or the key's ingredients change.
FORMAT_VERSION = 2  # 2: the launch metadata holds tensordesc_meta
ENTRY_SUFFIX = ".fkc"
_MAGIC = b"FKCACHE\0"
# magic, format version (u32), header length (u32), cubin length (u64), then the sha256 of
# everything else in the file (the fixed fields, the header and the cubin).
_FIXED = struct.Struct("<8sIIQ")
_DIGEST_SIZE = 32
_PREFIX_SIZE = _FIXED.size + _DIGEST_SIZE
_MAX_HEADER = 1 << 20  # a header is a few KB; anything far larger is not ours
_MAX_CUBIN = 256 << 20  # the largest cubin an entry may hold (as for bundles, csrc/bundle.cpp)
MAX_ENTRY_FILE = _PREFIX_SIZE + _MAX_HEADER + _MAX_CUBIN

#: The fields of ``abi.LaunchMetadata`` stored in an entry's header (all but the cubin, which
#: follows the header), with the JSON type each must have: the field's annotated type, or for a
#: generic one (``list[...]``) its origin.
_LAUNCH_HINTS = typing.get_type_hints(abi.LaunchMetadata)
LAUNCH_FIELDS: dict[str, type] = {
    field.name: typing.get_origin(_LAUNCH_HINTS[field.name]) or _LAUNCH_HINTS[field.name]
    for field in dataclasses.fields(abi.LaunchMetadata)
    if field.name != "cubin"
}

#: The keys of one ``tensordesc_meta`` entry the native launcher reads, with their JSON types.
_TENSORDESC_META_FIELDS: dict[str, type] = {
    "swizzle": int,
    "elem_size": int,
    "elem_type": int,
    "block_size": list,
    "fp4_padded": bool,
}


def _valid_tensordesc_meta(value: Any) -> bool:
    # At most 64 descriptors; per descriptor the CUtensorMap limits (cuTensorMapEncodeTiled):
    # rank 1-5, box dimensions 1-256, element size 1-8 bytes, a swizzle mode 0-3.
    return len(value) <= 64 and all(
        isinstance(m, dict)
        and all(type(m.get(k)) is kind for k, kind in _TENSORDESC_META_FIELDS.items())
        and 1 <= len(m["block_size"]) <= 5
        and all(type(b) is int and 0 < b <= 256 for b in m["block_size"])
        and 0 <= m["swizzle"] <= 3
        and 1 <= m["elem_size"] <= 8
        and 0 <= m["elem_type"] <= 15
        for m in value
    )


_ENTRIES = "entries"


def entries_dir(root: pathlib.Path) -> pathlib.Path:
    return root / _ENTRIES


def entry_file(root: str | os.PathLike[str], key: str) -> str:
    """Where the entry for ``key`` lives under cache directory ``root``
    (``entries/<first two hex digits>/<key>.fkc``), as a string, for the warm path."""
    return os.path.join(root, _ENTRIES, key[:2], f"{key}{ENTRY_SUFFIX}")


def entry_path(root: pathlib.Path, key: str) -> pathlib.Path:
    """:func:`entry_file` as a path.

    Raises
    ------
    TypeError
        ``root`` is not a str or os.PathLike, or ``key`` not a str.
    ValueError
        ``key`` is not an entry key (64 lowercase hex digits).
    """
    root = _arguments.path("entry_path", "root", root)
    _arguments.instance("entry_path", "key", key, str, "a str")
    if not is_sha256_hex(key):
        raise ValueError(
            f"entry_path(): argument 'key' must be 64 lowercase hex digits, not {key!r:.80}"
        )
    return pathlib.Path(entry_file(root, key))


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(text: str) -> bool:
    """Whether ``text`` is a sha256 digest as ``hexdigest()`` spells it: 64 lowercase hex digits."""
    return _SHA256_HEX.fullmatch(text) is not None


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# -- one entry on disk ----------------------------------------------------------------------


class CorruptEntry(Exception):
    """An entry file that is truncated, corrupted or not a fastkernel entry."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry read and verified from disk."""

    path: pathlib.Path
    header: Mapping[str, Any]
    cubin: bytes

    @property
    def key(self) -> str:
        return self.header["key"]

    def launch_metadata(self) -> abi.LaunchMetadata:
        return abi.LaunchMetadata(cubin=self.cubin, **self.header["launch"])


def encode_entry(header: Mapping[str, Any], cubin: bytes) -> bytes:
    """The bytes of an entry file: the fixed fields, the sha256 of the rest, header, cubin.
    TypeError naming the argument when ``header`` is not a mapping or ``cubin`` not bytes."""
    _arguments.instance("encode_entry", "header", header, Mapping, "a mapping")
    _arguments.instance("encode_entry", "cubin", cubin, (bytes, bytearray), "bytes")
    header_bytes = canonical(dict(header))
    fixed = _FIXED.pack(_MAGIC, FORMAT_VERSION, len(header_bytes), len(cubin))
    digest = hashlib.sha256(fixed + header_bytes + cubin).digest()
    return fixed + digest + header_bytes + cubin


def _check_header(header: Any) -> None:
    if not isinstance(header, dict):
        raise CorruptEntry("the header is not an object")
    for field, kind in (
        ("format", int),
        ("key", str),
        ("kernel", str),
        ("launch", dict),
        ("target", dict),
        ("toolchain", dict),
        ("triton_metadata", dict),
    ):
        if not isinstance(header.get(field), kind):
            raise CorruptEntry(f"the header has no valid {field!r}")
    if header["format"] != FORMAT_VERSION:
        raise CorruptEntry(f"format {header['format']}, expected {FORMAT_VERSION}")
    key = header["key"]
    if not is_sha256_hex(key):
        raise CorruptEntry("the header's key is not a sha256")
    launch = header["launch"]
    if set(launch) != set(LAUNCH_FIELDS):
        raise CorruptEntry("the launch metadata has other fields than this version stores")
    for field, expected in LAUNCH_FIELDS.items():
        value = launch[field]
        if (
            type(value) is not expected
            or (expected is int and not _in_launch_range(field, value))
            or (field == "tensordesc_meta" and not _valid_tensordesc_meta(value))
        ):
            raise CorruptEntry(f"launch field {field!r} is {_short(value)}")
    name = launch["name"]
    if not (0 < len(name) <= 1024 and name.isascii() and name.isprintable() and " " not in name):
        raise CorruptEntry(f"the kernel symbol {_short(name)} is not a symbol name")
    target = header["target"]
    if not (
        isinstance(target.get("backend"), str)
        and type(target.get("arch")) is int
        and type(target.get("warp_size")) is int
        and 0 < target["arch"] < 10000
        and 0 < target["warp_size"] <= 1024
    ):
        raise CorruptEntry("the header has no valid target")
    # Field names of the KernelMetadata namedtuple rebuilt from it (collections.namedtuple's
    # rules: identifiers, not keywords, not starting with an underscore).
    if not all(
        k.isidentifier() and not keyword.iskeyword(k) and not k.startswith("_")
        for k in header["triton_metadata"]
    ):
        raise CorruptEntry("Triton's metadata has a field that is not a name")


# The launch integers' ranges, as the native registration and the driver take them: block_x is
# 32 * num_warps threads (at most 1024, the CUDA limit per block), num_ctas a cluster size (at
# most 16), sizes 32-bit, alignments powers of two. Out-of-range values never reach C++.
_LAUNCH_RANGES: dict[str, tuple[int, int]] = {
    "block_x": (1, 1024),
    "shared_mem": (0, 2**32 - 1),
    "num_ctas": (1, 16),
    "global_scratch_size": (0, 2**32),
    "profile_scratch_size": (0, 2**32),
    "global_scratch_align": (1, 1 << 20),
    "profile_scratch_align": (1, 1 << 20),
}


def _in_launch_range(field: str, value: Any) -> bool:
    low, high = _LAUNCH_RANGES[field]
    if not low <= value <= high:
        return False
    return not field.endswith("_align") or value & (value - 1) == 0


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode_entry(data: bytes, path: pathlib.Path = pathlib.Path("<bytes>")) -> Entry:
    """Parse and verify the bytes of an entry file.

    Raises
    ------
    TypeError
        ``data`` is not bytes, bytearray or memoryview, or ``path`` not a str or os.PathLike.
    CorruptEntry
        When the magic, format version, lengths (a truncated or extended file), checksum
        (sha256 over the whole file) or header schema do not match.
    """
    if type(data) is not bytes or not isinstance(path, pathlib.Path):  # the usual kinds
        _arguments.instance(
            "decode_entry", "data", data, (bytes, bytearray, memoryview), "a bytes-like object"
        )
        path = _arguments.path("decode_entry", "path", path)
        data = bytes(data)
    if len(data) < _PREFIX_SIZE:
        raise CorruptEntry(f"{len(data)} bytes, shorter than the fixed header")
    magic, version, header_len, cubin_len = _FIXED.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptEntry("not a fastkernel cache entry (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format {version}, expected {FORMAT_VERSION}")
    if header_len > _MAX_HEADER or len(data) != _PREFIX_SIZE + header_len + cubin_len:
        raise CorruptEntry(
            f"{len(data)} bytes, expected {_PREFIX_SIZE + header_len + cubin_len} "
            f"(truncated or extended)"
        )
    digest = data[_FIXED.size : _PREFIX_SIZE]
    body = memoryview(data)[_PREFIX_SIZE:]
    hasher = hashlib.sha256(data[: _FIXED.size])
    hasher.update(body)
    if hasher.digest() != digest:
        raise CorruptEntry("checksum mismatch")
    if cubin_len > _MAX_CUBIN:
        raise CorruptEntry(f"a cubin of {cubin_len} bytes, over the limit of {_MAX_CUBIN}")
    try:
        header = json.loads(bytes(body[:header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorruptEntry(f"unreadable header ({type(exc).__name__})") from exc
    _check_header(header)
    return Entry(path, types.MappingProxyType(header), bytes(body[header_len:]))


def read_entry(path: pathlib.Path, trusted: bool = True) -> Entry:
    """Read and verify one entry file, without following a symbolic link and only if it is a
    regular file of at most the largest entry's size. ``trusted``: the file is in this user's
    cache and must be private to the user (see :mod:`fastkernel.cache.files`); an entry being
    imported need not be.

    Raises
    ------
    TypeError
        ``path`` is not a str or os.PathLike, or ``trusted`` not a bool.
    FileNotFoundError
        No such file.
    CorruptEntry
        As :func:`decode_entry`; when the file's name is not its header's key; when it is a
        link, not a regular file, too large or (``trusted``) not private.
    """
    if not isinstance(path, pathlib.Path) or type(trusted) is not bool:
        path = _arguments.path("read_entry", "path", path)
        _arguments.instance("read_entry", "trusted", trusted, bool, "a bool")
    try:
        data = _fs.read_file(path, MAX_ENTRY_FILE, trusted)[0]
    except _fs.UntrustedPath as exc:
        raise CorruptEntry(exc.strerror or str(exc)) from exc
    entry = decode_entry(data, path)
    if path.name != entry.key + ENTRY_SUFFIX:
        raise CorruptEntry(f"file name does not match the entry's key {entry.key[:16]}")
    return entry
