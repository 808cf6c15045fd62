"""The persistent kernel cache: compiled specializations on disk, so a warm process never compiles.

Each entry is one file holding a cubin and the launch metadata needed to register it with the
native table (:class:`fastkernel._triton_abi.LaunchMetadata`), named by a key that covers
everything that changes the binary (see :func:`entry_key`). On a miss the native entry asks
:func:`load_or_compile` for the launch artifact; with a warm cache that is a file read and a
checksum, and Triton's compiler is never called. The parameter plan is not stored: it comes from
``_triton_abi.specialize``, which runs Triton's binder (not its compiler) on every miss anyway.

Controls (read at each call, never at import):

``FASTKERNEL_CACHE_DIR``
    The cache directory. Default: :func:`default_cache_dir`.
``FASTKERNEL_CACHE=0``
    No disk cache: every miss compiles and nothing is read or written.
``FASTKERNEL_ALWAYS_COMPILE=1``
    Compile on every miss even when an entry exists, and still write the entry (for debugging).
``FASTKERNEL_CACHE_LOCK=0``
    No cross-process lock per entry (for file systems where ``flock`` does not work): processes
    missing the same specialization at once may each compile it.

The file format, the key's ingredients and the integrity rules are described in docs/cache.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import keyword
import logging
import os
import pathlib
import shutil
import struct
import sys
import sysconfig
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

import triton

from . import _cache_files as _fs
from . import _env
from . import _triton_abi as abi

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
_MAX_ENTRY_FILE = _PREFIX_SIZE + _MAX_HEADER + _MAX_CUBIN
_MAX_INDEX_RECORD = 1 << 20
# An import reads an export (flat) or a cache directory (entries/<xx>/): a few levels at most.
_IMPORT_MAX_DEPTH = 4
_IMPORT_MAX_FILES = 1_000_000

#: The fields of ``abi.LaunchMetadata`` stored in an entry's header (all but the cubin), with the
#: JSON type each must have.
_LAUNCH_FIELDS: dict[str, type] = {
    "name": str,
    "block_x": int,
    "shared_mem": int,
    "num_ctas": int,
    "cooperative_grid": bool,
    "pdl": bool,
    "global_scratch_size": int,
    "global_scratch_align": int,
    "profile_scratch_size": int,
    "profile_scratch_align": int,
    "tensordesc_meta": list,
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


# -- settings -------------------------------------------------------------------------------


def default_cache_dir() -> pathlib.Path:
    """The cache directory used when ``FASTKERNEL_CACHE_DIR`` is not set.

    Follows each platform's convention for per-user caches (the same choices as the
    ``platformdirs`` package's ``user_cache_dir``): ``$XDG_CACHE_HOME/fastkernel`` (when
    ``XDG_CACHE_HOME`` is an absolute path, per the XDG Base Directory specification), else
    ``~/.cache/fastkernel`` on Linux and other Unix systems; ``~/Library/Caches/fastkernel`` on
    macOS; ``%LOCALAPPDATA%\\fastkernel\\Cache`` on Windows.

    Returns
    -------
    pathlib.Path
        The directory (not created here).
    """
    home = pathlib.Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return pathlib.Path(base) / "fastkernel" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "fastkernel"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"
    return base / "fastkernel"


def cache_dir() -> pathlib.Path:
    """The cache directory in effect now: ``FASTKERNEL_CACHE_DIR`` if set, else
    :func:`default_cache_dir`. Read from the environment at each call."""
    configured = os.environ.get("FASTKERNEL_CACHE_DIR", "")
    return pathlib.Path(configured).expanduser() if configured else default_cache_dir()


def enabled() -> bool:
    """False when ``FASTKERNEL_CACHE=0`` (or ``false``, ``off``, ``no``) turns the disk cache
    off."""
    return _env.flag("FASTKERNEL_CACHE", True)


def always_compile() -> bool:
    """True when ``FASTKERNEL_ALWAYS_COMPILE=1``: compile on every miss, still write the entry."""
    return _env.flag("FASTKERNEL_ALWAYS_COMPILE")


def _entries_dir(root: pathlib.Path) -> pathlib.Path:
    return root / "entries"


def entry_path(root: pathlib.Path, key: str) -> pathlib.Path:
    """Where the entry for ``key`` lives under cache directory ``root``
    (``entries/<first two hex digits>/<key>.fkc``)."""
    return _entries_dir(root) / key[:2] / f"{key}{ENTRY_SUFFIX}"


_logged: set = set()


def _log_once(level: int, tag: tuple[Any, ...], msg: str, *args: Any) -> None:
    if tag not in _logged:
        _logged.add(tag)
        log.log(level, msg, *args)


def _usable_root() -> pathlib.Path | None:
    """The cache directory in effect, created private (0700) if missing; None when the cache is
    off, or when the directory is not trusted (another user's, or writable by group or others:
    whoever can write it could make this process launch their code), then warned once."""
    if not enabled():
        return None
    root = cache_dir()
    problem = _fs.usable_root(root)
    if problem is not None:
        hint = (
            "set FASTKERNEL_CACHE_DIR to a directory you can write"
            if problem.startswith("it cannot") or problem.startswith("it is not a")
            else f"make it private to you (chmod 700 {root}) or set FASTKERNEL_CACHE_DIR"
        )
        _log_once(
            logging.WARNING,
            ("untrusted-root", str(root), problem),
            "fastkernel: cannot use the kernel cache %s: %s; kernels still run, compiled "
            "in each process (%s)",
            root,
            problem,
            hint,
        )
        return None
    return root


def _warn_untrusted(path: pathlib.Path, exc: OSError) -> None:
    _log_once(
        logging.WARNING,
        ("untrusted", str(path)),
        "fastkernel: not using %s: %s; compiling instead",
        path,
        exc.strerror or exc,
    )


# -- the key --------------------------------------------------------------------------------


class Uncacheable(Exception):
    """A specialization whose binary identity cannot be written down stably (so it is compiled
    and launched, but not stored on disk)."""


def _render(value: Any) -> Any:
    """A JSON-able rendering of a constexpr, attribute or global value that is equal across
    processes and machines exactly when the value compiles to the same code.

    Types are tagged (``1``, ``1.0`` and ``True`` differ); floats are exact (``float.hex``);
    dtypes by their fields; jit functions by Triton's ``cache_key`` (a hash of their source and
    of the jit functions and constexpr globals they use). Anything else raises Uncacheable.
    """
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_render(v) for v in value]]
    if isinstance(value, triton.language.constexpr):
        return ["constexpr", _render(value.value)]
    if isinstance(value, triton.language.dtype):
        fields = sorted(vars(value).items())
        return ["dtype", type(value).__qualname__, [[k, _render(v)] for k, v in fields]]
    if isinstance(value, abi.IDENTITY_CONSTEXPR_TYPES):  # jit functions (JITCallable)
        return ["jit", value.cache_key, bool(getattr(value, "noinline", False))]
    raise Uncacheable(
        f"a value of type {type(value).__module__}.{type(value).__qualname__} "
        f"has no stable rendering for the cache key"
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _triton_key_sources() -> list[str]:
    """The files Triton's ``triton_key()`` hashes (triton/runtime/cache.py: the frontend, the
    compiler and backend packages, libtriton, the language package), as a superset: every .py
    file under those packages."""
    root = os.path.dirname(os.path.abspath(triton.__file__))
    paths = [os.path.join(root, "runtime", "cache.py")]
    for sub in ("compiler", "backends", "language"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    paths.append(os.path.join(root, "_C", f"libtriton.{ext}"))
    return paths


@functools.cache
def _stat_part(path: str) -> str:
    """One file's identity for a stat signature: path, size, mtime, inode and device."""
    try:
        st = os.stat(path)
        return f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"
    except OSError:
        return f"{path}\0missing"


