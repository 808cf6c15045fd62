"""The cache key: everything that changes a compiled binary (kernel source and dependencies,
specialization, compile options, target, Triton and backend fingerprints), as a canonical
document and its SHA-256 (docs/cache.md, "The key")."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sysconfig
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from .. import _arguments
from .. import _triton_abi as abi
from . import files as _fs
from .entry import FORMAT_VERSION, canonical, is_sha256_hex
from .settings import log_once

log = logging.getLogger("fastkernel.cache")


# -- the key --------------------------------------------------------------------------------


class Uncacheable(Exception):
    """A specialization whose binary identity cannot be written down stably (so it is compiled
    and launched, but not stored on disk)."""


def render(value: Any) -> Any:
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
        return [type(value).__name__, [render(v) for v in value]]
    if isinstance(value, triton.language.constexpr):
        return ["constexpr", render(value.value)]
    if isinstance(value, triton.language.dtype):
        fields = sorted(vars(value).items())
        return ["dtype", type(value).__qualname__, [[k, render(v)] for k, v in fields]]
    if isinstance(value, abi.IDENTITY_CONSTEXPR_TYPES):  # jit functions (JITCallable)
        return ["jit", value.cache_key, bool(getattr(value, "noinline", False))]
    raise Uncacheable(
        f"a value of type {type(value).__module__}.{type(value).__qualname__} "
        f"has no stable rendering for the cache key"
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _package_sources(directory: str, out: list[str]) -> None:
    """Append the .py files of ``directory`` and, depth first, of its subdirectories that are
    packages (hold an ``__init__.py``): the modules ``pkgutil.walk_packages`` finds there. The
    non-package trees beside them (the CUDA headers and tools under ``backends/nvidia``) are not
    entered, which is most of the walk. Nor are directories whose name holds a dot (``pkgutil``
    skips them) or ``__pycache__``, which are not asked for an ``__init__.py``: each stat counts
    in a warm start."""
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    out += [e.path for e in entries if e.name.endswith(".py") and e.is_file()]
    for e in entries:
        if (
            "." not in e.name
            and e.name != "__pycache__"
            and e.is_dir()
            and os.path.isfile(os.path.join(e.path, "__init__.py"))
        ):
            _package_sources(e.path, out)


@functools.cache
def _triton_key_sources() -> tuple[str, ...]:
    """The files Triton's ``triton_key()`` hashes (triton/runtime/cache.py: the frontend, then
    ``pkgutil.walk_packages`` over the compiler and backends packages, libtriton, then the
    language package), as a superset: every .py file of those packages and their
    subpackages."""
    root = os.path.dirname(os.path.abspath(triton.__file__))
    paths = [os.path.join(root, "runtime", "cache.py")]
    for sub in ("compiler", "backends", "language"):
        _package_sources(os.path.join(root, sub), paths)
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    paths.append(os.path.join(root, "_C", f"libtriton.{ext}"))
    return tuple(paths)


@functools.cache
def _stat_part(path: str) -> str:
    """One file's identity for a stat signature: path, size, mtime, inode and device."""
    try:
        st = os.stat(path)
        return f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"
    except OSError:
        return f"{path}\0missing"


@functools.cache
def _triton_stat_signature() -> str:
    """A hash of the installed Triton's version and the path, size, mtime, inode and device of
    every file ``triton_key()`` reads. Taken once per process: the Triton this process runs is
    the one it imported (Triton's own ``triton_key()`` is likewise computed once per process,
    ``functools.lru_cache`` in triton/runtime/cache.py)."""
    parts = [triton.__version__] + [_stat_part(path) for path in _triton_key_sources()]
    return _sha256("\n".join(parts))


def _compute_triton_key_digest() -> str:
    from triton.runtime.cache import triton_key

    return _sha256(triton_key())


_digests: dict[tuple[str, str], str] = {}
memos_written: set = set()


