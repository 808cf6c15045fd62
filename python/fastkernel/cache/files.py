"""Files of the kernel cache directory: what is trusted, and how it is read and written.

The cache directory holds binaries that fastkernel loads and launches, so whoever can write it
can run code on the GPU in this user's processes. It is therefore private to the user: created
with mode 0700 (files 0600), and a directory or file in it that another user owns, or that group
or others may write, is not used (the caller compiles instead and says so once). Inside a
trusted directory the remaining risks are damage (torn writes, crashes, full disks, bit flips)
and mistakes (copied or renamed files), which the callers' checksums and key checks catch.

Every read opens the file without following a symbolic link, requires a regular file (so a
FIFO, a device or /dev/zero is never read) and caps its size before reading. Every write goes
to a fresh temporary file in the same directory, is flushed to disk and renamed over the target
(``os.replace``), so a reader sees the old file or the new one, never a torn one; directories on
the way are created 0700 and must be real directories, not links to elsewhere.

Ownership and mode checks apply on POSIX systems; elsewhere only the file-type, link and size
rules apply.
"""

from __future__ import annotations

import errno
import os
import pathlib
import secrets
import stat
from collections.abc import Iterator

__all__ = [
    "UntrustedPath",
    "trust_problem",
    "usable_root",
    "ensure_dir",
    "check_dirs",
    "read_file",
    "write_file",
    "walk_files",
]

_POSIX = os.name == "posix"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class UntrustedPath(OSError):
    """A path in the cache that must not be used: not a regular file or directory, a symbolic
    link, owned by another user, writable by group or others, or over the size limit."""


def trust_problem(st: os.stat_result) -> str | None:
    """Why a file or directory with status ``st`` is not trusted, or None: it must belong to this
    process's effective user and not be writable by group or others (POSIX; None elsewhere)."""
    if not _POSIX:
        return None
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"it is writable by {'group and others' if st.st_mode & stat.S_IWOTH else 'group'} "
            f"(mode {stat.S_IMODE(st.st_mode):03o})"
        )
    return None


def usable_root(root: pathlib.Path) -> str | None:
    """Why cache directory ``root`` cannot be used, or None. Creates it (mode 0700, parents as
    needed) when missing; ``root`` itself may be a symbolic link the user made (its target is
    checked)."""
    try:
        try:
            st = os.stat(root)  # one system call where the directory exists, as it mostly does
        except FileNotFoundError:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(root)
    except OSError as exc:
        return f"it cannot be created or read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    return trust_problem(st)


def _check_dir(path: str | pathlib.Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(errno.ENOTDIR, "not a directory (a link, or a file)", str(path))
    problem = trust_problem(st)
    if problem is not None:
        raise UntrustedPath(errno.EPERM, problem, str(path))


def check_dirs(root: str | pathlib.Path, *parts: str) -> None:
    """Check that each directory below ``root`` on the way to ``root/parts...`` is a real,
    trusted directory. Raises FileNotFoundError when one is missing, UntrustedPath otherwise.
    (Joined as strings: every read of the cache passes here, warm starts included.)"""
    path = os.fspath(root)
    for part in parts:
        path = os.path.join(path, part)
        _check_dir(path)


def ensure_dir(root: str | os.PathLike[str], *parts: str) -> pathlib.Path:
    """``root/parts...``, each directory below ``root`` created with mode 0700 when missing and
    checked as :func:`check_dirs` does. Raises UntrustedPath, or OSError when one cannot be
    made."""
    path = pathlib.Path(root)
    for part in parts:
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        _check_dir(path)
    return path


def read_file(
    path: str | os.PathLike[str], limit: int, trusted: bool = True
) -> tuple[bytes, os.stat_result]:
    """The bytes of regular file ``path`` (at most ``limit``) and its status, read without
    following a symbolic link. With ``trusted``, the file must also pass :func:`trust_problem`
    (inside the cache); without it (a directory being imported) only the type and size rules
    apply.

    Raises
    ------
    FileNotFoundError
        No such file.
    UntrustedPath
        A symbolic link, not a regular file, untrusted, or over ``limit`` bytes.
    OSError
        The file cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | _BINARY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPath(errno.ELOOP, "a symbolic link", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(errno.EINVAL, "not a regular file", str(path))
        problem = trust_problem(st) if trusted else None
        if problem is not None:
            raise UntrustedPath(errno.EPERM, problem, str(path))
        if st.st_size > limit:
            raise UntrustedPath(
                errno.EFBIG, f"{st.st_size} bytes, over the limit of {limit}", str(path)
            )
        chunks = []
        remaining = st.st_size + 1  # one more byte shows a file that grew while read
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) != st.st_size:
            raise UntrustedPath(errno.EIO, "it changed size while it was read", str(path))
        return data, st
    finally:
        os.close(fd)


def _fsync_dir(directory: pathlib.Path) -> None:
    if not _POSIX:
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one: a fresh
    temporary file in the same directory (created exclusively, never through a link) with
    ``mode`` (less the umask), fsync, ``os.replace`` (atomic on POSIX and Windows within one file
    system), then fsync of the directory so that the rename survives a crash. The directory must
    exist (:func:`ensure_dir`)."""
    path = pathlib.Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _raise(exc: OSError) -> None:
    raise exc


def walk_files(
    top: pathlib.Path, suffix: str, max_depth: int, max_files: int, strict: bool = False
) -> Iterator[pathlib.Path]:
    """Regular files named ``*suffix`` under ``top`` (itself included at depth 0), sorted per
    directory, without following symbolic links (to files or directories) and without
    descending more than ``max_depth`` levels. Raises UntrustedPath once more than ``max_files``
    would be returned; with ``strict``, the OSError of a directory it cannot read (else such a
    directory is passed over, as ``os.walk`` does)."""
    top = pathlib.Path(top)
    found = 0
    for directory, dirs, files in os.walk(
        top, onerror=_raise if strict else None, followlinks=False
    ):
        depth = len(pathlib.Path(directory).relative_to(top).parts)
        if depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(suffix):
                continue
            path = pathlib.Path(directory) / name
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
            except OSError:
                continue
            found += 1
            if found > max_files:
                raise UntrustedPath(errno.EFBIG, f"more than {max_files} {suffix} files", str(top))
            yield path
