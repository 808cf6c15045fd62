"""``python -m fastkernel run [--stats] [-m] target [args...]``: run a program with every Triton
kernel launch served natively (:func:`fastkernel.patch`), the way ``coverage run`` runs one
under measurement. The target sees the ``sys.argv`` and ``__main__`` it would see when run as
``python target args...`` (or ``python -m target args...``); its exit status is passed through.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def stats_table(stats: dict[str, dict]) -> str:
    """A text table of the kernels that launched: hits, misses and fallbacks with reasons."""
    rows = [
        (name, s) for name, s in sorted(stats.items()) if s["hits"] or s["misses"] or s["fallbacks"]
    ]
    if not rows:
        return "fastkernel: no Triton kernel launched"
    width = max(len("kernel"), *(len(name) for name, _ in rows))
    lines = [f"{'kernel':<{width}}  {'hits':>10}  {'misses':>7}  {'fallbacks':>9}"]
    for name, s in rows:
        lines.append(f"{name:<{width}}  {s['hits']:>10}  {s['misses']:>7}  {s['fallbacks']:>9}")
        for reason, count in sorted(s["fallback_reasons"].items()):
            lines.append(f"{'':<{width}}    {count} x {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastkernel run",
        description="Run a Python program or module with fastkernel.patch() on.",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print at exit, on stderr, every kernel that launched: native hits, "
        "misses (compiles or cache loads), fallbacks and their reasons",
    )
    parser.add_argument(
        "-m",
        dest="module",
        action="store_true",
        help="target is a module name, run as `python -m target`",
    )
    parser.add_argument("target", help="the script (or, with -m, the module) to run")
    parser.add_argument("args", nargs="*", help="its arguments (every word after the target)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # fastkernel's options come before the target; every word after it is the target's own,
    # options included (argparse alone would read a target's `-h` as its own).
    split = next((i for i, word in enumerate(argv) if not word.startswith("-")), len(argv))
    ns = parser.parse_args(argv[: split + 1])
    ns.args = argv[split + 1 :]

    import fastkernel

    fastkernel.patch()
    status: object = 0
    try:
        if ns.module:
            sys.argv = [ns.target, *ns.args]  # run_module puts the module's path in argv[0]
            runpy.run_module(ns.target, run_name="__main__", alter_sys=True)
        else:
            if not os.path.exists(ns.target):
                parser.error(f"no such file: {ns.target}")
            sys.argv = [ns.target, *ns.args]
            sys.path[0] = os.path.dirname(os.path.abspath(ns.target))  # as `python script.py`
            runpy.run_path(ns.target, run_name="__main__")
    except SystemExit as exc:
        status = exc.code
    finally:
        if ns.stats:
            sys.stdout.flush()
            print(stats_table(fastkernel.stats()), file=sys.stderr)
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    print(status, file=sys.stderr)  # sys.exit("message"), as the interpreter reports it
    return 1