def _triton_stat_signature() -> str:
    """A hash of the installed Triton's version and the path, size, mtime, inode and device of
    every file ``triton_key()`` reads. Taken once per process: the Triton this process runs is
    the one it imported."""
    parts = [triton.__version__] + [_stat_part(path) for path in _triton_key_sources()]
    return _sha256("\n".join(parts))


def _compute_triton_key_digest() -> str:
    from triton.runtime.cache import triton_key

    return _sha256(triton_key())


_digests: dict[tuple[str, str], str] = {}
_memos_written: set = set()


def _memoized_digest(kind: str, signature: str, compute, memo_dir: str | None) -> str:
    """``compute()`` (a sha256 hex digest), memoized in the process and on disk under
    ``memo_dir`` as ``<kind>-<signature>.txt``, where ``signature`` hashes the stats of every
    input (the way ccache's direct mode trusts file stats): a changed input changes a stat and
    the digest is computed again. The memo is local; entries carry the digest itself."""
    digest = _digests.get((kind, signature))
    memo = pathlib.Path(memo_dir) / f"{kind}-{signature[:40]}.txt" if memo_dir else None
    if digest is None and memo is not None:
        try:
            _fs.check_dirs(memo.parent.parent, memo.parent.name)
            text = _fs.read_file(memo, 128)[0].decode("ascii").strip()
            if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
                digest = text
        except (OSError, UnicodeDecodeError):
            pass
    if digest is None:
        digest = compute()
    _digests[(kind, signature)] = digest
    if memo is not None and (memo_dir, kind, signature) not in _memos_written:
        _memos_written.add((memo_dir, kind, signature))
        try:
            if not memo.exists():
                _fs.ensure_dir(memo.parent.parent, memo.parent.name)
                _fs.write_file(memo, digest.encode("ascii"))
        except OSError as exc:
            _log_once(
                logging.DEBUG, ("memo", memo_dir), "fastkernel: cannot write %s: %s", memo, exc
            )
    return digest


def _triton_key_digest(memo_dir: str | None) -> str:
    """sha256 of Triton's ``triton_key()`` (its version and a hash of its compiler's sources and
    of libtriton, about 500 MB read in Triton 3.9). Hashing libtriton takes about 0.4 s, which
    would dominate a warm start, so it is memoized by :func:`_triton_stat_signature`."""
    return _memoized_digest(
        "triton", _triton_stat_signature(), _compute_triton_key_digest, memo_dir
    )


def _backend_stat_signature(target) -> str:
    """A hash of what the backend's ``hash()`` depends on for CUDA (the ptxas it runs, found as
    triton/knobs.py ``env_nvidia_tool`` finds it, and the mock version knob) by path and stats."""
    from triton import knobs

    parts = [
        _triton_stat_signature(),
        str(target.arch),
        str(target.backend),
        repr(getattr(getattr(knobs, "nvidia", None), "mock_ptx_version", None)),
    ]
    bin_dir = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for tool in ("ptxas", "ptxas-blackwell"):
        env = os.environ.get(f"TRITON_{tool.upper().replace('-', '_')}_PATH")
        parts += [_stat_part(path) for path in ([env] if env else []) + [str(bin_dir / tool)]]
    return _sha256("\n".join(parts))


def _backend_digest(target, memo_dir: str | None) -> str:
    """sha256 of the backend's ``hash()`` (for CUDA the ptxas version text and the arch: two
    ``ptxas --version`` runs, ~15 ms), memoized by :func:`_backend_stat_signature`."""
    if target.backend != "cuda":
        return _sha256(abi.backend_for(target).hash())
    return _memoized_digest(
        "backend",
        _backend_stat_signature(target),
        lambda: _sha256(abi.backend_for(target).hash()),
        memo_dir,
    )


def toolchain_fingerprint(target, memo_dir: pathlib.Path | None = None) -> dict[str, Any]:
    """What identifies the toolchain that compiles for ``target``; stored in every entry and part
    of its key.

    Parameters
    ----------
    target : triton.backends.compiler.GPUTarget
        The compile target (its backend hash depends on the arch: Triton 3.9 runs
        ``ptxas-blackwell`` for sm_90 and later, ``ptxas`` below).
    memo_dir : pathlib.Path, optional
        Where the ``triton_key`` digest is memoized (the cache directory's ``toolchain/``).

    Returns
    -------
    dict
        ``format`` (this module's FORMAT_VERSION), ``fastkernel`` (its version), ``triton`` (its
        version), ``triton_key`` (sha256 of ``triton.runtime.cache.triton_key()``), ``backend``
        (sha256 of the backend's ``hash()``: for CUDA the ptxas version text and the arch,
        triton/backends/nvidia/compiler.py ``CUDABackend.hash``).
    """
    import fastkernel

    return {
        "format": FORMAT_VERSION,
        "fastkernel": fastkernel.__version__,
        "triton": triton.__version__,
        "triton_key": _triton_key_digest(str(memo_dir) if memo_dir else None),
        "backend": _backend_digest(target, str(memo_dir) if memo_dir else None),
    }


