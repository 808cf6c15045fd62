"""``python -m fastkernel demo|bench``: the demo (examples checked against torch) and the
dispatch benchmark."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastkernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run example kernels through fastkernel and check them against torch",
                   add_help=False)
    sub.add_parser("bench", help="measure per-call dispatch cost against the alternatives",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from . import demo
        return demo.main(rest)
    from . import bench
    return bench.main(rest)


if __name__ == "__main__":
    sys.exit(main())
