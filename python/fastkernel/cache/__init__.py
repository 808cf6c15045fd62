"""The persistent kernel cache: compiled specializations on disk, so a warm process never compiles.

Modules: :mod:`.settings` (where, whether), :mod:`.key`, :mod:`.entry` (file format),
:mod:`.files` (trusted file access), :mod:`.store` (miss path, directory), :mod:`.index` (warm
index), :mod:`.cli`.

Each entry is one file holding a cubin and the launch metadata needed to register it with the
native table (:class:`fastkernel._triton_abi.LaunchMetadata`), named by a key that covers
everything that changes the binary (see :func:`entry_key`). On a miss the native entry asks
:func:`load_or_compile` for the launch artifact; with a warm cache that is a file read and a
checksum, and Triton's compiler is never called. The parameter plan is not stored: it is
derived from the specialization's signature, which a cold miss takes from Triton's binder (not
its compiler) and a warm miss from the warm index (:mod:`.index`).

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

:func:`counters` tells what this process's misses took from the cache: specializations loaded
(and how many through the warm index), compiled, entries stored, bad entries removed, untrusted
files refused.

The file format, the key's ingredients and the integrity rules are described in docs/cache.md.
"""

from __future__ import annotations

from .cli import main
from .entry import (
    ENTRY_SUFFIX,
    FORMAT_VERSION,
    CorruptEntry,
    Entry,
    decode_entry,
    encode_entry,
    entry_path,
    read_entry,
)
from .index import INDEX_FORMAT, decode_index_record, warm_lookup, warm_store
from .key import Uncacheable, entry_key, key_document, toolchain_fingerprint
from .settings import always_compile, cache_dir, counters, default_cache_dir, enabled
from .store import (
    CachedKernel,
    atomic_write,
    clear,
    compile_and_store,
    discard,
    export_entries,
    import_entries,
    is_cached,
    iter_entry_files,
    load_or_compile,
    prune,
    scan,
)

__all__ = [
    "CachedKernel",
    "CorruptEntry",
    "ENTRY_SUFFIX",
    "Entry",
    "FORMAT_VERSION",
    "INDEX_FORMAT",
    "Uncacheable",
    "always_compile",
    "atomic_write",
    "cache_dir",
    "clear",
    "compile_and_store",
    "counters",
    "decode_entry",
    "decode_index_record",
    "default_cache_dir",
    "discard",
    "enabled",
    "encode_entry",
    "entry_key",
    "entry_path",
    "export_entries",
    "import_entries",
    "is_cached",
    "iter_entry_files",
    "key_document",
    "load_or_compile",
    "main",
    "prune",
    "read_entry",
    "scan",
    "toolchain_fingerprint",
    "warm_lookup",
    "warm_store",
]