def _target_dict(target) -> dict[str, Any]:
    return {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}


def key_document(
    jit_fn, target, spec: abi.Specialization, memo_dir: pathlib.Path | None = None
) -> dict[str, Any]:
    """Everything that decides the binary Triton compiles for one specialization, as JSON data.

    Parameters
    ----------
    jit_fn : triton.runtime.jit.JITFunction
        The kernel.
    target : triton.backends.compiler.GPUTarget
        The compile target.
    spec : fastkernel._triton_abi.Specialization
        The call's specialization (``abi.specialize``).
    memo_dir : pathlib.Path, optional
        Passed to :func:`toolchain_fingerprint`.

    Returns
    -------
    dict
        ``toolchain`` and ``target`` (see :func:`toolchain_fingerprint`); ``source``: Triton's own
        ``ASTSource.hash()`` (triton/compiler/compiler.py: the kernel's ``cache_key``, attrs,
        signature and constants), the identity Triton's on-disk cache uses; ``kernel``: the
        kernel's ``cache_key`` (triton/runtime/jit.py: the source, the ``cache_key`` of every jit
        function it calls, the values of the constexpr globals it reads, its line number);
        ``globals``: every global it and its callees read, by name and current value (Triton's
        ``cache_key`` covers only the constexpr ones, as first seen); ``signature``,
        ``constexprs``, ``attrs``: the specialization, values rendered with type tags and jit
        functions by their ``cache_key``; ``options``: the backend options' ``hash()`` (a sorted
        dict of every option, with extern libraries such as libdevice by content, not path);
        ``env``: Triton's cache-invalidating environment variables that are set
        (``get_cache_invalidating_env_vars()``, as ``triton.compile`` reads them).

    Raises
    ------
    Uncacheable
        When the kernel's source or dependencies cannot be hashed, a value has no stable
        rendering, or ``TRITON_KERNEL_OVERRIDE`` substitutes IR from files outside the key.
    """
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import ASTSource

    if knobs.compilation.override:
        raise Uncacheable("TRITON_KERNEL_OVERRIDE substitutes IR from files outside the key")
    try:
        kernel_key = jit_fn.cache_key  # also fills jit_fn.used_global_vals
        source_key = ASTSource(jit_fn, spec.signature, spec.constexprs, spec.attrs).hash()
    except Exception as exc:  # Triton's DependenciesFinder raises RuntimeError, parsing OSError...
        raise Uncacheable(f"its source cannot be hashed ({type(exc).__name__}: {exc})") from exc
    # The value compiled in is the one in the globals dict now (Triton's code generator reads
    # it at compile time); used_global_vals holds a copy taken when cache_key was first computed.
    missing = object()
    globals_used = []
    for (name, _), (first_value, var_dict) in jit_fn.used_global_vals.items():
        value = var_dict.get(name, missing)
        globals_used.append([name, _render(first_value if value is missing else value)])
    globals_used.sort()
    env_vars = get_cache_invalidating_env_vars()
    return {
        "format": FORMAT_VERSION,
        "toolchain": toolchain_fingerprint(target, memo_dir),
        "target": _target_dict(target),
        "source": source_key,
        "kernel": kernel_key,
        "globals": globals_used,
        "signature": [[str(name), str(ty)] for name, ty in spec.signature.items()],
        "constexprs": sorted([list(path), _render(v)] for path, v in spec.constexprs.items()),
        "attrs": sorted([list(path), _render(v)] for path, v in spec.attrs.items()),
        "options": spec.options.hash(),
        "env": sorted([str(k), str(v)] for k, v in env_vars.items()),
    }


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entry_key(
    jit_fn, target, spec: abi.Specialization, memo_dir: pathlib.Path | None = None
) -> str:
    """The entry key: the sha256 (hex) of :func:`key_document` serialized canonically (JSON,
    sorted keys, no whitespace). Raises Uncacheable as :func:`key_document` does."""
    return hashlib.sha256(_canonical(key_document(jit_fn, target, spec, memo_dir))).hexdigest()


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


@dataclasses.dataclass(frozen=True, eq=False)
class CachedKernel:
    """What a launch returns for a specialization registered from the disk cache, in place of
    Triton's ``CompiledKernel`` (which a warm process never builds). Read-only.

    It has the attributes of a ``CompiledKernel`` that describe the binary, with the same
    meaning, but cannot launch through Triton (no ``run``, ``function``, ``packed_metadata``).

    Attributes
    ----------
    name : str
        The kernel's symbol name in the cubin (``CompiledKernel.name``).
    metadata : namedtuple
        Triton's compiled metadata as ``CompiledKernel.metadata`` has it (a ``KernelMetadata``
        namedtuple of the fields Triton produced when it compiled: ``num_warps``, ``shared``
        (bytes), ``hash``, ``target`` as a ``GPUTarget``, ...), so launch hooks and
        ``launch_metadata`` callbacks see the same object either way.
    asm : mapping
        ``{"cubin": bytes}`` (``CompiledKernel.asm`` also has the IRs, which are not stored).
    src : triton.compiler.ASTSource
        The compile source of this specialization (kernel, signature, constants, attrs), as
        ``CompiledKernel.src``.
    hash : str
        Triton's own cache key of the binary (``CompiledKernel.hash``).
    key : str
        fastkernel's entry key (64 hex digits).
    path : str
        The entry file it was read from.
    kernel : str
        ``module:qualname`` of the Python kernel that produced it.
    launch : mapping
        The launch metadata it was registered with: ``block_x`` (threads), ``shared_mem``
        (bytes), ``num_ctas``, ``cooperative_grid``, ``pdl``, scratch sizes and alignments
        (bytes).
    """

    name: str
    metadata: Any
    asm: Mapping[str, bytes]
    src: Any
    hash: str
    key: str
    path: str
    kernel: str
    launch: Mapping[str, Any]

    @property
    def target(self):
        """The compile target (``triton.backends.compiler.GPUTarget``)."""
        return self.metadata.target

    @classmethod
    def from_entry(cls, entry: Entry, src: Any = None) -> CachedKernel:
        import collections

        from triton.backends.compiler import GPUTarget

        h = entry.header
        md = dict(h["triton_metadata"])
        t = h["target"]  # the same target, checked by _check_header
        # As CompiledKernel.__init__ (triton/compiler/compiler.py) rebuilds it from its JSON.
        md["target"] = GPUTarget(t["backend"], t["arch"], t["warp_size"])
        kernel_metadata = collections.namedtuple("KernelMetadata", sorted(md))(**md)
        return cls(
            name=h["launch"]["name"],
            metadata=kernel_metadata,
            asm=types.MappingProxyType({"cubin": entry.cubin}),
            src=src,
            hash=str(md.get("hash", "")),
            key=h["key"],
            path=str(entry.path),
            kernel=h["kernel"],
            launch=types.MappingProxyType(dict(h["launch"])),
        )


