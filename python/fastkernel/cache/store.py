"""The miss path and the cache directory: load an entry or compile and store it under a
per-entry cross-process lock, discard an entry the driver refused, and the directory
operations (scan, clear, export, import)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import os
import pathlib
import re
import stat
import time
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import _arguments, _env, _locks
from .. import _triton_abi as abi
from . import files as _fs
from .entry import (
    ENTRY_SUFFIX,
    FORMAT_VERSION,
    LAUNCH_FIELDS,
    MAX_ENTRY_FILE,
    CorruptEntry,
    Entry,
    canonical,
    decode_entry,
    encode_entry,
    entries_dir,
    entry_path,
    read_entry,
)
from .key import (
    Uncacheable,
    check_compile_inputs,
    entry_key,
    key_document,
    memos_written,
    target_dict,
    toolchain_dir,
    toolchain_fingerprint,
)
from .settings import (
    always_compile,
    cache_dir,
    count,
    enabled,
    log_once,
    usable_root,
    warn_untrusted,
)

log = logging.getLogger("fastkernel.cache")
# An import reads an export (flat) or a cache directory (entries/<xx>/): a few levels at most.
_IMPORT_MAX_DEPTH = 4
_IMPORT_MAX_FILES = 1_000_000


#: Held while a CachedKernel makes and loads its Triton CompiledKernel (re-entrant: Triton's
#: load hooks may read the same CachedKernel).
_TRITON_KERNEL_LOCK = _locks.rlock()


@functools.cache
def _metadata_type(fields: tuple[str, ...]) -> type:
    """The KernelMetadata namedtuple class for ``fields`` (made once per field set: making a
    namedtuple class costs about a millisecond)."""
    return collections.namedtuple("KernelMetadata", fields)


@dataclasses.dataclass(frozen=True, eq=False)
class CachedKernel:
    """What a launch returns for a specialization registered from the disk cache, in place of
    Triton's ``CompiledKernel`` (which a warm process never builds). Read-only.

    It has the attributes of a ``CompiledKernel`` that describe the binary, with the same
    meaning, and takes the launches a ``CompiledKernel`` takes through Triton's own launcher
    (what launch caches of other libraries keep and call): ``run``, ``function``, ``module``,
    ``packed_metadata``, ``launch_metadata(grid, stream, *args)`` and ``handle[grid](*args)``.
    Those come from Triton's ``CompiledKernel`` of the same binary, made when one of them is
    first used (``fastkernel._triton_abi.compiled_kernel``); its module, loaded by Triton, is
    its own, never one of fastkernel's launch table. ``function`` and ``module`` load it when
    read, so they are never None.

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
    n_regs, n_spills, n_max_threads : int or None
        Registers per thread, local memory per thread in 4-byte words, and the most threads a
        block may have, as ``CompiledKernel`` has them once loaded (Triton's driver.c
        ``loadBinary``); read by the driver when the binary is loaded, None before.
    """

    name: str
    #: Triton's metadata fields as read from the entry (``target`` as a GPUTarget); ``metadata``
    #: is made from them on first use (making a namedtuple class costs a warm start about
    #: 0.3 ms, and most programs never read it).
    metadata_fields: Mapping[str, Any] = dataclasses.field(repr=False)
    asm: Mapping[str, bytes]
    src: Any
    hash: str
    key: str
    path: str
    kernel: str
    launch: Mapping[str, Any]
    n_regs: int | None = dataclasses.field(default=None, init=False)
    n_spills: int | None = dataclasses.field(default=None, init=False)
    n_max_threads: int | None = dataclasses.field(default=None, init=False)

    @functools.cached_property
    def metadata(self) -> Any:
        return _metadata_type(tuple(sorted(self.metadata_fields)))(**self.metadata_fields)

    def _set_function_attributes(self, n_regs: int, n_spills: int, n_max_threads: int) -> None:
        """Fill the attributes the driver reports once the binary is loaded (the object is
        otherwise read-only)."""
        object.__setattr__(self, "n_regs", n_regs)
        object.__setattr__(self, "n_spills", n_spills)
        object.__setattr__(self, "n_max_threads", n_max_threads)

    @property
    def target(self):
        """The compile target (``triton.backends.compiler.GPUTarget``)."""
        return self.metadata_fields["target"]

    def _triton_kernel(self, load: bool = True) -> Any:
        """Triton's ``CompiledKernel`` of this binary, made once and, with ``load``, loaded by
        Triton (``_init_handles``), both under one lock, so two threads never each make or load
        one. It lives as long as this object: Triton unloads its module when it is collected
        (``CompiledKernel.__del__``), so a caller keeping ``function`` keeps this object too,
        as with a ``CompiledKernel`` of Triton's device cache. Raises AttributeError when this
        object has no compile source, and what ``_init_handles`` raises (``OutOfResources``)."""
        kernel = self.__dict__.get("_triton")
        if kernel is not None and (not load or kernel.module is not None):
            return kernel
        with _TRITON_KERNEL_LOCK:
            kernel = self.__dict__.get("_triton")
            if kernel is None:
                if self.src is None:
                    raise AttributeError(
                        f"fastkernel: cached kernel {self.name} was read without its compile "
                        f"source and cannot launch through Triton"
                    )
                kernel = abi.compiled_kernel(self.src, self.metadata_fields, self.asm["cubin"])
                object.__setattr__(self, "_triton", kernel)
            if load:
                kernel._init_handles()
        return kernel

    @property
    def packed_metadata(self) -> Any:
        """What Triton's launcher takes with the function (``CompiledKernel.packed_metadata``)."""
        return self._triton_kernel(load=False).packed_metadata

    @property
    def run(self) -> Any:
        """Triton's launcher for this binary (``CompiledKernel.run``), called as Triton calls
        it: ``run(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook,
        exit_hook, *args)``. Raises what ``CompiledKernel._init_handles`` raises
        (``OutOfResources``)."""
        return self._triton_kernel().run

    @property
    def function(self) -> Any:
        """The ``CUfunction`` handle Triton's loader gives (``CompiledKernel.function``)."""
        return self._triton_kernel().function

    @property
    def module(self) -> Any:
        """The ``CUmodule`` handle Triton's loader gives (``CompiledKernel.module``)."""
        return self._triton_kernel().module

    def launch_metadata(self, grid: Any, stream: int, *args: Any) -> Any:
        """``CompiledKernel.launch_metadata``: Triton's metadata for its launch hooks, or None
        when no enter hook is set."""
        return self._triton_kernel().launch_metadata(grid, stream, *args)

    def __getitem__(self, grid: Any) -> Any:
        """``CompiledKernel.__getitem__`` of Triton's ``CompiledKernel`` of this binary: a
        runner launching it on ``grid`` (three dims), every argument passed, constexprs
        included; the native launch of the binary when the patch serves its kernel
        (``fastkernel.kernel.CompiledLaunch``), Triton's launcher otherwise."""
        return self._triton_kernel()[grid]

    #: Not iterable, although it has __getitem__ (iter() would call it with 0, 1, 2, ... and
    #: load the module, without end).
    __iter__ = None

    @classmethod
    def from_entry(cls, entry: Entry, src: Any = None) -> CachedKernel:
        from triton.backends.compiler import GPUTarget

        h = entry.header
        md = dict(h["triton_metadata"])
        t = h["target"]  # the same target, checked by _check_header
        # As CompiledKernel.__init__ (triton/compiler/compiler.py) rebuilds it from its JSON.
        md["target"] = GPUTarget(t["backend"], t["arch"], t["warp_size"])
        return cls(
            name=h["launch"]["name"],
            metadata_fields=types.MappingProxyType(md),
            asm=types.MappingProxyType({"cubin": entry.cubin}),
            src=src,
            hash=str(md.get("hash", "")),
            key=h["key"],
            path=str(entry.path),
            kernel=h["kernel"],
            launch=types.MappingProxyType(dict(h["launch"])),
        )


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one (see
    :func:`fastkernel.cache.files.write_file`), creating the directory if needed. For files
    outside the cache (bundles, exports): mode 0666 less the umask, like any file the user
    creates. Files inside the cache are written private to the user. TypeError naming the
    argument when ``path`` is not a str or os.PathLike or ``data`` not bytes."""
    path = _arguments.path("atomic_write", "path", path)
    _arguments.instance(
        "atomic_write", "data", data, (bytes, bytearray, memoryview), "a bytes-like object"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _fs.write_file(path, data, 0o666)


def _store_entry(root: pathlib.Path, key: str, data: bytes) -> None:
    """Write entry ``key`` into cache directory ``root`` (private directories and file)."""
    directory = _fs.ensure_dir(root, "entries", key[:2])
    _fs.write_file(directory / f"{key}{ENTRY_SUFFIX}", data)


def _remove_if_unchanged(path: str | pathlib.Path, seen: os.stat_result | None) -> None:
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
            count("removed")
    except OSError:
        pass


def load(path: str | pathlib.Path, key: str, target, toolchain: Mapping[str, Any]) -> Entry | None:
    """The verified entry at ``path`` (``<root>/entries/<shard>/<key>.fkc``), or None (missing;
    untrusted, then warned once; or bad, then logged and removed)."""
    shards, shard = os.path.split(os.path.dirname(path))
    try:
        _fs.check_dirs(*os.path.split(shards), shard)
        data, seen = _fs.read_file(path, MAX_ENTRY_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except _fs.UntrustedPath as exc:
        warn_untrusted(path, exc)
        return None
    except OSError as exc:
        log_once(
            logging.WARNING,
            ("read", os.path.dirname(path)),
            "fastkernel: cannot read cache entry %s (%s); compiling",
            path,
            exc,
        )
        return None
    try:
        entry = decode_entry(data, pathlib.Path(path))
        if entry.key != key:
            raise CorruptEntry(f"a foreign entry (key {entry.key[:16]}...)")
        if dict(entry.header["target"]) != target_dict(target):
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


def kernel_name(jit_fn) -> str:
    return f"{getattr(jit_fn, 'module', '?')}:{getattr(jit_fn.fn, '__qualname__', jit_fn.__name__)}"


def _triton_metadata(compiled) -> dict[str, Any]:
    """CompiledKernel.metadata as Triton writes it to its own cache (json.dumps(default=vars))."""
    md = compiled.metadata
    md = md._asdict() if hasattr(md, "_asdict") else dict(vars(md))
    return json.loads(json.dumps(md, default=vars))


def _header(
    key: str, jit_fn, target, doc: Mapping[str, Any], meta: abi.LaunchMetadata, compiled
) -> dict[str, Any]:
    launch = {field: getattr(meta, field) for field in LAUNCH_FIELDS}
    for field, kind in LAUNCH_FIELDS.items():
        launch[field] = kind(launch[field])
    return {
        "format": FORMAT_VERSION,
        "key": key,
        "kernel": kernel_name(jit_fn),
        "launch": launch,
        "target": target_dict(target),
        "toolchain": doc["toolchain"],
        "triton_metadata": _triton_metadata(compiled),
        # For `cache list` only; the key already covers them.
        "signature": doc["signature"],
        "created": time.time(),
    }


# -- the miss path --------------------------------------------------------------------------


def _compile(jit_fn, target, spec):
    compiled = abi.compile_specialization(jit_fn, target, spec)
    count("compiled")
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
    TypeError
        An argument of the wrong kind (named).
    fastkernel._triton_abi.UnsupportedByNativePath
        For a binary the native launcher cannot call (then nothing is written).
    Exception
        Whatever Triton's compiler raises. Cache problems are never raised: an unreadable or bad
        entry is logged, removed and compiled again; a failed write is logged.
    """
    check_compile_inputs("load_or_compile", jit_fn, target, spec)
    root = usable_root()
    if root is None:
        return _compile(jit_fn, target, spec)
    memo_dir = toolchain_dir(root)
    try:
        doc = key_document(jit_fn, target, spec, memo_dir)
    except Uncacheable as exc:
        log_once(
            logging.WARNING,
            ("uncacheable", kernel_name(jit_fn), str(exc)),
            "fastkernel: %s is not cached on disk: %s",
            kernel_name(jit_fn),
            exc,
        )
        return _compile(jit_fn, target, spec)
    key = hashlib.sha256(canonical(doc)).hexdigest()
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
    entry = load(path, key, target, doc["toolchain"])
    if entry is None:
        return None
    artifact = entry_artifact(entry, jit_fn, spec)
    if artifact is not None:
        log.debug("fastkernel: %s loaded from %s", kernel_name(jit_fn), path)
    return artifact


