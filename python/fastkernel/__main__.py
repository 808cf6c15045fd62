"""``python -m fastkernel demo|cache|run``: the demo (examples checked against torch), the on-disk
kernel cache (``cache info|list|clear|prune|export|import``), and ``run [--stats] [-m|-c] target
[args...]``, a program run with every Triton launch native. The dispatch benchmark is the
repository's ``benchmarks/dispatch.py``."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the target's arguments are its own: no parsing of them here
        from . import _run

        return _run.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fastkernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo",
        help="run example kernels through fastkernel and check them against torch",
        add_help=False,
    )
    sub.add_parser(
        "cache",
        help="inspect, clear, prune, export or import the on-disk kernel cache",
        add_help=False,
    )
    sub.add_parser(
        "run",
        help="run a script or module with every Triton kernel launch native (fastkernel.patch())",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from . import demo

        return demo.main(rest)
    from . import cache

    return cache.main(rest)


if __name__ == "__main__":
    sys.exit(main())
