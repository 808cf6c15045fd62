"""The dispatch benchmark on a GPU: every system on every shape of :mod:`fkbench.kernels`.

Systems (labels in :data:`fkbench.common.SYSTEM_LABELS`): ``floor``, a C++ loop of raw
``cuLaunchKernel`` on Triton's cubin with the parameter bytes Triton passes
(``fastkernel._C.BenchFloor``); ``triton_run``, Triton's ``CompiledKernel.run`` called directly,
as ``JITFunction.run`` calls it; ``triton``, Triton's ``kernel[grid](...)``; ``fastkernel`` and
``fastkernel_callable`` and ``fastkernel_called``, ``@fastkernel`` with a tuple grid, a
callable grid it runs as a grid program, and one it calls in Python; the tutorial
grid (``triton.cdiv``) with and without fastkernel's host helpers; ``fastkernel_autotuned``;
``fastkernel_cpp``, the C++ ``Bundle::launch``; ``inductor_static``, torch Inductor's static CUDA
launcher where the installed torch has a usable one; ``cuda_graph``, a CUDA graph replay of the
same launches, per launch (the amortized reference). It also times a miss that only registers a
new specialization from Triton's on-disk cache, the first call of a freshly decorated kernel,
a warm-cache first call in a fresh process (:mod:`fkbench.warm`), and Liger-Kernel ops called
through their own Python functions, unpatched, patched and (a decoder step) as a CUDA graph
(:mod:`fkbench.library`).
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

from . import common


def run_gpu(opts: argparse.Namespace, repo: pathlib.Path | None) -> int:
    """Time every system on every shape on the current CUDA device; write the report."""
    import torch

    from fastkernel.kernel import FastKernel

    from .kernels import SHAPES, autotuned_call, callable_grid, called_grid

    iterations, repeats = common.mode_counts(
        opts, common.GPU_QUICK if opts.quick else common.GPU_DEFAULTS
    )
    cold_repeats = common.COLD_REPEATS_QUICK if opts.quick else common.COLD_REPEATS
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    sync = torch.cuda.synchronize
    env = common.environment("gpu", device)
    print(
        f"fastkernel dispatch benchmark on {env['device']} (driver {env['driver_version']}, "
        f"CUDA {env['cuda_version']}); {iterations} calls x {repeats} repeats per system"
    )

    shape_results: dict[str, dict[str, list[float]]] = {}
    shape_info: dict[str, dict[str, int]] = {}
    cold: dict[str, dict[str, float]] = {}
    memory: dict[str, dict[str, int]] = {}
    absent: dict[str, str] = {}
    fast_path: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fastkernel-bench-") as scratch_dir:
        for shape in SHAPES:
            print(f"  {shape.name}: compiling and warming up", flush=True)
            args = shape.make_args("cuda")
            grid = shape.grid
            jit = shape.kernel
            compiled = jit[grid](*args)  # compiles (or loads from Triton's cache) and launches
            fk = FastKernel(jit)
            fk[grid](*args)
            sync()

            systems: dict[str, common.Timed] = {
                "floor": common.floor_timed(compiled, args, grid, device, stream),
                **common.triton_systems(jit, compiled, grid, args, stream),
                "fastkernel": common.Timed(common.call_loop(fk, grid, args)),
                "fastkernel_callable": common.Timed(
                    common.call_loop(fk, callable_grid(shape), args)
                ),
                "fastkernel_called": common.Timed(common.call_loop(fk, called_grid(shape), args)),
                **common.tutorial_grid_systems(fk, shape, args),
                "fastkernel_handle": common.handle_timed(fk, grid, args),
            }
            tuned = autotuned_call(shape, "cuda")
            if tuned is not None:
                systems["fastkernel_autotuned"] = common.Timed(
                    common.call_loop(tuned[0], grid, tuned[1])
                )
            triton_tuned = common.triton_autotuned_call(shape, "cuda")  # tuned by Triton's timer
            if triton_tuned is not None:
                systems["triton_autotuned"] = common.Timed(
                    common.call_loop(triton_tuned[0], grid, triton_tuned[1])
                )
            heuristics = common.triton_heuristics_call(shape, "cuda")
            if heuristics is not None:
                heuristics[0][grid](*heuristics[1])  # Triton compiles its specialization
                systems["triton_heuristics"] = common.Timed(
                    common.call_loop(heuristics[0], grid, heuristics[1])
                )
            systems["fastkernel_cpp"] = common.bundle_timed(
                fk, args, grid, device, stream, pathlib.Path(scratch_dir) / shape.name
            )
            static, why = common.inductor_static_timed(
                compiled, args, grid, device, stream, scratch_dir
            )
            if static is not None:
                systems["inductor_static"] = static
            else:
                absent["inductor_static"] = why
            try:
                systems["cuda_graph"] = common.graph_timed(
                    lambda jit=jit, grid=grid, args=args: jit[grid](*args), common.GRAPH_LAUNCHES
                )
            except Exception as exc:  # reported, and the other systems still run
                absent["cuda_graph"] = f"capture failed: {type(exc).__name__}: {exc}"

            before = fk.stats()
            shape_results[shape.name] = common.time_systems(systems, iterations, repeats, sync)
            after = fk.stats()
            fast_path[shape.name] = common.fast_path_record(before, after)
            shape_info[shape.name] = {"num_args": shape.num_args, "num_tensors": shape.num_tensors}
            # Triton's own kernel, autotuner and heuristics under fastkernel.patch(), in their
            # own interleaved group beside the @fastkernel hit.
            group = shape.name + common.PATCHED_GROUP
            shape_results[group] = common.time_patched(
                shape, "cuda", fk, triton_tuned, heuristics, iterations, repeats, sync
            )
            shape_info[group] = shape_info[shape.name]
            memory[shape.name] = common.table_memory(fk)
            cold[shape.name] = _gpu_cold_costs(fk, jit, shape, args, cold_repeats, sync)

    for system, why in absent.items():
        print(f"{common.SYSTEM_LABELS[system]}: absent ({why})")
    from . import library as library_calls
    from . import warm as warm_start

    print("  library ops (Liger-Kernel), unpatched / patched / CUDA graph", flush=True)
    library = library_calls.time_library_calls(
        max(iterations // 10, 1), repeats, "cuda", torch.cuda.synchronize
    )
    warm = warm_start.measure(host=False, repeats=1 if opts.quick else 5)
    rows = common.result_rows(shape_results, shape_info)
    report = {
        "environment": env,
        "method": common.method_record(iterations, repeats),
        "systems": {k: v for k, v in common.SYSTEM_LABELS.items()},
        "absent": absent,
        "results": rows,
        "cold_us": cold,
        "table_bytes": memory,
        "fastkernel_path": fast_path,
        "warm_start": warm,
        "library_calls_us": library,
        "targets": common.check_targets(rows),
    }
    if warm["warm_speedup"] is not None:
        report["targets"].append(
            {
                "target": "Triton warm first call / fastkernel warm first call >= 20",
                "measured": warm["warm_speedup"],
                "met": warm["warm_speedup"] >= 20.0,
            }
        )
    stem = f"dispatch-{common.slug(env['device'])}-{env['date'][:10]}"
    common.finish_report(
        report,
        common.results_dir(opts.out, repo),
        stem,
        list(common.SYSTEM_LABELS),
        common.SYSTEM_LABELS,
        "us",
    )
    common.print_cold(cold, "us")
    common.print_table_memory(memory)
    warm_start.print_report(warm)
    library_calls.print_library_calls(library)
    common.print_fast_path(fast_path)
    common.print_floor_vs_graph(rows)
    print("\ntargets:")
    for t in report["targets"]:
        print(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['measured']:.2f}")
    return 0 if common.all_hits(fast_path) else 1


def _gpu_cold_costs(
    fk, jit, shape, args: tuple, repeats: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Median microseconds of a miss served from Triton's on-disk cache and of a first call."""
    import triton

    from fastkernel.kernel import FastKernel

    grid = shape.grid

    def fastkernel_miss():
        fk._clear_records()  # drops the launch records: the next call registers again from the cache
        return lambda: fk[grid](*args)

    def fastkernel_first():
        fresh = FastKernel(triton.jit(jit.fn))
        return lambda: fresh[grid](*args)

    def triton_first():
        fresh = triton.jit(jit.fn)
        return lambda: fresh[grid](*args)

    costs = {
        "fastkernel_miss_from_disk_cache": common.median(
            common.time_single_calls(fastkernel_miss, repeats, sync)
        ),
        "fastkernel_first_call": common.median(
            common.time_single_calls(fastkernel_first, repeats, sync)
        ),
        "triton_first_call": common.median(common.time_single_calls(triton_first, repeats, sync)),
    }
    if hasattr(jit, "device_caches"):

        def triton_miss():
            jit.device_caches.clear()  # Triton's in-process caches; the binary stays on disk
            return lambda: jit[grid](*args)

        costs["triton_miss_from_disk_cache"] = common.median(
            common.time_single_calls(triton_miss, repeats, sync)
        )
    return costs
