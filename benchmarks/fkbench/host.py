"""The host-side part of the dispatch benchmark: fastkernel's own cost per hit, no GPU.

Launches go to the recording stand-in for the CUDA driver (``tests/stand_in_driver``), whose
``cuLaunchKernel`` validates the call, copies the parameter bytes into a 4096-entry record and
returns. CPU tensors stand in for device tensors (``fastkernel._C._testing.set_host_testing``).
So the wall time of a hit is everything fastkernel does on the host (bind, key, lookup, stream
query, packing) plus the stand-in's small launch, and the floor (``_C.BenchFloor`` against the
same stand-in) measures that launch alone.

Triton's own ``kernel[grid]`` and ``CompiledKernel.run`` run against the same stand-in
(``tests/triton_reference.py``: Triton's launcher module is built against it), so their host cost
is measured side by side. The current device and stream come from Python callables there (torch
has no CUDA here), where a GPU process calls torch's C functions.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

from . import common
from . import library as library_calls

#: The stream the host-side run launches on (any value: the stand-in records it).
HOST_STREAM = 0x1234

#: Systems Triton's launcher or the floor loop launch through the stand-in here.
_THROUGH_STAND_IN = {
    "floor",
    "triton_run",
    "triton",
    "triton_handle",
    "triton_autotuned",
    "triton_heuristics",
}

#: The systems a host-side run times, with their labels: the GPU run's (common.SYSTEM_LABELS),
#: less what needs a GPU, those launched through the stand-in marked so, and the hook rows.
HOST_LABELS: dict[str, str] = {
    **{
        system: label + (" (stand-in)" if system in _THROUGH_STAND_IN else "")
        for system, label in common.SYSTEM_LABELS.items()
        if system not in ("inductor_static", "cuda_graph")
    },
    "enter_hook": "fastkernel, a no-op launch_enter_hook set",
    "enter_exit_hooks": "fastkernel, no-op launch_enter_hook and launch_exit_hook set",
}


class StandInUnavailable(RuntimeError):
    """The host-side benchmark cannot use the recording stand-in driver."""


# ---- the stand-in driver ----------------------------------------------------------------------


def use_stand_in_driver(repo: pathlib.Path):
    """Point fastkernel at the recording stand-in driver and let CPU tensors stand in.

    Must run before this process's first launch: the driver library is opened once.

    Parameters
    ----------
    repo : pathlib.Path
        The fastkernel checkout (``tests/stand_in_driver`` is not part of the wheel).

    Returns
    -------
    RecordingDriver
        ctypes view of the stand-in (``reset()`` forgets recorded launches).

    Raises
    ------
    StandInUnavailable
        When the stand-in cannot be built, or when this process already opened another driver
        library.
    """
    from fastkernel import _C

    tests_dir = str(repo / "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    try:
        from stand_in_driver.recording import RecordingDriver, build_recording_driver

        path = build_recording_driver()
    except (ImportError, OSError, RuntimeError) as exc:
        raise StandInUnavailable(f"cannot build the stand-in driver in {repo}: {exc}") from exc
    if _C.driver_loaded() and _C.driver_library_path() != str(path):
        raise StandInUnavailable(
            f"this process already opened the driver {_C.driver_library_path()!r}; the "
            f"host-side benchmark must run before any launch"
        )
    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(path)
    _C._testing.set_host_testing(True, 0, HOST_STREAM)
    return RecordingDriver(path)


def floor_params_match(drv, fk, shape, args: tuple, floor: common.Timed) -> bool:
    """Whether one fastkernel hit and one floor launch hand the driver the same bytes."""
    drv.reset()
    fk[shape.grid](*args)
    floor.loop(1)
    launches = drv.launches()
    if len(launches) != 2:
        return False
    hit, ref = launches
    return (hit.name, hit.grid, hit.block, hit.shared_mem, hit.stream, hit.raw) == (
        ref.name,
        ref.grid,
        ref.block,
        ref.shared_mem,
        ref.stream,
        ref.raw,
    )


# ---- wall clock -------------------------------------------------------------------------------


def _first_config_wins(kernel_call, quantiles):
    kernel_call()
    _first_config_wins.calls = getattr(_first_config_wins, "calls", 0) + 1
    return [float(_first_config_wins.calls)] * len(quantiles)


def run_host(opts: argparse.Namespace, repo: pathlib.Path) -> int:
    """Time fastkernel hits (tuple and callable grid) and the floor against the stand-in."""
    import triton

    from fastkernel import _C
    from fastkernel.kernel import FastKernel

    from .kernels import SHAPES, autotuned_call, callable_grid, called_grid

    try:
        drv = use_stand_in_driver(repo)
    except StandInUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    iterations, repeats = common.mode_counts(
        opts, common.HOST_QUICK if opts.quick else common.HOST_DEFAULTS
    )
    cold_repeats = common.COLD_REPEATS_QUICK if opts.quick else common.COLD_REPEATS
    env = common.environment("host", None)
    print(
        f"host-side cost per hit on {env['cpu']} ({env['cpu_count']} CPUs), stand-in driver "
        f"{env['driver_library']}; {iterations} calls x {repeats} repeats per system"
    )
    from triton_reference import TritonReference

    absent = {"inductor_static": "needs a GPU", "cuda_graph": "needs a GPU"}
    library_calls.import_device_probing_libraries()
    try:
        reference = TritonReference(drv, HOST_STREAM)
        reference.__enter__()  # Triton's launcher on the stand-in, until the end of the run
    except BaseException as exc:  # pytest's Skipped when this process loaded the real driver
        reference = None
        absent["triton"] = absent["triton_run"] = f"Triton's launcher is unavailable: {exc}"
        print(f"not measuring Triton: {exc}")

    def no_sync() -> None:
        pass

    shape_results: dict[str, dict[str, list[float]]] = {}
    shape_info: dict[str, dict[str, int]] = {}
    cold: dict[str, dict[str, float]] = {}
    fast_path: dict[str, dict[str, Any]] = {}
    params_match: dict[str, bool] = {}
    memory: dict[str, dict[str, int]] = {}
    bundles = tempfile.mkdtemp(prefix="fastkernel-bench-bundles-")
    try:
        for shape in SHAPES:
            args = shape.make_args("cpu")
            grid = shape.grid
            fk = FastKernel(shape.kernel)
            start = time.perf_counter_ns()
            compiled = fk[grid](*args)  # a miss: compiles, or loads from Triton's disk cache
            first_us = (time.perf_counter_ns() - start) / 1e3
            print(f"  {shape.name}: first call {first_us / 1e3:.1f} ms", flush=True)

            floor = common.floor_timed(compiled, args, grid, 0, HOST_STREAM)
            params_match[shape.name] = floor_params_match(drv, fk, shape, args, floor)
            systems = {"floor": floor}
            if reference is not None:
                triton_compiled = shape.kernel[grid](*args)  # Triton's own path: compile, launch
                systems.update(
                    common.triton_systems(shape.kernel, triton_compiled, grid, args, HOST_STREAM)
                )
                systems["fastkernel_handle"] = common.handle_timed(fk, grid, args)
            systems.update(
                {
                    "fastkernel": common.Timed(common.call_loop(fk, grid, args)),
                    "fastkernel_callable": common.Timed(
                        common.call_loop(fk, callable_grid(shape), args)
                    ),
                    "fastkernel_called": common.Timed(
                        common.call_loop(fk, called_grid(shape), args)
                    ),
                    **common.tutorial_grid_systems(fk, shape, args),
                }
            )
            # No GPU to time configs on: the first config is taken (the hit path is the same).
            tuned = autotuned_call(shape, "cpu", do_bench=_first_config_wins)
            if tuned is not None:
                systems["fastkernel_autotuned"] = common.Timed(
                    common.call_loop(tuned[0], grid, tuned[1])
                )
            systems["fastkernel_cpp"] = common.bundle_timed(
                fk, args, grid, 0, HOST_STREAM, pathlib.Path(bundles) / shape.name
            )
            triton_tuned = (
                common.triton_autotuned_call(shape, "cpu", _first_config_wins)
                if reference is not None
                else None
            )
            if triton_tuned is not None:
                systems["triton_autotuned"] = common.Timed(
                    common.call_loop(triton_tuned[0], grid, triton_tuned[1])
                )
            heuristics = (
                common.triton_heuristics_call(shape, "cpu") if reference is not None else None
            )
            if heuristics is not None:
                heuristics[0][grid](*heuristics[1])  # Triton compiles its specialization
                systems["triton_heuristics"] = common.Timed(
                    common.call_loop(heuristics[0], grid, heuristics[1])
                )
            before = fk.stats()
            shape_results[shape.name] = common.time_systems(
                systems, iterations, repeats, no_sync, before_repeat=drv.reset
            )
            fast_path[shape.name] = common.fast_path_record(before, fk.stats())
            if shape.name == "add-2":
                shape_results[shape.name + HOOKS_GROUP] = time_hooks(
                    fk, shape, args, iterations, repeats, no_sync, drv.reset
                )
                shape_info[shape.name + HOOKS_GROUP] = {
                    "num_args": shape.num_args,
                    "num_tensors": shape.num_tensors,
                }
            if reference is not None:
                shape_results[shape.name + common.PATCHED_GROUP] = common.time_patched(
                    shape,
                    "cpu",
                    fk,
                    triton_tuned,
                    heuristics,
                    iterations,
                    repeats,
                    no_sync,
                    drv.reset,
                )
                shape_info[shape.name + common.PATCHED_GROUP] = {
                    "num_args": shape.num_args,
                    "num_tensors": shape.num_tensors,
                }
            shape_info[shape.name] = {"num_args": shape.num_args, "num_tensors": shape.num_tensors}

            memory[shape.name] = common.table_memory(fk)

            def miss(fk=fk, grid=grid, args=args):
                fk._clear_records()  # the next call registers the specialization again, from disk
                return lambda: fk[grid](*args)

            def first(shape=shape, grid=grid, args=args):
                fresh = FastKernel(triton.jit(shape.kernel.fn))
                return lambda: fresh[grid](*args)

            cold[shape.name] = {
                # The first compile of the process also imports Triton's compiler stack.
                "fastkernel_first_call_this_process": first_us,
                "fastkernel_miss_from_disk_cache": common.median(
                    common.time_single_calls(miss, cold_repeats, no_sync)
                ),
                "fastkernel_first_call": common.median(
                    common.time_single_calls(first, cold_repeats, no_sync)
                ),
            }
            drv.reset()
        library = {}
        if reference is not None:  # Triton's launcher runs the unpatched calls
            # An autotuned library kernel tunes at its first call with Triton's benchmarker,
            # which times CUDA events; here every config times alike (the first wins).
            reference.driver.get_benchmarker = lambda: _first_config_wins
            try:
                library = library_calls.time_library_calls(
                    max(iterations // 10, 1), repeats, "cpu", lambda: None, drv.reset
                )
            finally:
                del reference.driver.get_benchmarker
        helpers = time_host_helpers(repeats)
    finally:
        if reference is not None:
            reference.__exit__(None, None, None)
        _C._testing.set_host_testing(False, 0, 0)
        shutil.rmtree(bundles, ignore_errors=True)

    from . import warm as warm_start

    warm = warm_start.measure(
        host=True,
        repeats=1 if opts.quick else 5,
        stream=HOST_STREAM,
        driver_library=os.environ.get("FASTKERNEL_CUDA_DRIVER"),
    )
    rows = common.result_rows(shape_results, shape_info)
    report = {
        "environment": env,
        "method": {
            **common.method_record(iterations, repeats),
            "sync_before_clock": False,
            "driver": "recording stand-in (tests/stand_in_driver)",
        },
        "systems": HOST_LABELS,
        "absent": absent,
        "results": rows,
        "cold_us": cold,
        "table_bytes": memory,
        "fastkernel_path": fast_path,
        "floor_params_match": params_match,
        "warm_start": warm,
        "library_calls_us": library,
        "host_helpers_ns": helpers,
    }
    stem = f"host-{common.slug(env['cpu'])}-{env['date'][:10]}"
    common.finish_report(
        report, common.results_dir(opts.out, repo), stem, list(HOST_LABELS), HOST_LABELS, "ns"
    )
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    plain = [s for s in shape_results if not s.endswith((common.PATCHED_GROUP, HOOKS_GROUP))]
    print("\nfastkernel's own cost per hit (tuple grid minus the floor), ns:")
    print(
        "  "
        + "  ".join(f"{s}: {1e3 * (us[(s, 'fastkernel')] - us[(s, 'floor')]):.0f}" for s in plain)
    )
    if reference is not None:
        print("Triton kernel[grid] / fastkernel (host-side cost against the same stand-in):")
        print(
            "  "
            + "  ".join(f"{s}: {us[(s, 'triton')] / us[(s, 'fastkernel')]:.1f}x" for s in plain)
        )
    handles = [s for s in plain if (s, "triton_handle") in us and (s, "fastkernel_handle") in us]
    if handles:
        print(
            "a kept CompiledKernel's own launch, handle[(g, 1, 1)](*args): Triton's runner / fastkernel:"
        )
        print(
            "  "
            + "  ".join(
                f"{s}: {us[(s, 'triton_handle')] / us[(s, 'fastkernel_handle')]:.1f}x"
                for s in handles
            )
        )
    print("C++ Bundle::launch minus the floor, ns:")
    print(
        "  "
        + "  ".join(
            f"{s}: {1e3 * (us[(s, 'fastkernel_cpp')] - us[(s, 'floor')]):.0f}" for s in plain
        )
    )
    print("autotuned hit minus plain hit, ns:")
    print(
        "  "
        + "  ".join(
            f"{s}: {1e3 * (us[(s, 'fastkernel_autotuned')] - us[(s, 'fastkernel')]):.0f}"
            for s in plain
            if (s, "fastkernel_autotuned") in us
        )
    )
    patched_rows = [s for s in shape_results if s.endswith(common.PATCHED_GROUP)]
    if patched_rows:
        print(
            "patched Triton kernel / @fastkernel kernel, and patched triton.autotune tuned hit "
            "/ patched plain hit (timed in one interleaved group, patch on):"
        )
        print(
            "  "
            + "  ".join(
                f"{s[: -len(common.PATCHED_GROUP)]}: {us[(s, 'patched')] / us[(s, 'fastkernel')]:.3f}"
                + (
                    f", {us[(s, 'patched_autotuned')] / us[(s, 'patched')]:.3f}"
                    if (s, "patched_autotuned") in us
                    else ""
                )
                for s in patched_rows
            )
        )
        for wrapper, theirs, ours in (
            ("triton.autotune tuned call", "triton_autotuned", "patched_autotuned"),
            ("triton.heuristics call", "triton_heuristics", "patched_heuristics"),
        ):
            ratios = [
                f"{s}: {us[(s, theirs)] / us[(s + common.PATCHED_GROUP, ours)]:.1f}x"
                for s in shape_results
                if (s, theirs) in us and (s + common.PATCHED_GROUP, ours) in us
            ]
            print(f"Triton's own {wrapper} / the same call patched:\n  " + "  ".join(ratios))
        print(
            "a kept CompiledKernel.run called directly (launch caches), Triton's launcher / "
            "fastkernel's under the patch:\n  "
            + "  ".join(
                f"{s[: -len(common.PATCHED_GROUP)]}: "
                f"{us[(s, 'patched_triton_run')] / us[(s, 'patched_run')]:.1f}x"
                for s in patched_rows
                if (s, "patched_run") in us
            )
        )
    library_calls.print_library_calls(library)
    print(
        "host calls, ns (median; Triton's ConstexprFunction.__call__ / fastkernel's host helpers):"
    )
    for name, row in helpers.items():
        print(f"  {name}: " + " / ".join(f"{v:.0f}" for v in row.values()))
    for group in (s for s in shape_results if s.endswith(HOOKS_GROUP)):
        print(
            f"launch hooks at {group[: -len(HOOKS_GROUP)]}, ns more than no hook: enter "
            f"{1e3 * (us[(group, 'enter_hook')] - us[(group, 'fastkernel')]):.0f}, enter and "
            f"exit {1e3 * (us[(group, 'enter_exit_hooks')] - us[(group, 'fastkernel')]):.0f}"
        )
    tutorial = [s for s in plain if (s, "fastkernel_tutorial_helpers") in us]
    if tutorial:
        print("tutorial grid minus tuple grid, ns (Triton's cdiv / host helpers):")
        print(
            "  "
            + "  ".join(
                f"{s}: {1e3 * (us[(s, 'fastkernel_tutorial')] - us[(s, 'fastkernel')]):.0f} / "
                f"{1e3 * (us[(s, 'fastkernel_tutorial_helpers')] - us[(s, 'fastkernel')]):.0f}"
                for s in tutorial
            )
        )
    print("callable grid minus tuple grid, ns (a grid program / a grid function called):")
    print(
        "  "
        + "  ".join(
            f"{s}: {1e3 * (us[(s, 'fastkernel_callable')] - us[(s, 'fastkernel')]):.0f} / "
            f"{1e3 * (us[(s, 'fastkernel_called')] - us[(s, 'fastkernel')]):.0f}"
            for s in shape_results
            if (s, "fastkernel_callable") in us
        )
    )
    common.print_cold(cold, "us")
    common.print_table_memory(memory)
    warm_start.print_report(warm)
    common.print_fast_path(fast_path)
    ok = common.all_hits(fast_path)
    for name, match in params_match.items():
        if not match:
            ok = False
            print(f"WARNING: {name}: the floor's parameter bytes differ from fastkernel's")
    return 0 if ok else 1


#: The name suffix of the group timed with Triton's launch hooks set.
HOOKS_GROUP = " (hooks)"


def time_hooks(
    fk, shape, args, iterations: int, repeats: int, sync, reset
) -> dict[str, list[float]]:
    """A tuple-grid hit with no launch hook, with a no-op ``knobs.runtime.launch_enter_hook``,
    and with no-op enter and exit hooks (each set before its own loop, outside the timing, and
    removed at the end): what a hook costs per launch beyond the hook's own body (Triton's
    launch metadata is built for it)."""
    from triton import knobs

    def noop(*_args):
        return None

    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook

    def hooks(on_enter: bool, on_exit: bool):
        def switch() -> None:
            (enter.add if on_enter else enter.remove)(noop)
            (exit_.add if on_exit else exit_.remove)(noop)

        return switch

    loop = common.call_loop(fk, shape.grid, args)
    systems = {
        "fastkernel": common.Timed(loop, prepare=hooks(False, False)),
        "enter_hook": common.Timed(loop, prepare=hooks(True, False)),
        "enter_exit_hooks": common.Timed(loop, prepare=hooks(True, True)),
    }
    try:
        return common.time_systems(systems, iterations, repeats, sync, before_repeat=reset)
    finally:
        hooks(False, False)()


def time_host_helpers(repeats: int) -> dict[str, dict[str, float]]:
    """Nanoseconds per host call (``timeit``, median of ``repeats``) of ``triton.cdiv`` and
    ``triton.next_power_of_2`` with Triton's own ``ConstexprFunction.__call__`` and with
    fastkernel's host helpers, beside the same arithmetic written inline."""
    import timeit

    import triton

    from fastkernel import _host_helpers

    cases = {
        "triton.cdiv(4096, 1024)": lambda: triton.cdiv(4096, 1024),
        "triton.next_power_of_2(4000)": lambda: triton.next_power_of_2(4000),
    }
    out: dict[str, dict[str, float]] = {}
    try:
        for name, fn in cases.items():
            out[name] = {}
            for mode, switch in (
                ("triton", _host_helpers.uninstall),
                ("host helpers", _host_helpers.install),
            ):
                switch()
                out[name][mode] = common.median(
                    [timeit.timeit(fn, number=20000) / 20000 * 1e9 for _ in range(repeats)]
                )
    finally:
        _host_helpers.uninstall()
    inline = common.median(
        [
            timeit.timeit(lambda: (4096 + 1023) // 1024, number=20000) / 20000 * 1e9
            for _ in range(repeats)
        ]
    )
    out["inline (4096 + 1023) // 1024"] = {"python": inline}
    return out
