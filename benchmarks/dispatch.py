"""Dispatch-cost benchmark runner: ``python benchmarks/dispatch.py [options]``.

The same as ``python -m fastkernel bench [options]`` (see ``fastkernel.bench``), with the
checkout this file lives in given as ``--repo``, so that the host-side part finds the recording
stand-in driver in ``tests/stand_in_driver`` and results land in ``benchmarks/results``.
"""

from __future__ import annotations

import pathlib
import sys

from fastkernel import bench

REPO = pathlib.Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    """Run ``fastkernel.bench.main`` with ``--repo`` set to this checkout unless given."""
    if not any(a == "--repo" or a.startswith("--repo=") for a in argv):
        argv = [*argv, "--repo", str(REPO)]
    return bench.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