def _memoized_digest(kind: str, signature: str, compute, memo_dir: str | None) -> str:
    """``compute()`` (a sha256 hex digest), memoized in the process and on disk under
    ``memo_dir`` as ``<kind>-<signature>.txt``, where ``signature`` hashes the stats of every
    input (the way ccache's direct mode trusts file stats): a changed input changes a stat and
    the digest is computed again. The memo is local; entries carry the digest itself."""
    digest = _digests.get((kind, signature))
    if digest is not None and (not memo_dir or (memo_dir, kind, signature) in memos_written):
        return digest  # the usual case after the first call: no path is built
    memo = os.path.join(memo_dir, f"{kind}-{signature[:40]}.txt") if memo_dir else None
    memo_parent, memo_name = os.path.split(memo_dir or "")
    memo_read = False
    if digest is None and memo is not None:
        try:
            _fs.check_dirs(memo_parent, memo_name)
            text = _fs.read_file(memo, 128)[0].decode("ascii").strip()
            if is_sha256_hex(text):
                digest, memo_read = text, True
        except (OSError, UnicodeDecodeError):
            pass
    if digest is None:
        digest = compute()
    _digests[(kind, signature)] = digest
    if memo is not None and (memo_dir, kind, signature) not in memos_written:
        memos_written.add((memo_dir, kind, signature))
        try:
            if not memo_read and not os.path.exists(memo):
                _fs.ensure_dir(memo_parent, memo_name)
                _fs.write_file(memo, digest.encode("ascii"))
        except OSError as exc:
            log_once(
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
    for env_var, bundled in _ptxas_paths():
        env = os.environ.get(env_var)
        parts += [_stat_part(path) for path in ([env] if env else []) + [bundled]]
    return _sha256("\n".join(parts))


@functools.cache
def _ptxas_paths() -> tuple[tuple[str, str], ...]:
    """Per ptxas Triton may run: the environment variable naming another binary, and the one
    Triton bundles (triton/knobs.py ``env_nvidia_tool``). Fixed for the process's Triton."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return tuple(
        (f"TRITON_{tool.upper().replace('-', '_')}_PATH", os.path.join(bin_dir, tool))
        for tool in ("ptxas", "ptxas-blackwell")
    )


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


def _file_content_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def options_digest(options, memo_dir: str | None) -> str:
    """sha256 of the backend options: every field by name and value, as the backends' own
    ``hash()`` spells them (triton/backends/nvidia/compiler.py ``CUDAOptions.hash``), with each
    extern library (libdevice) by the sha256 of its content, memoized by the library's stats
    like the toolchain digests (hashing libdevice, about 0.5 MB, would cost a warm start about
    half a millisecond)."""
    fields = dict(vars(options))
    libs = fields.get("extern_libs")
    if libs:
        pairs = libs.items() if isinstance(libs, dict) else libs
        fields["extern_libs"] = tuple(
            (
                name,
                _memoized_digest(
                    "file",
                    _sha256(_stat_part(str(path))),
                    functools.partial(_file_content_digest, path),
                    memo_dir,
                ),
            )
            for name, path in sorted(pairs)
        )
    return _sha256("_".join(f"{name}-{value}" for name, value in sorted(fields.items())))


def cache_env() -> list[list[str]]:
    """Triton's cache-invalidating environment variables that are set, as sorted ``[name,
    value]`` pairs: ``triton._C.libtriton.get_cache_invalidating_env_vars()``, which
    ``triton.compile`` folds into its own cache key. Read anew at every call (the environment
    can change within a process)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return sorted([str(k), str(v)] for k, v in get_cache_invalidating_env_vars().items())


_NO_SPEC: Any = object()


def check_target(who: str, target: Any) -> None:
    """TypeError naming argument ``target`` of ``who()`` unless it is a GPUTarget."""
    _arguments.instance(who, "target", target, GPUTarget, "a triton.backends.compiler.GPUTarget")


def check_specialization(who: str, spec: Any) -> None:
    """TypeError naming argument ``spec`` of ``who()`` unless it is a Specialization."""
    _arguments.instance(
        who, "spec", spec, abi.Specialization, "a fastkernel._triton_abi.Specialization"
    )


def check_compile_inputs(who: str, jit_fn: Any, target: Any, spec: Any = _NO_SPEC) -> None:
    """TypeError naming the argument of ``who()`` unless ``jit_fn`` is a Triton JITFunction,
    ``target`` a GPUTarget and ``spec`` (when given) a Specialization. (The functions on the
    warm start's path test the usual kinds inline first and call this only when one differs:
    the first call of a Python function costs a fresh process microseconds.)"""
    _arguments.instance(who, "jit_fn", jit_fn, JITFunction, "a triton.runtime.jit.JITFunction")
    check_target(who, target)
    if spec is not _NO_SPEC:
        check_specialization(who, spec)


def _memo_dir(who: str, memo_dir: Any) -> str | None:
    """``memo_dir`` checked (str, os.PathLike or None) and as a str, or None."""
    if memo_dir is None:
        return None
    _arguments.path(who, "memo_dir", memo_dir, " or None")
    return os.fspath(memo_dir) or None


def toolchain_dir(root: str | os.PathLike[str]) -> str:
    """Where the toolchain digests are memoized under cache directory ``root``."""
    return os.path.join(root, "toolchain")


