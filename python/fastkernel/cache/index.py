"""The warm index: native key -> specialization records, so that a fresh process registers a
cached kernel without running Triton's binder (docs/cache.md, "Warm index")."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from .. import _arguments
from .. import _triton_abi as abi
from . import files as _fs
from .entry import canonical, entry_file, entry_path, is_sha256_hex
from .key import (
    _NO_SPEC,
    Uncacheable,
    cache_env,
    check_compile_inputs,
    check_specialization,
    check_target,
    key_document,
    render,
    target_dict,
    toolchain_dir,
    toolchain_fingerprint,
)
from .settings import always_compile, enabled, log_once, usable_root, warn_untrusted
from .store import entry_artifact, kernel_name, load

log = logging.getLogger("fastkernel.cache")
_MAX_INDEX_RECORD = 1 << 20
_INDEX = "index"


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

INDEX_FORMAT = 3  # 2: records carry their native key and a checksum; 3: stored canonically

# A record is stored as its canonical JSON (sorted keys, no whitespace), so its first field is
# always "checksum": the sha256 of the canonical JSON of every other field is then the sha256 of
# the stored bytes after that field, behind an opening brace, and a reader checks it without
# encoding the record again.
_CHECKSUM_PREFIX = b'{"checksum":"'
_CHECKSUM_END = len(_CHECKSUM_PREFIX) + 64


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
    if type(value) is triton.language.constexpr:  # a constexpr object passed as an argument
        return {"c": _enc(value.value)}
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
        if tag == "c":
            return triton.language.constexpr(_dec(inner))
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
    # Every field as stored, built once (the entry key check covers them all).
    options = abi.options_class(target)(**{k: _dec(v) for k, v in doc["options"]})
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
    """``(record, spec)`` from the bytes of a warm index record, read as untrusted input. The
    bytes must be as :func:`encode_index_record` stores a record (canonical JSON whose leading
    checksum holds over the rest); the record must name ``index`` (its file's stem),
    ``native_key`` (hex, without the per-process words) and an entry key, and its
    specialization must decode for ``target``.

    Raises
    ------
    TypeError
        ``data`` is not bytes, ``index`` or ``native_key`` not a str, ``target`` not a
        GPUTarget.
    ValueError
        For anything else: not JSON, nested past the recursion limit, a missing or mistyped
        field, a checksum that does not hold, another key's record, an unknown option or tag.
    """
    if not (
        type(data) is bytes
        and type(index) is str
        and type(native_key) is str
        and isinstance(target, GPUTarget)
    ):
        who = "decode_index_record"
        _arguments.instance(who, "data", data, bytes, "bytes")
        _arguments.instance(who, "index", index, str, "a str")
        _arguments.instance(who, "native_key", native_key, str, "a str")
        check_target(who, target)
    try:
        if not (
            data.startswith(_CHECKSUM_PREFIX)
            and data[_CHECKSUM_END : _CHECKSUM_END + 2] == b'",'
            and hashlib.sha256(b"{" + data[_CHECKSUM_END + 2 :]).hexdigest().encode()
            == data[len(_CHECKSUM_PREFIX) : _CHECKSUM_END]
        ):
            raise ValueError("the record's checksum does not hold")
        record = json.loads(data)  # an object: the bytes begin with one
        if record.get("index") != index or record.get("native_key") != native_key:
            raise ValueError("a record for another native key")  # copied, renamed or re-keyed
        entry = record.get("entry")
        if not (isinstance(entry, str) and is_sha256_hex(entry)):
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


def encode_index_record(record: Mapping[str, Any]) -> bytes:
    """The stored bytes of a warm index record: its fields other than ``checksum`` (``index``,
    ``native_key``, ``entry``, ``spec``), with ``checksum`` set to the sha256 (hex) of their
    canonical JSON, as canonical JSON. Raises TypeError or ValueError for a value JSON cannot
    encode."""
    body = canonical({k: v for k, v in record.items() if k != "checksum"})
    checksum = hashlib.sha256(body).hexdigest().encode()
    # "checksum" sorts before every other field: the record is the checksum, then the body.
    return _CHECKSUM_PREFIX + checksum + (b'",' + body[1:] if len(body) > 2 else b'"}')


def _index_digest(
    jit_fn,
    target,
    native_key: bytes,
    toolchain: dict[str, Any],
    env: list[list[str]],
    tuned: Mapping[str, Any] | None = None,
) -> str:
    """The name of the warm index record for a call: the sha256 (hex) of what, beside the
    native key, decides its specialization. ``toolchain`` and ``env``:
    :func:`toolchain_fingerprint` and :func:`cache_env` as taken for this call."""
    # Globals, options and the rest of the binary's identity are checked through the entry key
    # the decoded specialization must reproduce (warm_lookup).
    doc = {
        "format": INDEX_FORMAT,
        "kernel": jit_fn.cache_key,
        # The device and knob-state words (the last two) are per process; the knob values are not.
        "native_key": native_key[:-16].hex(),
        "knobs": list(abi.binary_knobs(abi.key_knob_word(native_key))),
        # The kernel's own debug option (triton.jit(debug=...), or set later), which Triton
        # reads into every call's compile options and the native key does not hold.
        "debug": bool(getattr(jit_fn, "debug", None)),
        "target": target_dict(target),
        "toolchain": toolchain,
        "env": env,
        # A tuned kernel's key leaves its config out: the config's values are part of the doc.
        "tuned": sorted([str(k), render(v)] for k, v in (tuned or {}).items()),
    }
    return hashlib.sha256(canonical(doc)).hexdigest()


def _index_file(root: str | os.PathLike[str], digest: str) -> str:
    """Where the warm index record named ``digest`` lives under cache directory ``root``
    (``index/<first two hex digits>/<digest>.json``)."""
    return os.path.join(root, _INDEX, digest[:2], f"{digest}.json")


def _check_warm_arguments(who: str, jit_fn, target, native_key, tuned, spec=_NO_SPEC) -> None:
    """TypeError naming the first argument of the wrong kind, in parameter order."""
    check_compile_inputs(who, jit_fn, target)
    _arguments.instance(who, "native_key", native_key, bytes, "bytes")
    if spec is not _NO_SPEC:
        check_specialization(who, spec)
    # None is tested first: the first isinstance(None, Mapping) in a process walks the ABC's
    # subclass tree (about 0.1 ms).
    _arguments.instance(who, "tuned", tuned, (type(None), Mapping), "a mapping or None")


def warm_lookup(jit_fn, target, native_key: bytes, tuned: Mapping[str, Any] | None = None):
    """``(spec, meta, handle)`` for a native key whose specialization the warm index holds and
    whose entry verifies, else None (then the caller specializes with Triton's binder). ``tuned``:
    the values a tuned config (or keyed heuristics) gave, which a tuned kernel's native key does
    not hold. Never raises for cache problems; TypeError naming an argument of the wrong kind."""
    if not (
        isinstance(jit_fn, JITFunction)
        and isinstance(target, GPUTarget)
        and type(native_key) is bytes
        and (tuned is None or type(tuned) is dict)
    ):
        _check_warm_arguments("warm_lookup", jit_fn, target, native_key, tuned)
    if not enabled() or always_compile():
        return None
    root = usable_root()
    if root is None:
        return None
    # Paths are joined as strings here: a fresh process's first call comes this way, and each
    # pathlib join costs it several microseconds.
    memo_dir = toolchain_dir(root)
    path = os.path.join(root, _INDEX)
    try:
        # One reading of the environment and the toolchain serves both documents.
        env, toolchain = cache_env(), toolchain_fingerprint(target, memo_dir)
        digest = _index_digest(jit_fn, target, native_key, toolchain, env, tuned)
        _fs.check_dirs(root, _INDEX, digest[:2])
        path = _index_file(root, digest)
        record, spec = decode_index_record(
            _fs.read_file(path, _MAX_INDEX_RECORD)[0], digest, native_key[:-16].hex(), target
        )
        doc = key_document(jit_fn, target, spec, memo_dir, env, toolchain)
        key = hashlib.sha256(canonical(doc)).hexdigest()
        if key != record["entry"]:
            raise ValueError("the specialization does not give the recorded entry")
    except FileNotFoundError:
        return None
    except _fs.UntrustedPath as exc:
        warn_untrusted(path, exc)
        return None
    except Exception as exc:  # a damaged or stale index record: the binder decides
        log.debug("fastkernel: warm index unusable for %s: %r", kernel_name(jit_fn), exc)
        return None
    entry = load(entry_file(root, key), key, target, doc["toolchain"])
    if entry is None:
        return None
    artifact = entry_artifact(entry, jit_fn, spec)
    return None if artifact is None else (spec, *artifact)


def warm_store(
    jit_fn,
    target,
    native_key: bytes,
    spec: abi.Specialization,
    tuned: Mapping[str, Any] | None = None,
) -> None:
    """Record ``native_key -> spec`` in the warm index (after its entry was written). Skipped
    quietly when the cache is off or a value has no JSON encoding; TypeError naming an argument
    of the wrong kind."""
    _check_warm_arguments("warm_store", jit_fn, target, native_key, tuned, spec)
    root = usable_root()
    if root is None:
        return
    try:
        memo_dir = toolchain_dir(root)
        env, toolchain = cache_env(), toolchain_fingerprint(target, memo_dir)
        doc = key_document(jit_fn, target, spec, memo_dir, env, toolchain)
        digest = _index_digest(jit_fn, target, native_key, toolchain, env, tuned)
        record: dict[str, Any] = {
            "index": digest,
            "native_key": native_key[:-16].hex(),
            "entry": hashlib.sha256(canonical(doc)).hexdigest(),
            "spec": _encode_spec(spec),
        }
        data = encode_index_record(record)
        if not entry_path(root, record["entry"]).is_file():
            return
        _fs.ensure_dir(root, _INDEX, digest[:2])
        _fs.write_file(_index_file(root, digest), data)
    except (_NotEncodable, Uncacheable) as exc:
        log.debug("fastkernel: no warm index record for %s: %s", kernel_name(jit_fn), exc)
    except OSError as exc:
        log_once(
            logging.DEBUG,
            ("index-write", str(root)),
            "fastkernel: cannot write the warm index under %s: %s",
            root,
            exc,
        )
