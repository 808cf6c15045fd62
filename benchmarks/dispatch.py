"""Per-call dispatch cost of fastkernel against the alternatives: ``python benchmarks/dispatch.py``.

Wall-clock time per call over a steady-state loop of many calls of a tiny kernel, after a
warm-up, synchronizing before each clock read; the median of several repeats; every system in
the same process and run, repeats interleaved across systems. The loop is CPU-bound, so it
measures how long a call takes to issue, not how long the kernel runs. What each system and
shape is, and the latest results, are in ``benchmarks/README.md``.

On a GPU it times every shape of :mod:`fkbench.kernels` through each system
(:mod:`fkbench.gpu`). Without one (or with ``--host``) it runs the host-side part against the
recording stand-in driver of ``tests/stand_in_driver`` (:mod:`fkbench.host`); ``--callgrind``
counts instructions per hit under valgrind (:mod:`fkbench.callgrind`). The native loops it
times (``_C.BenchFloor``, ``_C.bench_call_loop``) and the host-testing switch are in builds
configured with ``-DFASTKERNEL_TESTING=ON``, as ``scripts/dev.sh`` builds.

Exit status: 0 on success; 1 when fastkernel's native path did not serve the timed calls; 2
when the run cannot start (a bad option, no testing build, no valgrind for ``--callgrind``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/dispatch.py",
        description="Per-call dispatch cost of fastkernel against raw cuLaunchKernel, Triton, "
        "Inductor's static launcher and CUDA graphs (host-side only without a GPU).",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        metavar="N",
        help="calls per timed loop (default: 10000 on a GPU, 4000 host-side; "
        "hits per shape under --callgrind, default 1000)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="R",
        help="timed loops per system; the median is reported (default: 7 on a GPU, 15 host-side)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="directory for the JSON and PNG (default: benchmarks/results)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer calls and repeats (2000 x 3 on a GPU, 1000 x 5 host-side)",
    )
    parser.add_argument(
        "--host",
        action="store_true",
        help="run the host-side part against the recording stand-in driver even "
        "when a GPU is present",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count instructions per hit under valgrind --tool=callgrind "
        "(host-side, deterministic), with a breakdown by function group",
    )
    parser.add_argument(
        "--keep-dumps",
        default=None,
        metavar="DIR",
        help="with --callgrind, also copy each loop's raw callgrind dump to "
        "DIR/<shape>-<grid>.callgrind, for callgrind_annotate",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the dispatch benchmark with command-line arguments ``argv``; the exit status."""
    opts = build_parser().parse_args(argv)
    for name in ("iterations", "repeats"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            print(f"--{name} must be >= 1", file=sys.stderr)
            return 2
    if opts.keep_dumps is not None and not opts.callgrind:
        print("--keep-dumps needs --callgrind", file=sys.stderr)
        return 2
    from fkbench import common

    if not common.testing_build():
        print(
            "this fastkernel build has no benchmark loops: build it with "
            "-DFASTKERNEL_TESTING=ON (scripts/dev.sh does)",
            file=sys.stderr,
        )
        return 2
    if opts.callgrind:
        from fkbench import callgrind

        return callgrind.run_callgrind(opts, REPO)
    import torch

    if opts.host or not torch.cuda.is_available():
        if not opts.host:
            print(
                "No CUDA GPU is available: timings of launches need a GPU. Running the "
                "host-side part (fastkernel's own cost per hit, against a stand-in driver)."
            )
        from fkbench import host

        return host.run_host(opts, REPO)
    from fkbench import gpu

    return gpu.run_gpu(opts, REPO)


if __name__ == "__main__":
    sys.exit(main())
