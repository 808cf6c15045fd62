"""``python -m fastkernel demo|cache|run|bundle``: the demo (examples checked against torch), the
on-disk kernel cache (``cache info|list|clear|prune|export|import``), ``run [--stats] [-m|-c]
target [args...]``, a program run with every Triton launch native, and ``bundle DIR``, an
exported bundle checked as C++ loads it. The dispatch benchmark is the repository's
``benchmarks/dispatch.py``."""

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
    bundle = sub.add_parser(
        "bundle",
        help="check an exported kernel bundle as C++'s Bundle::load does and list its entries",
    )
    bundle.add_argument("directory", help="the bundle directory (manifest.txt and its cubins)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bundle":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _check_bundle(args.directory)
    if args.command == "demo":
        from . import demo

        return demo.main(rest)
    from . import cache

    return cache.main(rest)


def _check_bundle(directory: str) -> int:
    """``python -m fastkernel bundle DIR``: 0 and the entries when the bundle loads, 1 and the
    loader's message when it is refused or cannot be read."""
    from . import BundleError, check_bundle

    try:
        entries = check_bundle(directory)
    except (OSError, BundleError) as exc:
        print(
            f"fastkernel: bundle refused: {str(exc).removeprefix('fastkernel: ')}", file=sys.stderr
        )
        return 1
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    print(f"{directory}: {count}, each checked as Bundle::load checks it")
    for entry in entries:
        print(f"  {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