def encode_entry(header: Mapping[str, Any], cubin: bytes) -> bytes:
    """The bytes of an entry file: the fixed fields, the sha256 of the rest, header, cubin."""
    header_bytes = _canonical(dict(header))
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
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise CorruptEntry("the header's key is not a sha256")
    launch = header["launch"]
    if set(launch) != set(_LAUNCH_FIELDS):
        raise CorruptEntry("the launch metadata has other fields than this version stores")
    for field, expected in _LAUNCH_FIELDS.items():
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
    CorruptEntry
        When the magic, format version, lengths (a truncated or extended file), checksum
        (sha256 over the whole file) or header schema do not match.
    """
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
    cache and must be private to the user (see :mod:`fastkernel._cache_files`); an entry being
    imported need not be.

    Raises
    ------
    FileNotFoundError
        No such file.
    CorruptEntry
        As :func:`decode_entry`; when the file's name is not its header's key; when it is a
        link, not a regular file, too large or (``trusted``) not private.
    """
    try:
        data = _fs.read_file(pathlib.Path(path), _MAX_ENTRY_FILE, trusted)[0]
    except _fs.UntrustedPath as exc:
        raise CorruptEntry(exc.strerror or str(exc)) from exc
    entry = decode_entry(data, pathlib.Path(path))
    if pathlib.Path(path).name != entry.key + ENTRY_SUFFIX:
        raise CorruptEntry(f"file name does not match the entry's key {entry.key[:16]}")
    return entry


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one (see
    :func:`fastkernel._cache_files.write_file`), creating the directory if needed. For files
    outside the cache (bundles, exports): mode 0666 less the umask, like any file the user
    creates. Files inside the cache are written private to the user."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _fs.write_file(path, data, 0o666)


def _store_entry(root: pathlib.Path, key: str, data: bytes) -> None:
    """Write entry ``key`` into cache directory ``root`` (private directories and file)."""
    directory = _fs.ensure_dir(root, "entries", key[:2])
    _fs.write_file(directory / f"{key}{ENTRY_SUFFIX}", data)


def _remove_if_unchanged(path: pathlib.Path, seen: os.stat_result | None) -> None:
    """Remove a bad entry unless another process has replaced it since it was read."""
    try:
        now = os.stat(path)
        if seen is None or (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns) == (
            seen.st_ino,
            seen.st_dev,
            seen.st_size,
            seen.st_mtime_ns,
        ):
            os.unlink(path)
    except OSError:
        pass