#: How long a process waits for another one compiling the same specialization (seconds) before
#: it compiles the specialization itself. A holder that dies releases its lock at once.
_LOCK_TIMEOUT = 600.0


@contextlib.contextmanager
def cross_process_lock(make_path: Callable[[], pathlib.Path], purpose: str) -> Iterator[None]:
    """Hold a ``filelock`` lock file for the block, so that one process at a time does what
    ``purpose`` names (``"compiling add_kernel"``); ``make_path()`` gives the lock file's path
    (and may create its directory). A no-op when ``FASTKERNEL_CACHE_LOCK=0`` (file systems
    without working locks), when the lock cannot be created (a read-only or full cache, logged
    once), or after waiting ``_LOCK_TIMEOUT`` seconds (logged once): a launch never fails for
    it. A holder that dies releases its lock at once."""
    if not _env.flag("FASTKERNEL_CACHE_LOCK", True):
        yield
        return
    from filelock import FileLock, Timeout

    path = None
    try:
        path = make_path()
        lock = FileLock(str(path), timeout=_LOCK_TIMEOUT)
        lock.acquire()
    except Timeout:
        log_once(
            logging.WARNING,
            ("lock-timeout", str(path)),
            "fastkernel: waited %.0f s for another process %s; going on here",
            _LOCK_TIMEOUT,
            purpose,
        )
        yield
        return
    except OSError as exc:
        where = path.parent if path is not None else "the cache"
        log_once(
            logging.WARNING,
            ("lock", str(where)),
            "fastkernel: cannot take a lock under %s (%s); processes may be %s at once",
            where,
            exc,
            purpose,
        )
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _entry_lock(root: pathlib.Path, key: str, jit_fn) -> contextlib.AbstractContextManager[None]:
    """The cross-process lock of entry ``key``: a lock file beside it."""
    return cross_process_lock(
        lambda: _fs.ensure_dir(root, "entries", key[:2]) / f".{key}.lock",
        f"compiling {kernel_name(jit_fn)}",
    )


