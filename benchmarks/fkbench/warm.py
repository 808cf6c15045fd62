"""Warm start: from process start to the first launch of a kernel, in fresh processes.

(a) ``fastkernel_cold``: fastkernel with empty fastkernel and Triton caches (Triton compiles);
(b) ``fastkernel_warm``: fastkernel again, its disk cache now holding the binary;
(c) ``triton_warm``: Triton's own ``kernel[grid]`` with Triton's disk cache warm (GPU only: its
    launcher needs the CUDA runtime).

Each child reports the wall-clock moment its first launch returned (synchronized on a GPU) and
the duration of that first call alone, how often it called ``triton.compile`` (for Triton
itself a warm cache still goes through ``triton.compile``, which then reads its cache), and how
many specializations fastkernel registered through its warm index
(``fastkernel.cache.counters()["warm"]``: 1 in (b) when its first call skipped Triton's binder
as well as the compiler).

Host-side, the child maps the stand-in driver library before the call and reports how long
that took (``driver_map_s``): a GPU process has ``libcuda.so.1`` mapped by the time torch has
made its CUDA tensors (the CUDA runtime opens it), so mapping it is no part of a GPU first call.
fastkernel's own opening of the driver (its symbol lookups, ``cuInit``) stays in the call.
Python's and torch's import cost is in every process-start figure alike; the first-call figure is what differs between the systems.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# The child: imports, one launch of the add-2 benchmark kernel, a JSON line.
_CHILD = r"""
import ctypes, json, os, sys, time
system, host, stream = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
sys.path.insert(0, sys.argv[4])  # the benchmarks directory, for fkbench.kernels
import torch
import triton
import triton.compiler
import triton.compiler.compiler
compiles = []
_real_compile = triton.compiler.compiler.compile
def _counting_compile(*a, **k):
    compiles.append(1)
    return _real_compile(*a, **k)
triton.compile = triton.compiler.compile = triton.compiler.compiler.compile = _counting_compile
from fastkernel import _C, FastKernel, cache
from fkbench.kernels import add2_kernel, N, BLOCK
driver_map = 0.0
if host:
    _C._testing.set_host_testing(True, 0, stream)
    mapped = time.perf_counter()
    ctypes.CDLL(os.environ.get("FASTKERNEL_CUDA_DRIVER", "libcuda.so.1"))
    driver_map = time.perf_counter() - mapped
device = "cpu" if host else "cuda"
x0, x1 = (torch.zeros(N, device=device) for _ in range(2))
kernel = FastKernel(add2_kernel) if system == "fastkernel" else add2_kernel
start = time.perf_counter()
kernel[(triton.cdiv(N, BLOCK),)](x0, x1, N, BLOCK)
if not host:
    torch.cuda.synchronize()
first = time.perf_counter() - start
print(json.dumps({"done_wall": time.time(), "first_call_s": first, "driver_map_s": driver_map,
                  "triton_compiles": len(compiles), "cache": cache.counters()}))
