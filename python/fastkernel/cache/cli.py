"""``python -m fastkernel cache info|list|clear|prune|export|import``."""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import time

import triton

from .entry import FORMAT_VERSION
from .settings import always_compile, cache_dir, default_cache_dir, enabled
from .store import (
    STALE_TEMP_SECONDS,
    check_older_than,
    clear,
    export_entries,
    import_entries,
    prune,
    scan,
    temp_files,
)

log = logging.getLogger("fastkernel.cache")


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


def _seconds(text: str) -> float:
    """``--older-than``'s value: a number of seconds that :func:`prune` takes."""
    try:
        return check_older_than(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0 seconds, not {text!r}") from exc


def main(argv: list[str] | None = None) -> int:
    """``python -m fastkernel cache info|list|clear|prune|export DIR|import DIR``.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after ``cache`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: 0, or 1 after printing ``error: ...`` for a failed action (an
        unusable directory, a file that could not be removed or written).

    Raises
    ------
    SystemExit
        From argparse, status 2, for arguments it does not accept (and 0 for ``--help``).
    """
    try:
        default = str(default_cache_dir())
    except RuntimeError as exc:
        default = f"unknown: {exc}"
    parser = argparse.ArgumentParser(
        prog="python -m fastkernel cache",
        description="Inspect, clear, prune, export and import fastkernel's on-disk kernel cache "
        f"(FASTKERNEL_CACHE_DIR, default {default}).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("info", help="where the cache is, its state, entries and size")
    sub.add_parser("list", help="one line per entry: key, kernel, symbol, target, size, age")
    sub.add_parser(
        "clear",
        help="remove every entry, warm index record, tuning record, toolchain memo, lock file "
        "and temporary file (other files stay)",
    )
    p = sub.add_parser(
        "prune",
        help="remove the temporary files that writers killed mid-write left (entries stay)",
    )
    p.add_argument(
        "--older-than",
        type=_seconds,
        default=STALE_TEMP_SECONDS,
        metavar="SECONDS",
        help="only temporaries unchanged for this long (default %(default).0f: a write in "
        "progress is left alone)",
    )
    p = sub.add_parser("export", help="copy every entry into DIR (to ship to other machines)")
    p.add_argument("dir", type=pathlib.Path)
    p = sub.add_parser("import", help="install the entries in DIR that match this toolchain")
    p.add_argument("dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return _run(args, cache_dir())
    except (RuntimeError, OSError) as exc:  # no home directory, unreadable or unwritable paths
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, root: pathlib.Path) -> int:
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
        indexed = list((root / "index").glob("*/*.json"))
        print(f"warm index {len(indexed)} record{'' if len(indexed) == 1 else 's'}")
        tuned = list((root / "autotune").glob("*/*.json"))
        print(f"tunings    {len(tuned)} autotune result{'' if len(tuned) == 1 else 's'}")
        temps = temp_files(root)
        if temps:
            print(
                f"temporary  {len(temps)} (writes in progress, or left by killed writers: "
                f"`cache prune` removes those)"
            )
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
    if args.action == "prune":
        count = prune(root, args.older_than)
        print(
            f"removed {count} temporary file{'' if count == 1 else 's'} of interrupted writes "
            f"from {root}"
        )
        return 0
    if args.action == "export":
        count = export_entries(args.dir, root)
        print(f"exported {_entries(count)} to {args.dir}")
        return 0
    imported, skipped = import_entries(args.dir, root)
    skipped_text = f", skipped {skipped}" if skipped else ""
    print(f"imported {_entries(imported)} into {root}{skipped_text}")
    return 0