def entry_artifact(entry: Entry, jit_fn, spec: abi.Specialization):
    """``(LaunchMetadata, CachedKernel)`` of a verified entry, or None when they cannot be made
    from it (a header that passed the schema but not Python's rules for what it becomes): the
    entry is then corrupt, removed and logged."""
    try:
        src = abi.ast_source(jit_fn, spec)
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
        count("stored")
    except Exception as exc:  # a failed store must not fail a launch that compiled
        log_once(
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
    check_compile_inputs("compile_and_store", jit_fn, target, spec)
    root = usable_root()
    if root is None:
        return _compile(jit_fn, target, spec)
    try:
        doc = key_document(jit_fn, target, spec, toolchain_dir(root))
    except Uncacheable:
        return _compile(jit_fn, target, spec)
    key = hashlib.sha256(canonical(doc)).hexdigest()
    return _compile_and_store(jit_fn, target, spec, root, key, doc)


def discard(handle: CachedKernel, reason: str) -> None:
    """Remove the entry ``handle`` was read from, which verified but could not become a native
    registration (``reason``); logged once per entry file. TypeError naming the argument when
    ``handle`` is not a CachedKernel or ``reason`` not a str."""
    _arguments.instance("discard", "handle", handle, CachedKernel, "a CachedKernel")
    _arguments.instance("discard", "reason", reason, str, "a str")
    log_once(
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
    :func:`load_or_compile` verifies it). False when the cache is off or the kernel uncacheable.
    TypeError naming an argument of the wrong kind."""
    check_compile_inputs("is_cached", jit_fn, target, spec)
    if not enabled():
        return False
    try:
        root = cache_dir()
        key = entry_key(jit_fn, target, spec, toolchain_dir(root))
    except (Uncacheable, RuntimeError):  # RuntimeError: no home directory to find the cache in
        return False
    return entry_path(root, key).is_file()


# -- managing a cache directory -------------------------------------------------------------


def iter_entry_files(root: pathlib.Path, strict: bool = False) -> Iterator[pathlib.Path]:
    """Every regular ``*.fkc`` file under ``root`` (a cache directory or an export), at most
    ``_IMPORT_MAX_DEPTH`` directories down, never through a symbolic link, in sorted order.
    Raises ``files.UntrustedPath`` past ``_IMPORT_MAX_FILES`` files. A ``root`` that is not a
    directory has none; with ``strict`` it raises OSError instead, as does a directory under it
    that cannot be read. TypeError naming the argument when ``root`` is not a str or
    os.PathLike or ``strict`` not a bool."""
    root = _arguments.path("iter_entry_files", "root", root)
    _arguments.instance("iter_entry_files", "strict", strict, bool, "a bool")
    if not root.is_dir():
        if strict:
            code = errno.ENOTDIR if root.exists() else errno.ENOENT
            raise OSError(code, os.strerror(code), str(root))
        return iter(())
    return _fs.walk_files(root, ENTRY_SUFFIX, _IMPORT_MAX_DEPTH, _IMPORT_MAX_FILES, strict)


def _root_argument(who: str, root: Any) -> pathlib.Path | None:
    """The cache directory argument ``root`` of ``who()`` as a path, or None (TypeError naming
    it for another kind)."""
    return None if root is None else _arguments.path(who, "root", root, " or None")


def _cache_root(who: str, root: Any) -> pathlib.Path:
    """The cache directory argument ``root`` of ``who()``: a path, or None for
    :func:`cache_dir`."""
    path = _root_argument(who, root)
    return cache_dir() if path is None else path


def scan(root: pathlib.Path | None = None) -> tuple[list[Entry], list[tuple[pathlib.Path, str]]]:
    """Read every entry under cache directory ``root`` (default :func:`cache_dir`).

    Returns
    -------
    (entries, bad)
        The verified entries, and ``(path, reason)`` for each file that failed verification
        (left in place; a launch that needs one removes it).

    Raises
    ------
    TypeError
        ``root`` is not a str, os.PathLike or None.
    RuntimeError
        ``root`` is None and no cache directory can be found (:func:`cache_dir`).
    fastkernel.cache.files.UntrustedPath
        The entries directory is a symbolic link or not private to this user.
    """
    root = _cache_root("scan", root)
    good, bad = [], []
    for path in iter_entry_files(entries_dir(root)):
        try:
            good.append(read_entry(path))
        except (OSError, CorruptEntry) as exc:
            bad.append((path, str(exc)))
    return good, bad


#: The files fastkernel writes under each directory of a cache, by name ending: entries and
#: their per-entry locks, warm-index records, tuning records and their locks, toolchain memos,
#: and the temporary files of writes in progress (``.<name>.<pid>.<hex>.tmp``).
_CACHE_FILES = {
    "entries": (ENTRY_SUFFIX, ".lock", ".tmp"),
    "index": (".json", ".tmp"),
    "autotune": (".json", ".json.lock", ".tmp"),
    "toolchain": (".txt", ".tmp"),
}


#: The name of a write's temporary file (``files.write_file``): ``.<name>.<pid>.<12 hex>.tmp``.
_TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{12}\.tmp")

#: How old (seconds since its last change) a temporary file must be before ``prune`` takes it:
#: a write lasts milliseconds, so one this old was left by a writer that was killed.
STALE_TEMP_SECONDS = 3600.0


def _cache_files(root: pathlib.Path) -> Iterator[tuple[str, str, str]]:
    """``(subdirectory, directory, name)`` of every file whose name is one fastkernel writes
    (``_CACHE_FILES``) under cache directory ``root``, without following symbolic links; the
    caller checks that each is a regular file."""
    for sub, endings in _CACHE_FILES.items():
        top = root / sub
        if not top.is_dir() or top.is_symlink():
            continue
        for directory, _, names in os.walk(top, followlinks=False):
            for name in sorted(names):
                if name.endswith(endings):
                    yield sub, directory, name


def temp_files(root: pathlib.Path) -> list[pathlib.Path]:
    """The temporary files of writes (in progress, or left by a writer that was killed) under
    cache directory ``root``: regular files named as ``files.write_file`` names them."""
    found = []
    for _, directory, name in _cache_files(pathlib.Path(root)):
        path = pathlib.Path(directory) / name
        with contextlib.suppress(OSError):
            if _TEMP_NAME.fullmatch(name) and stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
    return found


def _remove_cache_files(
    root: pathlib.Path,
    take_name: Callable[[str], bool],
    take_stat: Callable[[os.stat_result], bool],
) -> tuple[list[tuple[str, str, os.stat_result]], list[OSError]]:
    """Remove the regular files among :func:`_cache_files` under ``root`` whose name
    ``take_name`` and then whose ``lstat`` ``take_stat`` accepts. Returns ``(subdirectory, name,
    stat)`` of each file removed, and the error of each that could not be (a file gone
    meanwhile is neither)."""
    removed: list[tuple[str, str, os.stat_result]] = []
    failed: list[OSError] = []
    for sub, directory, name in _cache_files(root):
        if not take_name(name):
            continue
        path = pathlib.Path(directory) / name
        try:
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) and take_stat(st)):
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed.append(exc)
            continue
        removed.append((sub, name, st))
    return removed, failed


def _removal_error(failed: list[OSError], done: str) -> OSError:
    first = failed[0]
    return OSError(
        first.errno,
        f"could not remove {len(failed)} file{'s' if len(failed) > 1 else ''} ({done}); the "
        f"first: {first.strerror}",
        first.filename,
    )


def clear(root: pathlib.Path | None = None) -> tuple[int, int]:
    """Remove every entry, temporary file, lock file, warm-index record, toolchain memo and
    tuning record (``autotune/``) under cache directory ``root`` (default :func:`cache_dir`),
    and the directories they leave empty. Other files there are left alone, and symbolic links
    are not followed.

    Returns
    -------
    (int, int)
        Entry files removed, and their total size in bytes.

    Raises
    ------
    TypeError
        ``root`` is not a str, os.PathLike or None.
    RuntimeError
        ``root`` is None and no cache directory can be found (:func:`cache_dir`).
    OSError
        A file could not be removed (after every other one was); the error names it and how
        many failed.
    """
    root = _cache_root("clear", root)
    removed, failed = _remove_cache_files(root, lambda name: True, lambda st: True)
    entries = [st for sub, name, st in removed if sub == "entries" and name.endswith(ENTRY_SUFFIX)]
    count, size = len(entries), sum(st.st_size for st in entries)
    for sub in _CACHE_FILES:  # the directories left empty, deepest first
        top = root / sub
        if top.is_dir() and not top.is_symlink():
            for directory, _, _ in os.walk(top, topdown=False, followlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)  # only when empty: what is not fastkernel's stays
    memos_written.clear()
    if failed:
        raise _removal_error(failed, f"{count} entries removed")
    return count, size


def check_older_than(older_than: Any) -> float:
    """``older_than`` as :func:`prune` takes it: an int or float of seconds, finite and >= 0,
    as a float. Raises TypeError for another kind, ValueError for a negative, infinite or NaN
    value, or an int too large for a float."""
    if not _arguments.is_number(older_than):
        raise _arguments.kind_error("prune()", "older_than", "a number of seconds", older_than)
    seconds = _arguments.finite_nonnegative(older_than)
    if seconds is None:
        raise ValueError(
            f"prune(): argument 'older_than' must be finite and >= 0 seconds, not {older_than!r}"
        )
    return seconds


def prune(root: pathlib.Path | None = None, older_than: float = STALE_TEMP_SECONDS) -> int:
    """Remove the temporary files that writers killed mid-write left under cache directory
    ``root`` (default :func:`cache_dir`): regular files named as ``files.write_file`` names its
    temporaries, unchanged for at least ``older_than`` seconds (a write in progress lasts
    milliseconds, and is left alone). Entries, records and directories stay; symbolic links are
    not followed. A killed writer never leaves a torn entry (the rename is atomic), only these.

    Returns
    -------
    int
        Temporary files removed.

    Raises
    ------
    TypeError
        ``root`` is not a str, os.PathLike or None; ``older_than`` is not an int or a float.
    ValueError
        ``older_than`` is negative, infinite, NaN or too large for a float.
    RuntimeError
        ``root`` is None and no cache directory can be found (:func:`cache_dir`).
    OSError
        A file could not be removed (after every other one was); the error names it and how
        many failed.
    """
    root_path = _root_argument("prune", root)  # the kinds first, then the value
    seconds = check_older_than(older_than)
    root = cache_dir() if root_path is None else root_path
    cutoff = time.time() - seconds
    removed, failed = _remove_cache_files(
        root, lambda name: _TEMP_NAME.fullmatch(name) is not None, lambda st: st.st_mtime <= cutoff
    )
    count = len(removed)
    if failed:
        raise _removal_error(failed, f"{count} removed")
    return count


def export_entries(dest: pathlib.Path, root: pathlib.Path | None = None) -> int:
    """Copy every verified entry of cache directory ``root`` into directory ``dest`` (created),
    as ``dest/<key>.fkc``. Entries carry their target and toolchain; bad files are skipped with
    a log line.

    Returns
    -------
    int
        Entries exported.

    Raises
    ------
    TypeError
        ``dest`` is not a str or os.PathLike, or ``root`` not one or None.
    RuntimeError
        ``root`` is None and no cache directory can be found (:func:`cache_dir`).
    fastkernel.cache.files.UntrustedPath
        The cache's entries directory is a symbolic link or not private to this user.
    OSError
        ``dest`` cannot be made (it names a file, no permission) or a file written.
    """
    dest = _arguments.path("export_entries", "dest", dest)
    entries, bad = scan(_cache_root("export_entries", root))
    for path, reason in bad:
        log.warning("fastkernel: not exported %s: %s", path, reason)
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
    TypeError
        ``src`` is not a str or os.PathLike, or ``root`` not one or None.
    RuntimeError
        ``root`` cannot be used (not creatable, or not private to this user), or is None and
        no cache directory can be found.
    fastkernel.cache.files.UntrustedPath
        ``src`` holds more than ``_IMPORT_MAX_FILES`` entry files.
    OSError
        ``src`` is not a directory, or a directory under it cannot be read.
    """
    src = _arguments.path("import_entries", "src", src)
    root = _cache_root("import_entries", root)
    imported = skipped = 0
    local: dict[tuple[str, int, int], dict[str, Any]] = {}
    problem = _fs.usable_root(root)
    if problem is not None:
        raise RuntimeError(f"the kernel cache {root} cannot be used: {problem}")
    for path in iter_entry_files(src, strict=True):
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

                local[tkey] = toolchain_fingerprint(GPUTarget(*tkey), toolchain_dir(root))
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