"""


def _run_child(system: str, host: bool, stream: int, env: dict[str, str]) -> dict[str, Any]:
    start = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            system,
            "1" if host else "0",
            str(stream),
            str(pathlib.Path(__file__).resolve().parents[1]),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"warm-start child ({system}) failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "start_to_first_launch_s": report["done_wall"] - start,
        "first_call_s": report["first_call_s"],
        "driver_map_s": report["driver_map_s"],
        "triton_compiles": report["triton_compiles"],
        "warm_index_loads": report["cache"]["warm"],
    }


# The import child: how long `import torch, triton` takes, then `import fastkernel` after it.
_IMPORT_CHILD = r"""
import json, time
start = time.perf_counter()
import torch, triton
middle = time.perf_counter()
import fastkernel
end = time.perf_counter()
print(json.dumps({"torch_triton_s": middle - start, "fastkernel_s": end - middle}))
"""


def import_cost(repeats: int = 5) -> dict[str, float]:
    """Milliseconds to import torch and Triton, and what ``import fastkernel`` adds after them,
    each the median over ``repeats`` fresh processes."""
    samples = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_CHILD], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"import child failed:\n{done.stderr[-3000:]}")
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "torch_triton_ms": 1e3 * statistics.median(s["torch_triton_s"] for s in samples),
        "fastkernel_ms": 1e3 * statistics.median(s["fastkernel_s"] for s in samples),
        "repeats": repeats,
    }


def measure(
    host: bool, repeats: int = 3, stream: int = 0, driver_library: str | None = None
) -> dict[str, Any]:
    """Run the three systems in fresh processes with private, initially empty caches.

    Parameters
    ----------
    host : bool
        Launch against the recording stand-in driver (``driver_library``) with CPU tensors; then
        (c) is absent (Triton's launcher needs a GPU).
    repeats : int
        Runs of (b) and (c); the median is reported ((a) runs once: only one run is cold).
    stream : int
        The stream handle host-side launches use.

    Returns
    -------
    dict
        Per system: medians of ``start_to_first_launch_s``, ``first_call_s`` and
        ``driver_map_s`` (0 on a GPU), every run's ``first_call_samples_s``,
        ``triton_compiles`` and ``warm_index_loads``; ``absent``: system -> why;
        ``warm_speedup``: (c)'s first call over (b)'s (None host-side); ``import``:
        :func:`import_cost`.
    """
    with tempfile.TemporaryDirectory(prefix="fastkernel-warm-") as tmp:
        env = dict(
            os.environ,
            FASTKERNEL_CACHE_DIR=str(pathlib.Path(tmp) / "fastkernel"),
            TRITON_CACHE_DIR=str(pathlib.Path(tmp) / "triton"),
            PYTHONHASHSEED="0",
        )
        if host and driver_library:
            env["FASTKERNEL_CUDA_DRIVER"] = driver_library
        runs: dict[str, list] = {"fastkernel_cold": [_run_child("fastkernel", host, stream, env)]}
        runs["fastkernel_warm"] = [
            _run_child("fastkernel", host, stream, env) for _ in range(repeats)
        ]
        absent = {}
        if host:
            absent["triton_warm"] = "needs a GPU (Triton's launcher needs the CUDA runtime)"
        else:
            runs["triton_warm"] = [_run_child("triton", host, stream, env) for _ in range(repeats)]
    result: dict[str, Any] = {"absent": absent, "repeats": repeats}
    for system, samples in runs.items():
        result[system] = {
            "start_to_first_launch_s": statistics.median(
                s["start_to_first_launch_s"] for s in samples
            ),
            "first_call_s": statistics.median(s["first_call_s"] for s in samples),
            "first_call_samples_s": [s["first_call_s"] for s in samples],
            "driver_map_s": statistics.median(s["driver_map_s"] for s in samples),
            "triton_compiles": [s["triton_compiles"] for s in samples],
            "warm_index_loads": [s["warm_index_loads"] for s in samples],
        }
    result["import"] = import_cost(5 if repeats > 1 else 3)
    warm, triton_warm = result.get("fastkernel_warm"), result.get("triton_warm")
    result["warm_speedup"] = (
        triton_warm["first_call_s"] / warm["first_call_s"] if warm and triton_warm else None
    )
    return result


def print_report(result: dict[str, Any]) -> None:
    print("\nwarm start (fresh processes; s = from process start, first call = the call alone):")
    for system in ("fastkernel_cold", "fastkernel_warm", "triton_warm"):
        if system in result:
            r = result[system]
            print(
                f"  {system:18}  start->first launch {r['start_to_first_launch_s']:7.3f} s   "
                f"first call {1e3 * r['first_call_s']:9.2f} ms   Triton compiles "
                f"{r['triton_compiles']}   loaded through the warm index "
                f"{r['warm_index_loads']}"
            )
            if r["driver_map_s"]:
                print(
                    f"  {'':18}  (mapping the stand-in driver before the call took "
                    f"{1e3 * r['driver_map_s']:.2f} ms)"
                )
        else:
            print(f"  {system:18}  absent: {result['absent'][system]}")
    imports = result["import"]
    print(
        f"  import torch, triton {imports['torch_triton_ms']:.0f} ms; import fastkernel after "
        f"them {imports['fastkernel_ms']:.1f} ms (median of {imports['repeats']} processes; "
        f"target <= 30 ms)"
    )
    if result["warm_speedup"] is not None:
        print(
            f"  Triton warm first call / fastkernel warm first call = "
            f"{result['warm_speedup']:.1f} (target >= 20)"
        )
