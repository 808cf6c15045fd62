"""Where the kernel cache lives and whether it is used: ``FASTKERNEL_CACHE_DIR``,
``FASTKERNEL_CACHE``, ``FASTKERNEL_ALWAYS_COMPILE`` (read at each call), the usable root with its
trust checks, the once-per-cause log of why the cache was not used, and the process's counts
of what its misses took from the cache (:func:`counters`)."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import Any

from .. import _env, _locks
from . import files as _fs

log = logging.getLogger("fastkernel.cache")


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

    Raises
    ------
    RuntimeError
        The home directory is needed and cannot be determined (no ``HOME`` and no password
        entry for the user, as in containers run under an arbitrary user id).
    """
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(pathlib.Path.home() / "AppData" / "Local")
        return pathlib.Path(base) / "fastkernel" / "Cache"
    if sys.platform == "darwin":
        return pathlib.Path.home() / "Library" / "Caches" / "fastkernel"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return base / "fastkernel"


def cache_dir() -> pathlib.Path:
    """The cache directory in effect now: ``FASTKERNEL_CACHE_DIR`` if set (``~`` and ``~user``
    expanded), else :func:`default_cache_dir`. Read from the environment at each call. Raises
    RuntimeError when a home directory it needs cannot be determined."""
    configured = os.environ.get("FASTKERNEL_CACHE_DIR", "")
    return pathlib.Path(configured).expanduser() if configured else default_cache_dir()


def enabled() -> bool:
    """False when ``FASTKERNEL_CACHE=0`` (or ``false``, ``off``, ``no``) turns the disk cache
    off."""
    return _env.flag("FASTKERNEL_CACHE", True)


def always_compile() -> bool:
    """True when ``FASTKERNEL_ALWAYS_COMPILE=1``: compile on every miss, still write the entry."""
    return _env.flag("FASTKERNEL_ALWAYS_COMPILE")


_logged: set = set()


def log_once(level: int, tag: tuple[Any, ...], msg: str, *args: Any) -> bool:
    """Log ``msg`` unless a message with ``tag`` was logged before; whether it logged."""
    if tag in _logged:
        return False
    _logged.add(tag)
    log.log(level, msg, *args)
    return True


def usable_root() -> pathlib.Path | None:
    """The cache directory in effect, created private (0700) if missing; None when the cache is
    off, or when the directory is not trusted (another user's, or writable by group or others:
    whoever can write it could make this process launch their code), then warned once."""
    if not enabled():
        return None
    try:
        root = cache_dir()
    except RuntimeError as exc:  # pathlib's "Could not determine home directory", and ~user
        log_once(
            logging.WARNING,
            ("no-root", str(exc)),
            "fastkernel: cannot locate the kernel cache: %s; kernels still run, compiled in "
            "each process (set FASTKERNEL_CACHE_DIR or XDG_CACHE_HOME to an absolute path)",
            exc,
        )
        return None
    problem = _fs.usable_root(root)
    if problem is not None:
        hint = (
            "set FASTKERNEL_CACHE_DIR to a directory you can write"
            if problem.startswith("it cannot") or problem.startswith("it is not a")
            else f"make it private to you (chmod 700 {root}) or set FASTKERNEL_CACHE_DIR"
        )
        log_once(
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


def warn_untrusted(path: str | os.PathLike[str], exc: OSError) -> None:
    """Warns, once per path, that a file is not used because its path is not trusted (and
    counts the path)."""
    if log_once(
        logging.WARNING,
        ("untrusted", str(path)),
        "fastkernel: not using %s: %s; compiling instead",
        path,
        exc.strerror or exc,
    ):
        count("untrusted")


# -- counters -------------------------------------------------------------------------------

#: What :func:`counters` counts, in the order it reports them.
COUNTERS = ("loaded", "warm", "compiled", "stored", "removed", "untrusted")

_counts = dict.fromkeys(COUNTERS, 0)
_counts_lock = _locks.lock()


def count(event: str) -> None:
    """Add one to counter ``event`` (one of :data:`COUNTERS`)."""
    with _counts_lock:
        _counts[event] += 1


def counters() -> dict[str, int]:
    """What this process's kernel misses took from the disk cache and gave it, since the process
    started (a forked child starts from its parent's counts).

    Returns
    -------
    dict of str to int
        ``loaded``: specializations registered from a cache entry (their binary read from disk,
        not compiled); ``warm``: of those, the ones whose specialization came from the warm
        index (Triton's binder did not run either); ``compiled``: specializations fastkernel had
        Triton compile (``triton.compile``: an entry missing, bad or untrusted, the cache off,
        ``FASTKERNEL_ALWAYS_COMPILE``; a compile of Triton's own launch path, or of a parallel
        autotune worker process, is not counted here); ``stored``: entries written;
        ``removed``: bad entries removed (damaged, foreign, of another toolchain, or unusable
        as a registration); ``untrusted``: paths of entries, warm index records and tuning
        records not used because they are not trusted (each path once, as it is warned). A
        cache directory that is refused as a whole counts nothing here: its misses count as
        ``compiled``.
    """
    with _counts_lock:
        return dict(_counts)