def _load(path: pathlib.Path, key: str, target, toolchain: Mapping[str, Any]) -> Entry | None:
    """The verified entry at ``path``, or None (missing; untrusted, then warned once; or bad,
    then logged and removed)."""
    try:
        _fs.check_dirs(path.parent.parent.parent, path.parent.parent.name, path.parent.name)
        data, seen = _fs.read_file(path, _MAX_ENTRY_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except _fs.UntrustedPath as exc:
        _warn_untrusted(path, exc)
        return None
    except OSError as exc:
        _log_once(
            logging.WARNING,
            ("read", str(path.parent)),
            "fastkernel: cannot read cache entry %s (%s); compiling",
            path,
            exc,
        )
        return None
    try:
        entry = decode_entry(data, path)
        if entry.key != key:
            raise CorruptEntry(f"a foreign entry (key {entry.key[:16]}...)")
        if dict(entry.header["target"]) != _target_dict(target):
            raise CorruptEntry(f"an entry for target {dict(entry.header['target'])}")
        if dict(entry.header["toolchain"]) != dict(toolchain):
            raise CorruptEntry(
                "an entry built by another toolchain "
                f"({_describe_toolchain(entry.header['toolchain'])})"
            )
    except CorruptEntry as exc:
        log.warning("fastkernel: removed cache entry %s: %s; compiling again", path, exc)
        _remove_if_unchanged(path, seen)
        return None
    return entry


def _describe_toolchain(toolchain: Mapping[str, Any]) -> str:
    return (
        f"fastkernel {toolchain.get('fastkernel')}, triton {toolchain.get('triton')}, "
        f"triton_key {str(toolchain.get('triton_key'))[:12]}, "
        f"backend {str(toolchain.get('backend'))[:12]}, format {toolchain.get('format')}"
    )


def _kernel_name(jit_fn) -> str:
    return f"{getattr(jit_fn, 'module', '?')}:{getattr(jit_fn.fn, '__qualname__', jit_fn.__name__)}"


def _triton_metadata(compiled) -> dict[str, Any]:
    """CompiledKernel.metadata as Triton writes it to its own cache (json.dumps(default=vars))."""
    md = compiled.metadata
    md = md._asdict() if hasattr(md, "_asdict") else dict(vars(md))
    return json.loads(json.dumps(md, default=vars))


def _header(
    key: str, jit_fn, target, doc: Mapping[str, Any], meta: abi.LaunchMetadata, compiled
) -> dict[str, Any]:
    launch = {field: getattr(meta, field) for field in _LAUNCH_FIELDS}
    for field, kind in _LAUNCH_FIELDS.items():
        launch[field] = kind(launch[field])
    return {
        "format": FORMAT_VERSION,
        "key": key,
        "kernel": _kernel_name(jit_fn),
        "launch": launch,
        "target": _target_dict(target),
        "toolchain": doc["toolchain"],
        "triton_metadata": _triton_metadata(compiled),
        # For `cache list` only; the key already covers them.
        "signature": doc["signature"],
        "created": time.time(),
    }


# -- the miss path --------------------------------------------------------------------------


def _compile(jit_fn, target, spec):
    compiled = abi.compile_specialization(jit_fn, target, spec)
    return abi.launch_metadata(compiled), compiled


def load_or_compile(jit_fn, target, spec: abi.Specialization):
    """The launch artifact of a specialization: from the disk cache, or compiled and stored.

    Parameters
    ----------
    jit_fn : triton.runtime.jit.JITFunction
        The kernel.
    target : triton.backends.compiler.GPUTarget
        The compile target of the device.
    spec : fastkernel._triton_abi.Specialization
        The call's specialization, from ``abi.specialize``.

    Returns
    -------
    (fastkernel._triton_abi.LaunchMetadata, handle)
        ``handle`` is a :class:`CachedKernel` for an entry read from disk, Triton's
        ``CompiledKernel`` when compiled here.

    Raises
    ------
    fastkernel._triton_abi.UnsupportedByNativePath
        For a binary the native launcher cannot call (then nothing is written).
    Exception
        Whatever Triton's compiler raises. Cache problems are never raised: an unreadable or bad
        entry is logged, removed and compiled again; a failed write is logged.
    """
    root = _usable_root()
    if root is None:
        return _compile(jit_fn, target, spec)
    memo_dir = root / "toolchain"
    try:
        doc = key_document(jit_fn, target, spec, memo_dir)
    except Uncacheable as exc:
        _log_once(
            logging.WARNING,
            ("uncacheable", _kernel_name(jit_fn), str(exc)),
            "fastkernel: %s is not cached on disk: %s",
            _kernel_name(jit_fn),
            exc,
        )
        return _compile(jit_fn, target, spec)
    key = hashlib.sha256(_canonical(doc)).hexdigest()
    if always_compile():
        return _compile_and_store(jit_fn, target, spec, root, key, doc)
    artifact = _read_artifact(root, key, target, doc, jit_fn, spec)
    if artifact is not None:
        return artifact
    # One process compiles a specialization at a time; the others wait, then read its entry.
    with _entry_lock(root, key, jit_fn):
        artifact = _read_artifact(root, key, target, doc, jit_fn, spec)
        if artifact is not None:
            return artifact
        return _compile_and_store(jit_fn, target, spec, root, key, doc)


def _read_artifact(
    root: pathlib.Path, key: str, target, doc: Mapping[str, Any], jit_fn, spec: abi.Specialization
):
    path = entry_path(root, key)
    entry = _load(path, key, target, doc["toolchain"])
    if entry is None:
        return None
    artifact = _artifact(entry, jit_fn, spec)
    if artifact is not None:
        log.debug("fastkernel: %s loaded from %s", _kernel_name(jit_fn), path)
    return artifact


#: How long a process waits for another one compiling the same specialization (seconds) before
#: it compiles the specialization itself. A holder that dies releases its lock at once.
_LOCK_TIMEOUT = 600.0


@contextlib.contextmanager
def _entry_lock(root: pathlib.Path, key: str, jit_fn) -> Iterator[None]:
    """Hold the cross-process lock of entry ``key`` (a ``filelock`` lock file beside it) for the
    block; a no-op when ``FASTKERNEL_CACHE_LOCK=0`` (file systems without working locks) or when
    the lock cannot be taken (then logged once), so that a launch never fails for it."""
    if not _env.flag("FASTKERNEL_CACHE_LOCK", True):
        yield
        return
    from filelock import FileLock, Timeout

    try:
        lock = FileLock(
            str(_fs.ensure_dir(root, "entries", key[:2]) / f".{key}.lock"), timeout=_LOCK_TIMEOUT
        )
        lock.acquire()
    except Timeout:
        _log_once(
            logging.WARNING,
            ("lock-timeout", key),
            "fastkernel: waited %.0f s for another process compiling %s; compiling here",
            _LOCK_TIMEOUT,
            _kernel_name(jit_fn),
        )
        yield
        return
    except OSError as exc:
        _log_once(
            logging.WARNING,
            ("lock", str(root)),
            "fastkernel: cannot lock entries under "
            "%s (%s); processes may compile the same kernel at once",
            root,
            exc,
        )
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _artifact(entry: Entry, jit_fn, spec: abi.Specialization):
    """``(LaunchMetadata, CachedKernel)`` of a verified entry, or None when they cannot be made
    from it (a header that passed the schema but not Python's rules for what it becomes): the
    entry is then corrupt, removed and logged."""
    from triton.compiler import ASTSource

    try:
        src = ASTSource(jit_fn, spec.signature, spec.constexprs, spec.attrs)
        return entry.launch_metadata(), CachedKernel.from_entry(entry, src)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the entry is not usable
        log.warning("fastkernel: removed cache entry %s: %r; compiling again", entry.path, exc)
        _remove_if_unchanged(entry.path, None)
        return None


def _compile_and_store(
    jit_fn, target, spec: abi.Specialization, root: pathlib.Path, key: str, doc: Mapping[str, Any]
):
    meta, compiled = _compile(jit_fn, target, spec)
    try:
        header = _header(key, jit_fn, target, doc, meta, compiled)
        _store_entry(root, key, encode_entry(header, meta.cubin))
    except Exception as exc:  # a failed store must not fail a launch that compiled
        _log_once(
            logging.WARNING,
            ("write", str(root), type(exc).__name__),
            "fastkernel: cannot write the kernel cache under %s (%s: %s); kernels still "
            "run, compiled in each process",
            root,
            type(exc).__name__,
            exc,
        )
    return meta, compiled


def compile_and_store(jit_fn, target, spec: abi.Specialization):
    """Compile a specialization with Triton and write its entry (replacing any), as
    :func:`load_or_compile` does on a miss; for a caller that found the cached entry unusable.
    Returns and raises as :func:`load_or_compile`."""
    root = _usable_root()
    if root is None:
        return _compile(jit_fn, target, spec)
    try:
        doc = key_document(jit_fn, target, spec, root / "toolchain")
    except Uncacheable:
        return _compile(jit_fn, target, spec)
    key = hashlib.sha256(_canonical(doc)).hexdigest()
    return _compile_and_store(jit_fn, target, spec, root, key, doc)


def discard(handle: CachedKernel, reason: str) -> None:
    """Remove the entry ``handle`` was read from, which verified but could not become a native
    registration (``reason``); logged once per entry file."""
    _log_once(
        logging.WARNING,
        ("discard", handle.path),
        "fastkernel: removed cache entry %s (%s): %s; compiling again",
        handle.path,
        handle.kernel,
        reason,
    )
    _remove_if_unchanged(pathlib.Path(handle.path), None)


def is_cached(jit_fn, target, spec: abi.Specialization) -> bool:
    """Whether the on-disk cache has an entry file for this specialization (not verified;
    :func:`load_or_compile` verifies it). False when the cache is off or the kernel uncacheable."""
    if not enabled():
        return False
    root = cache_dir()
    try:
        key = entry_key(jit_fn, target, spec, root / "toolchain")
    except Uncacheable:
        return False
    return entry_path(root, key).is_file()


# -- the warm index: a native key to its specialization, so a warm process skips the binder ----
#
# Triton's binder costs a warm process most of its first call (Triton 3.9 imports
# triton.experimental.gluon on its first use: ~70 ms here). The native key already decides the
# specialization (same key iff same specialization, given the kernel, its globals, the
# binary-changing knobs, the target, the toolchain and the environment), so the index maps it,
# with those, to the Specialization the binder produced, stored as JSON. A decoded
# specialization is trusted only when the record's checksum holds, the record names this very
# native key, its recomputed entry key is the one stored beside it and that entry loads and
# verifies; and the caller checks it against the call's pointer alignments and int classes.
# Anything else falls back to the binder.

INDEX_FORMAT = 2  # 2: records carry their native key and a checksum


class _NotEncodable(Exception):
    pass


def _enc(value: Any) -> Any:
    """A reversible JSON encoding of the values a Specialization holds."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"i": str(value)}
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, tuple):
        return {"t": [_enc(v) for v in value]}
    if isinstance(value, list):
        return [_enc(v) for v in value]
    if isinstance(value, triton.language.dtype) and type(value) is triton.language.dtype:
        return {"dtype": value.name}
    raise _NotEncodable(type(value).__name__)


def _dec(value: Any) -> Any:
    if isinstance(value, list):
        return [_dec(v) for v in value]
    if isinstance(value, dict):
        ((tag, inner),) = value.items()
        if tag == "i":
            return int(inner)
        if tag == "f":
            return float.fromhex(inner)
        if tag == "t":
            return tuple(_dec(v) for v in inner)
        if tag == "dtype":
            return triton.language.dtype(inner)
        raise ValueError(f"unknown tag {tag!r}")
    return value


def _encode_spec(spec: abi.Specialization) -> dict[str, Any]:
    return {
        "signature": [[k, _enc(v)] for k, v in spec.signature.items()],
        "constexprs": [[_enc(k), _enc(v)] for k, v in spec.constexprs.items()],
        "attrs": [[_enc(k), _enc(v)] for k, v in spec.attrs.items()],
        "options": [[k, _enc(v)] for k, v in spec.options.__dict__.items()],
    }


def _decode_spec(doc: Any, target) -> abi.Specialization:
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(field), list)
        and all(isinstance(p, list) and len(p) == 2 for p in doc[field])
        for field in ("signature", "constexprs", "attrs", "options")
    ):
        raise ValueError("the specialization is not four lists of pairs")
    if not all(isinstance(k, str) for k, _ in doc["signature"] + doc["options"]):
        raise ValueError("a signature or option name is not a string")
    defaults = abi.backend_for(target).parse_options({})
    options = dataclasses.replace(defaults, **{k: _dec(v) for k, v in doc["options"]})
    signature = {k: _dec(v) for k, v in doc["signature"]}
    # The plan is derived, never stored: the entry key check covers the signature it comes from.
    return abi.Specialization(
        signature=signature,
        constexprs={_dec(k): _dec(v) for k, v in doc["constexprs"]},
        attrs={_dec(k): _dec(v) for k, v in doc["attrs"]},
        options=options,
        plan=abi.launch_plan(signature),
    )


def decode_index_record(
    data: bytes, index: str, native_key: str, target
) -> tuple[dict[str, Any], abi.Specialization]:
    """``(record, spec)`` from the bytes of a warm index record, read as untrusted input: it
    must be a JSON object whose checksum holds, that names ``index`` (its file's stem) and
    ``native_key`` (hex, without the per-process words), names an entry key, and whose
    specialization decodes for ``target``.

    Raises
    ------
    ValueError
        For anything else: not JSON, nested past the recursion limit, a missing or mistyped
        field, a checksum that does not hold, another key's record, an unknown option or tag.
    """
    try:
        record = json.loads(data)
        if not isinstance(record, dict) or record.get("checksum") != _index_checksum(record):
            raise ValueError("the record's checksum does not hold")
        if record.get("index") != index or record.get("native_key") != native_key:
            raise ValueError("a record for another native key")  # copied, renamed or re-keyed
        entry = record.get("entry")
        if not (
            isinstance(entry, str)
            and len(entry) == 64
            and all(c in "0123456789abcdef" for c in entry)
        ):
            raise ValueError("the record names no entry key")
        spec = _decode_spec(record.get("spec"), target)
    except ValueError:
        raise
    except (
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        AssertionError,
        OverflowError,
        RecursionError,
        UnicodeDecodeError,
        abi.UnsupportedByNativePath,
    ) as exc:
        raise ValueError(f"a malformed record ({type(exc).__name__}: {exc})") from None
    return record, spec


def _index_checksum(record: Mapping[str, Any]) -> str:
    """sha256 of a warm index record's canonical JSON without its ``checksum`` field."""
    return hashlib.sha256(
        _canonical({k: v for k, v in record.items() if k != "checksum"})
    ).hexdigest()


def _index_path(
    jit_fn, target, native_key: bytes, root: pathlib.Path, tuned: Mapping[str, Any] | None = None
) -> pathlib.Path:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    # Globals, options and the rest of the binary's identity are checked through the entry key
    # the decoded specialization must reproduce (warm_lookup).
    doc = {
        "format": INDEX_FORMAT,
        "kernel": jit_fn.cache_key,
        # The device and knob-state words (the last two) are per process; the knob values are not.
        "native_key": native_key[:-16].hex(),
        "knobs": list(abi.binary_knobs()),
        "target": _target_dict(target),
        "toolchain": toolchain_fingerprint(target, root / "toolchain"),
        "env": sorted([str(k), str(v)] for k, v in get_cache_invalidating_env_vars().items()),
        # A tuned kernel's key leaves its config out: the config's values are part of the doc.
        "tuned": sorted([str(k), _render(v)] for k, v in (tuned or {}).items()),
    }
    digest = hashlib.sha256(_canonical(doc)).hexdigest()
    return root / "index" / digest[:2] / f"{digest}.json"


def warm_lookup(jit_fn, target, native_key: bytes, tuned: Mapping[str, Any] | None = None):
    """``(spec, meta, handle)`` for a native key whose specialization the warm index holds and
    whose entry verifies, else None (then the caller specializes with Triton's binder). ``tuned``:
    the values a tuned config (or keyed heuristics) gave, which a tuned kernel's native key does
    not hold. Never raises for cache problems."""
    if not enabled() or always_compile():
        return None
    root = _usable_root()
    if root is None:
        return None
    try:
        path = _index_path(jit_fn, target, native_key, root, tuned)
        _fs.check_dirs(root, "index", path.parent.name)
        record, spec = decode_index_record(
            _fs.read_file(path, _MAX_INDEX_RECORD)[0], path.stem, native_key[:-16].hex(), target
        )
        doc = key_document(jit_fn, target, spec, root / "toolchain")
        key = hashlib.sha256(_canonical(doc)).hexdigest()
        if key != record["entry"]:
            raise ValueError("the specialization does not give the recorded entry")
    except FileNotFoundError:
        return None
    except _fs.UntrustedPath as exc:
        _warn_untrusted(path, exc)
        return None
    except Exception as exc:  # a damaged or stale index record: the binder decides
        log.debug("fastkernel: warm index unusable for %s: %r", _kernel_name(jit_fn), exc)
        return None
    entry = _load(entry_path(root, key), key, target, doc["toolchain"])
    if entry is None:
        return None
    artifact = _artifact(entry, jit_fn, spec)
    return None if artifact is None else (spec, *artifact)


def warm_store(
    jit_fn,
    target,
    native_key: bytes,
    spec: abi.Specialization,
    tuned: Mapping[str, Any] | None = None,
) -> None:
    """Record ``native_key -> spec`` in the warm index (after its entry was written). Skipped
    quietly when the cache is off or a value has no JSON encoding."""
    root = _usable_root()
    if root is None:
        return
    try:
        doc = key_document(jit_fn, target, spec, root / "toolchain")
        path = _index_path(jit_fn, target, native_key, root, tuned)
        record: dict[str, Any] = {
            "index": path.stem,
            "native_key": native_key[:-16].hex(),
            "entry": hashlib.sha256(_canonical(doc)).hexdigest(),
            "spec": _encode_spec(spec),
        }
        record["checksum"] = _index_checksum(record)
        if not entry_path(root, record["entry"]).is_file():
            return
        directory = _fs.ensure_dir(root, "index", path.parent.name)
        _fs.write_file(directory / path.name, json.dumps(record, sort_keys=True).encode())
    except (_NotEncodable, Uncacheable) as exc:
        log.debug("fastkernel: no warm index record for %s: %s", _kernel_name(jit_fn), exc)
    except OSError as exc:
        _log_once(
            logging.DEBUG,
            ("index-write", str(root)),
            "fastkernel: cannot write the warm index under %s: %s",
            root,
            exc,
        )


# -- managing a cache directory -------------------------------------------------------------


def iter_entry_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """Every regular ``*.fkc`` file under ``root`` (a cache directory or an export), at most
    ``_IMPORT_MAX_DEPTH`` directories down, never through a symbolic link, in sorted order.
    Raises ``_cache_files.UntrustedPath`` past ``_IMPORT_MAX_FILES`` files."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return iter(())
    return _fs.walk_files(root, ENTRY_SUFFIX, _IMPORT_MAX_DEPTH, _IMPORT_MAX_FILES)


def _temp_files(root: pathlib.Path) -> list[pathlib.Path]:
    entries = _entries_dir(root)
    return sorted(entries.rglob(".*.tmp")) if entries.is_dir() else []


def scan(root: pathlib.Path | None = None) -> tuple[list[Entry], list[tuple[pathlib.Path, str]]]:
    """Read every entry under cache directory ``root`` (default :func:`cache_dir`).

    Returns
    -------
    (entries, bad)
        The verified entries, and ``(path, reason)`` for each file that failed verification
        (left in place; a launch that needs one removes it).
    """
    root = cache_dir() if root is None else pathlib.Path(root)
    good, bad = [], []
    for path in iter_entry_files(_entries_dir(root)):
        try:
            good.append(read_entry(path))
        except (OSError, CorruptEntry) as exc:
            bad.append((path, str(exc)))
    return good, bad


def clear(root: pathlib.Path | None = None) -> tuple[int, int]:
    """Remove every entry, temporary file, toolchain memo and tuning record (``autotune/``)
    under cache directory ``root`` (default :func:`cache_dir`). Other files there are left
    alone.

    Returns
    -------
    (int, int)
        Entry files removed, and their total size in bytes.
    """
    root = cache_dir() if root is None else pathlib.Path(root)
    count = size = 0
    for path in iter_entry_files(_entries_dir(root)):
        try:
            st = path.stat()
            path.unlink()
        except OSError:
            continue
        count += 1
        size += st.st_size
    for sub in ("entries", "toolchain", "autotune", "index"):
        shutil.rmtree(root / sub, ignore_errors=True)
    _memos_written.clear()
    return count, size


def export_entries(dest: pathlib.Path, root: pathlib.Path | None = None) -> int:
    """Copy every verified entry of cache directory ``root`` into directory ``dest`` (created),
    as ``dest/<key>.fkc``. Entries carry their target and toolchain; bad files are skipped with
    a log line.

    Returns
    -------
    int
        Entries exported.
    """
    entries, bad = scan(root)
    for path, reason in bad:
        log.warning("fastkernel: not exported %s: %s", path, reason)
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        # Re-encoded from what was verified (the same bytes: headers are canonical JSON).
        atomic_write(dest / (entry.key + ENTRY_SUFFIX), encode_entry(entry.header, entry.cubin))
    return len(entries)


def import_entries(src: pathlib.Path, root: pathlib.Path | None = None) -> tuple[int, int]:
    """Install the entries found under directory ``src`` (an export or another cache directory)
    into cache directory ``root`` (default :func:`cache_dir`).

    An entry is skipped, with a log line, when it fails verification or when its toolchain
    fingerprint differs from this machine's for the entry's target (another Triton, fastkernel,
    ptxas or format): its key could never be looked up here. Entries for targets this machine
    has no device for are installed (targets are not probed here). ``src`` is read as untrusted
    input: no symbolic link is followed, only regular files of at most an entry's largest size
    are read, at most ``_IMPORT_MAX_DEPTH`` directories down; entries are written only under
    ``root``, each re-encoded from what was verified.

    Returns
    -------
    (int, int)
        Entries imported, entries skipped.

    Raises
    ------
    RuntimeError
        ``root`` cannot be used (not creatable, or not private to this user).
    fastkernel._cache_files.UntrustedPath
        ``src`` holds more than ``_IMPORT_MAX_FILES`` entry files.
    """
    root = cache_dir() if root is None else pathlib.Path(root)
    imported = skipped = 0
    local: dict[tuple[str, int, int], dict[str, Any]] = {}
    problem = _fs.usable_root(root)
    if problem is not None:
        raise RuntimeError(f"the kernel cache {root} cannot be used: {problem}")
    for path in iter_entry_files(src):
        try:
            entry = read_entry(path, trusted=False)
        except (OSError, CorruptEntry) as exc:
            log.warning("fastkernel: skipped %s: %s", path, exc)
            skipped += 1
            continue
        t = entry.header["target"]
        tkey = (t["backend"], t["arch"], t["warp_size"])
        if tkey not in local:
            try:
                from triton.backends.compiler import GPUTarget

                local[tkey] = toolchain_fingerprint(GPUTarget(*tkey), root / "toolchain")
            except Exception as exc:  # no backend for this target here
                local[tkey] = {"error": str(exc)}
        if dict(entry.header["toolchain"]) != local[tkey]:
            log.warning(
                "fastkernel: skipped %s (%s for %s): built by %s, this machine has %s",
                path.name,
                entry.header["kernel"],
                tkey,
                _describe_toolchain(entry.header["toolchain"]),
                _describe_toolchain(local[tkey]),
            )
            skipped += 1
            continue
        _store_entry(root, entry.key, encode_entry(entry.header, entry.cubin))
        imported += 1
    return imported, skipped


# -- python -m fastkernel cache ... ---------------------------------------------------------


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _state() -> str:
    if not enabled():
        return "disabled (FASTKERNEL_CACHE=0)"
    if always_compile():
        return "enabled, always compiling (FASTKERNEL_ALWAYS_COMPILE=1)"
    return "enabled"


def main(argv: list[str] | None = None) -> int:
    """``python -m fastkernel cache info|list|clear|export DIR|import DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m fastkernel cache",
        description="Inspect, clear, export and import fastkernel's on-disk kernel cache "
        "(FASTKERNEL_CACHE_DIR, default " + str(default_cache_dir()) + ").",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("info", help="where the cache is, its state, entries and size")
    sub.add_parser("list", help="one line per entry: key, kernel, target, size, age")
    sub.add_parser("clear", help="remove every entry")
    p = sub.add_parser("export", help="copy every entry into DIR (to ship to other machines)")
    p.add_argument("dir", type=pathlib.Path)
    p = sub.add_parser("import", help="install the entries in DIR that match this toolchain")
    p.add_argument("dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    root = cache_dir()

    if args.action == "info":
        entries, bad = scan(root)
        size = sum(e.path.stat().st_size for e in entries)
        print(
            f"directory  {root}"
            + (
                ""
                if os.environ.get("FASTKERNEL_CACHE_DIR")
                else "  (default; set FASTKERNEL_CACHE_DIR to move it)"
            )
        )
        print(f"state      {_state()}")
        kernels = len({e.header["kernel"] for e in entries})
        print(
            f"entries    {len(entries)} ({_human(size)}) of {kernels} "
            f"kernel{'' if kernels == 1 else 's'}"
        )
        if bad:
            print(f"bad files  {len(bad)} (removed when a launch reads them, or by clear)")
        tuned = list((root / "autotune").glob("*/*.json"))
        print(f"tunings    {len(tuned)} autotune result{'' if len(tuned) == 1 else 's'}")
        temps = _temp_files(root)
        if temps:
            print(f"temporary  {len(temps)} (writes in progress or interrupted)")
        import fastkernel

        print(
            f"toolchain  fastkernel {fastkernel.__version__}, triton {triton.__version__}, "
            f"format {FORMAT_VERSION}"
        )
        return 0
    if args.action == "list":
        entries, bad = scan(root)
        now = time.time()
        print(f"{'key':16}  {'kernel':40}  {'symbol':24}  {'target':8}  {'size':>9}  age")
        for e in sorted(entries, key=lambda e: (e.header["kernel"], e.key)):
            h = e.header
            age = max(0.0, now - float(h.get("created", now)))
            age_text = f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min"
            target = f"{h['target']['backend']}:{h['target']['arch']}"
            print(
                f"{e.key[:16]}  {h['kernel']:40}  {h['launch']['name']:24}  {target:8}  "
                f"{_human(e.path.stat().st_size):>9}  {age_text}"
            )
        for path, reason in bad:
            print(f"{'(bad)':16}  {str(path)}: {reason}")
        return 0
    if args.action == "clear":
        count, size = clear(root)
        print(f"removed {_entries(count)} ({_human(size)}) from {root}")
        return 0
    if args.action == "export":
        count = export_entries(args.dir, root)
        print(f"exported {_entries(count)} to {args.dir}")
        return 0
    try:
        imported, skipped = import_entries(args.dir, root)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    skipped_text = f", skipped {skipped}" if skipped else ""
    print(f"imported {_entries(imported)} into {root}{skipped_text}")
    return 0
