"""How ``fastkernel.export`` writes a bundle's files, so that a reader, or an export killed at any
point, finds a whole bundle: the one replaced or the new one, never a mix.

Cubins are named by their content, so writing the new ones touches no file the manifest being
replaced names; the manifest is then replaced atomically; last, the cubins that no manifest
names any more are removed. A reader that read the replaced manifest and finds one of its
cubins gone reads the new manifest (``Bundle::load``, csrc/bundle.cpp). The standard library
and :mod:`fastkernel.cache.files` only (no torch), so that the crash test
(``scripts/reliability/crash_writers.py``) kills processes that run this very code.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re

from .cache import files as _fs

#: The manifest's file name in a bundle directory (csrc/bundle.cpp).
MANIFEST = "manifest.txt"

#: The file names ``export`` gives cubins: the symbol, then the first 16 hex digits of the
#: cubin's SHA-256.
CUBIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*-[0-9a-f]{16}\.cubin")

#: ``Bundle::load``'s limit on a manifest's size (csrc/bundle.cpp, kMaxManifestBytes).
MAX_MANIFEST_BYTES = 16 << 20


def cubin_name(symbol: str, cubin: bytes) -> str:
    """The file name of ``cubin``, the binary of kernel ``symbol``: ``<symbol>-<16 hex>.cubin``."""
    return f"{symbol}-{hashlib.sha256(cubin).hexdigest()[:16]}.cubin"


def named_cubins(manifest: pathlib.Path) -> set[str]:
    """The cubin names an existing manifest's entry lines give, read as untrusted text: plain
    file names ending in ``.cubin`` only; a manifest that is missing, not a regular file (a
    link, a FIFO), unreadable or over ``Bundle::load``'s size limit gives none."""
    try:
        text = _fs.read_file(manifest, MAX_MANIFEST_BYTES, trusted=False)[0]
    except OSError:
        return set()
    names = set()
    for line in text.decode("utf-8", "replace").splitlines():
        fields = line.split(" ")
        if len(fields) > 2 and fields[0] == "entry" and fields[2].endswith(".cubin"):
            if "/" not in fields[2] and fields[2] not in (".", ".."):
                names.add(fields[2])
    return names


def write(root: pathlib.Path, manifest: bytes, cubins: dict[str, bytes]) -> None:
    """Write bundle directory ``root`` (which must exist): ``cubins`` (file name -> bytes, each
    named by :func:`cubin_name`), then ``manifest`` over any earlier one, then remove the cubins
    that no manifest names any more: those the replaced manifest named and those an export
    killed before its manifest left. Files are written as any the user creates (mode 0666
    less the umask). One writer at a time (the caller holds a lock). Raises OSError."""
    stale = named_cubins(root / MANIFEST)
    for name, data in cubins.items():
        _fs.write_file(root / name, data, 0o666)
    _fs.write_file(root / MANIFEST, manifest, 0o666)
    with os.scandir(root) as it:
        stale.update(e.name for e in it if CUBIN_NAME.fullmatch(e.name))
    for name in stale - cubins.keys():
        try:
            os.unlink(root / name)
        except OSError:  # gone already, or not a file: no manifest names it either way
            pass