def toolchain_fingerprint(target, memo_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What identifies the toolchain that compiles for ``target``; stored in every entry and part
    of its key.

    Parameters
    ----------
    target : triton.backends.compiler.GPUTarget
        The compile target (its backend hash depends on the arch: Triton 3.9 runs
        ``ptxas-blackwell`` for sm_90 and later, ``ptxas`` below).
    memo_dir : str or os.PathLike, optional
        Where the ``triton_key`` digest is memoized (the cache directory's ``toolchain/``).

    Returns
    -------
    dict
        ``format`` (this module's FORMAT_VERSION), ``fastkernel`` (its version), ``triton`` (its
        version), ``triton_key`` (sha256 of ``triton.runtime.cache.triton_key()``), ``backend``
        (sha256 of the backend's ``hash()``: for CUDA the ptxas version text and the arch,
        triton/backends/nvidia/compiler.py ``CUDABackend.hash``).

    Raises
    ------
    TypeError
        ``target`` is not a GPUTarget, or ``memo_dir`` not a str, os.PathLike or None.
    """
    import fastkernel

    if isinstance(target, GPUTarget) and (memo_dir is None or type(memo_dir) is str):
        memo = memo_dir or None
    else:
        check_target("toolchain_fingerprint", target)
        memo = _memo_dir("toolchain_fingerprint", memo_dir)
    return {
        "format": FORMAT_VERSION,
        "fastkernel": fastkernel.__version__,
        "triton": triton.__version__,
        "triton_key": _triton_key_digest(memo),
        "backend": _backend_digest(target, memo),
    }


def target_dict(target) -> dict[str, Any]:
    return {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}


def key_document(
    jit_fn,
    target,
    spec: abi.Specialization,
    memo_dir: str | os.PathLike[str] | None = None,
    env: list[list[str]] | None = None,
    toolchain: dict[str, Any] | None = None,
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
    memo_dir : str or os.PathLike, optional
        Passed to :func:`toolchain_fingerprint`.
    env : list of [str, str], optional
        :func:`cache_env` as the caller read it for this call; default: read here.
    toolchain : dict, optional
        :func:`toolchain_fingerprint` as the caller took it for this call; default: taken here.

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
        functions by their ``cache_key``; ``options``: :func:`options_digest` (every option, with
        extern libraries such as libdevice by content, not path);
        ``env``: :func:`cache_env`.

    Raises
    ------
    TypeError
        An argument of the wrong kind (named).
    Uncacheable
        When the kernel's source or dependencies cannot be hashed, a value has no stable
        rendering, or ``TRITON_KERNEL_OVERRIDE`` substitutes IR from files outside the key.
    """
    from triton import knobs

    if (
        isinstance(jit_fn, JITFunction)
        and isinstance(target, GPUTarget)
        and isinstance(spec, abi.Specialization)
        and (memo_dir is None or type(memo_dir) is str)
        and (env is None or type(env) is list)
        and (toolchain is None or type(toolchain) is dict)
    ):
        memo = memo_dir or None
    else:
        check_compile_inputs("key_document", jit_fn, target, spec)
        memo = _memo_dir("key_document", memo_dir)
        _arguments.instance("key_document", "env", env, (list, type(None)), "a list or None")
        _arguments.instance(
            "key_document", "toolchain", toolchain, (dict, type(None)), "a dict or None"
        )

    if knobs.compilation.override:
        raise Uncacheable("TRITON_KERNEL_OVERRIDE substitutes IR from files outside the key")
    try:
        kernel_key = jit_fn.cache_key  # also fills jit_fn.used_global_vals
        source_key = abi.ast_source(jit_fn, spec).hash()
    except Exception as exc:  # Triton's DependenciesFinder raises RuntimeError, parsing OSError...
        raise Uncacheable(f"its source cannot be hashed ({type(exc).__name__}: {exc})") from exc
    # The value compiled in is the one in the globals dict now (Triton's code generator reads
    # it at compile time); used_global_vals holds a copy taken when cache_key was first computed.
    missing = object()
    globals_used = []
    for (name, _), (first_value, var_dict) in jit_fn.used_global_vals.items():
        value = var_dict.get(name, missing)
        globals_used.append([name, render(first_value if value is missing else value)])
    globals_used.sort()
    return {
        "format": FORMAT_VERSION,
        "toolchain": toolchain_fingerprint(target, memo) if toolchain is None else toolchain,
        "target": target_dict(target),
        "source": source_key,
        "kernel": kernel_key,
        "globals": globals_used,
        "signature": [[str(name), str(ty)] for name, ty in spec.signature.items()],
        "constexprs": sorted([list(path), render(v)] for path, v in spec.constexprs.items()),
        "attrs": sorted([list(path), render(v)] for path, v in spec.attrs.items()),
        "options": options_digest(spec.options, memo),
        "env": cache_env() if env is None else env,
    }


def entry_key(
    jit_fn, target, spec: abi.Specialization, memo_dir: str | os.PathLike[str] | None = None
) -> str:
    """The entry key: the sha256 (hex) of :func:`key_document` serialized canonically (JSON,
    sorted keys, no whitespace). Raises TypeError and Uncacheable as :func:`key_document`
    does."""
    check_compile_inputs("entry_key", jit_fn, target, spec)
    _memo_dir("entry_key", memo_dir)
    return hashlib.sha256(canonical(key_document(jit_fn, target, spec, memo_dir))).hexdigest()
