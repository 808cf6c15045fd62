"""Many processes, one cache: N processes cold-start at once on one empty kernel cache, each
launching the same specializations, with the per-entry cross-process lock and without it
(``FASTKERNEL_CACHE_LOCK=0``). Reports Triton compiles in total and the wall time until the last
process is done, side by side in one run. Host-side: launches go to the recording stand-in
driver (tests/stand_in_driver), so this needs no GPU; Triton's compiles are real.

    python benchmarks/cache_contention.py [--processes 8] [--rounds 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

#: Run by each process: waits for a common start, launches three specializations of two kernels
#: and prints how many times Triton's compiler ran in it and whether every launch was native.
WORKER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import torch
    from fastkernel import _C, fastkernel
    from fastkernel import _triton_abi as abi
    import kernels
    compiles = []
    real = abi.compile_specialization
    def counting(jit_fn, target, spec):
        compiles.append(jit_fn.__name__)
        return real(jit_fn, target, spec)
    abi.compile_specialization = counting
    _C._testing.set_host_testing(True, 0, 0x5EED5)
    x = torch.randn(80)
    open(sys.argv[1], "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.002)
    add, scale = fastkernel(kernels.add_kernel), fastkernel(kernels.scale_in_place_kernel)
    add[(1,)](x, x, x, 64, BLOCK=64)
    add[(1,)](x, x, x[1:], 64, BLOCK=64)
    scale[(1,)](x, 64, BLOCK=64)
    stats = [k.stats() for k in (add, scale)]
    print(json.dumps({{"compiles": len(compiles),
                      "native": all(s["fallbacks"] == 0 for s in stats)}}))
""")
SPECIALIZATIONS = 3


def one_round(processes: int, lock: bool, driver: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fastkernel-contention-") as tmp:
        tmp_path = pathlib.Path(tmp)
        env = {
            **os.environ,
            "FASTKERNEL_CACHE_DIR": str(tmp_path / "cache"),
            "FASTKERNEL_CUDA_DRIVER": driver,
            "FASTKERNEL_CACHE_LOCK": "1" if lock else "0",
            # Triton's own cache would make every compile after the first cheap: off here,
            # so each process that compiles pays a whole compile, as on a fresh machine.
            "TRITON_CACHE_DIR": str(tmp_path / "triton-cache-%d"),
        }
        script = WORKER.format(tests=str(TESTS))
        go = tmp_path / "go"
        procs, ready = [], []
        for i in range(processes):
            ready.append(tmp_path / f"ready{i}")
            proc_env = dict(env, TRITON_CACHE_DIR=str(tmp_path / f"triton-cache-{i}"))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", script, str(ready[-1]), str(go)],
                    env=proc_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        while not all(r.exists() for r in ready):
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        start = time.perf_counter()
        go.touch()
        outputs = [p.communicate(timeout=1800) for p in procs]
        wall = time.perf_counter() - start
        results = []
        for p, (stdout, stderr) in zip(procs, outputs):
            if p.returncode != 0:
                raise RuntimeError(f"a worker failed:\n{stderr}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
        return {
            "compiles": sum(r["compiles"] for r in results),
            "wall_s": wall,
            "all_native": all(r["native"] for r in results),
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per mode, interleaved")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the results here")
    opts = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    from stand_in_driver.recording import build_recording_driver

    driver = str(build_recording_driver())
    runs: dict[str, list[dict[str, float]]] = {"lock": [], "no lock": []}
    for _ in range(opts.rounds):
        for mode in runs:
            runs[mode].append(one_round(opts.processes, mode == "lock", driver))
    print(
        f"{opts.processes} processes, {SPECIALIZATIONS} specializations, one empty cache "
        f"({opts.rounds} round{'s' if opts.rounds > 1 else ''} per mode):"
    )
    summary = {}
    for mode, rounds in runs.items():
        compiles = statistics.median(r["compiles"] for r in rounds)
        wall = statistics.median(r["wall_s"] for r in rounds)
        native = all(r["all_native"] for r in rounds)
        summary[mode] = {
            "compiles": compiles,
            "wall_s": wall,
            "all_native": native,
            "rounds": rounds,
        }
        print(
            f"  {mode:8} Triton compiles {compiles:5.0f}   wall {wall:6.2f} s   "
            f"every launch native: {native}"
        )
    if opts.out:
        opts.out.write_text(
            json.dumps(
                {
                    "processes": opts.processes,
                    "specializations": SPECIALIZATIONS,
                    "results": summary,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
