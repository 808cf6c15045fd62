"""The host-side part of ``python -m fastkernel bench``: fastkernel's own cost per hit, no GPU.

Launches go to the recording stand-in for the CUDA driver (``tests/stand_in_driver`` in the
fastkernel checkout), whose ``cuLaunchKernel`` validates the call, copies the parameter bytes
into a 4096-entry record and returns. CPU tensors stand in for device tensors
(``fastkernel._C._testing.set_host_testing``). So the wall time of a hit is everything fastkernel
does on the host (bind, key, lookup, stream query, packing) plus the stand-in's small launch, and
the floor (``_C.BenchFloor`` against the same stand-in) measures that launch alone.

Triton's own ``kernel[grid]`` and ``CompiledKernel.run`` run against the same stand-in
(``tests/triton_reference.py``: Triton's launcher module is built against it), so their host cost
is measured side by side. The current device and stream come from Python callables there (torch
has no CUDA here), where a GPU process calls torch's C functions.

``--callgrind`` re-runs the hit loops under ``valgrind --tool=callgrind``, collecting only inside
``_C.bench_call_loop`` (``--toggle-collect=fastkernel_bench_call_loop``) and dumping once per
loop (``--dump-after``), which gives instructions per hit, deterministic on a noisy machine, and
a breakdown by function group from ``callgrind_annotate``'s inclusive counts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import bench

#: The stream the host-side run launches on (any value: the stand-in records it).
HOST_STREAM = 0x1234

HOST_LABELS: Dict[str, str] = {
    "floor": "floor: C++ cuLaunchKernel loop (stand-in)",
    "triton_run": "Triton CompiledKernel.run (stand-in)",
    "triton": "Triton kernel[grid] (stand-in)",
    "fastkernel": "fastkernel, tuple grid",
    "fastkernel_callable": "fastkernel, callable grid",
    "fastkernel_tutorial": "fastkernel, tutorial grid (triton.cdiv), Triton's cdiv",
    "fastkernel_tutorial_helpers": "fastkernel, tutorial grid, host helpers on",
    "fastkernel_autotuned": "fastkernel.autotune, tuned hit",
    "fastkernel_cpp": "fastkernel C++ Bundle::launch",
    "triton_autotuned": "Triton's triton.autotune, tuned call (stand-in)",
    "patched": "fastkernel.patch(): Triton kernel[grid]",
    "patched_autotuned": "fastkernel.patch(): Triton's triton.autotune, tuned hit",
    "enter_hook": "fastkernel, a no-op launch_enter_hook set",
    "enter_exit_hooks": "fastkernel, no-op launch_enter_hook and launch_exit_hook set",
}

#: Warm-up hits before a collected callgrind loop.
_CALLGRIND_WARMUP = 20
#: Hits per collected loop unless --iterations says otherwise.
_CALLGRIND_HITS = 1000
#: The function callgrind collects in and dumps after (csrc/python/bench_floor.cpp): an exact
#: name, as --dump-after takes no wildcard.
_TOGGLE = "fastkernel_bench_call_loop"

#: Function groups of a hit, by the symbol whose inclusive count measures them (in call order).
#: "fastkernel::launch" includes the driver call; the breakdown subtracts it.
GROUP_SYMBOLS: List[Tuple[str, str]] = [
    ("key build", "fastkernel::bind_and_build_key("),
    ("lookup", "fastkernel::LaunchTable::find("),
    ("stream query", "fastkernel::current_launch_context("),
    ("packing + launch", "fastkernel::launch("),
    ("driver call", "cuLaunchKernel"),
]


class StandInUnavailable(RuntimeError):
    """The host-side benchmark cannot use the recording stand-in driver."""


# ---- the stand-in driver ----------------------------------------------------------------------


def use_stand_in_driver(repo: Optional[pathlib.Path]):
    """Point fastkernel at the recording stand-in driver and let CPU tensors stand in.

    Must run before this process's first launch: the driver library is opened once.

    Parameters
    ----------
    repo : pathlib.Path or None
        The fastkernel checkout (``tests/stand_in_driver`` is not part of the wheel).

    Returns
    -------
    RecordingDriver
        ctypes view of the stand-in (``reset()`` forgets recorded launches).

    Raises
    ------
    StandInUnavailable
        Without a checkout, when the stand-in cannot be built, or when this process already
        opened another driver library.
    """
    from . import _C
    if repo is None:
        raise StandInUnavailable(
            "the host-side benchmark needs the recording stand-in driver from a fastkernel "
            "checkout (tests/stand_in_driver), which an installed wheel does not include: run "
            "`python benchmarks/dispatch.py` in the repository, or pass --repo DIR")
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
            f"host-side benchmark must run before any launch")
    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(path)
    _C._testing.set_host_testing(True, 0, HOST_STREAM)
    return RecordingDriver(path)


def floor_params_match(drv, fk, shape, args: tuple, floor: "bench.Timed") -> bool:
    """Whether one fastkernel hit and one floor launch hand the driver the same bytes."""
    drv.reset()
    fk[shape.grid](*args)
    floor.loop(1)
    launches = drv.launches()
    if len(launches) != 2:
        return False
    hit, ref = launches
    return (hit.name, hit.grid, hit.block, hit.shared_mem, hit.stream, hit.raw) == (
        ref.name, ref.grid, ref.block, ref.shared_mem, ref.stream, ref.raw)


# ---- wall clock -------------------------------------------------------------------------------


def _first_config_wins(kernel_call, quantiles):
    kernel_call()
    _first_config_wins.calls = getattr(_first_config_wins, "calls", 0) + 1
    return [float(_first_config_wins.calls)] * len(quantiles)


def run_host(opts: argparse.Namespace, repo: Optional[pathlib.Path]) -> int:
    """Time fastkernel hits (tuple and callable grid) and the floor against the stand-in."""
    import triton

    from . import _C
    from ._bench_kernels import SHAPES, autotuned_call
    from .kernel import FastKernel

    try:
        drv = use_stand_in_driver(repo)
    except StandInUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    iterations, repeats = bench._mode_counts(
        opts, bench._HOST_QUICK if opts.quick else bench._HOST_DEFAULTS)
    cold_repeats = bench._COLD_REPEATS_QUICK if opts.quick else bench._COLD_REPEATS
    env = bench.environment("host", None)
    print(f"host-side cost per hit on {env['cpu']} ({env['cpu_count']} CPUs), stand-in driver "
          f"{env['driver_library']}; {iterations} calls x {repeats} repeats per system")
    from triton_reference import TritonReference
    absent = {"inductor_static": "needs a GPU", "cuda_graph": "needs a GPU"}
    try:
        reference = TritonReference(drv, HOST_STREAM)
        reference.__enter__()  # Triton's launcher on the stand-in, until the end of the run
    except BaseException as exc:  # pytest's Skipped when this process loaded the real driver
        reference = None
        absent["triton"] = absent["triton_run"] = f"Triton's launcher is unavailable: {exc}"
        print(f"not measuring Triton: {exc}")

    def no_sync() -> None:
        pass

    shape_results: Dict[str, Dict[str, List[float]]] = {}
    shape_info: Dict[str, Dict[str, int]] = {}
    cold: Dict[str, Dict[str, float]] = {}
    fast_path: Dict[str, Dict[str, Any]] = {}
    params_match: Dict[str, bool] = {}
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

            def callable_grid(meta, _grid=grid):
                return _grid

            floor = bench.floor_timed(compiled, args, grid, 0, HOST_STREAM)
            params_match[shape.name] = floor_params_match(drv, fk, shape, args, floor)
            systems = {"floor": floor}
            if reference is not None:
                triton_compiled = shape.kernel[grid](*args)  # Triton's own path: compile, launch
                systems.update(bench.triton_systems(shape.kernel, triton_compiled, grid, args,
                                                    HOST_STREAM))
            systems.update({
                "fastkernel": bench.Timed(bench.call_loop(fk, grid, args)),
                "fastkernel_callable": bench.Timed(bench.call_loop(fk, callable_grid, args)),
                **bench.tutorial_grid_systems(fk, shape, args),
            })
            # No GPU to time configs on: the first config is taken (the hit path is the same).
            tuned = autotuned_call(shape, "cpu", do_bench=_first_config_wins)
            if tuned is not None:
                systems["fastkernel_autotuned"] = bench.Timed(
                    bench.call_loop(tuned[0], grid, tuned[1]))
            systems["fastkernel_cpp"] = bench.bundle_timed(
                fk, args, grid, 0, HOST_STREAM, pathlib.Path(bundles) / shape.name)
            triton_tuned = triton_autotuned_call(shape) if reference is not None else None
            if triton_tuned is not None:
                systems["triton_autotuned"] = bench.Timed(
                    bench.call_loop(triton_tuned[0], grid, triton_tuned[1]))
            before = fk.stats()
            shape_results[shape.name] = bench.time_systems(systems, iterations, repeats, no_sync,
                                                           before_repeat=drv.reset)
            fast_path[shape.name] = bench._fast_path_record(before, fk.stats())
            if shape.name == "add-2":
                shape_results[shape.name + HOOKS_GROUP] = time_hooks(
                    fk, shape, args, iterations, repeats, no_sync, drv.reset)
                shape_info[shape.name + HOOKS_GROUP] = {"num_args": shape.num_args,
                                                        "num_tensors": shape.num_tensors}
            if reference is not None:
                shape_results[shape.name + PATCHED_GROUP] = time_patched(
                    shape, fk, triton_tuned, iterations, repeats, no_sync, drv.reset)
                shape_info[shape.name + PATCHED_GROUP] = {"num_args": shape.num_args,
                                                          "num_tensors": shape.num_tensors}
            shape_info[shape.name] = {"num_args": shape.num_args, "num_tensors": shape.num_tensors}

            def miss(fk=fk, grid=grid, args=args):
                _C.clear(fk)  # the next call registers the specialization again, from disk
                return lambda: fk[grid](*args)

            def first(shape=shape, grid=grid, args=args):
                fresh = FastKernel(triton.jit(shape.kernel.fn))
                return lambda: fresh[grid](*args)

            cold[shape.name] = {
                # The first compile of the process also imports Triton's compiler stack.
                "fastkernel_first_call_this_process": first_us,
                "fastkernel_miss_from_disk_cache": bench.median(
                    bench.time_single_calls(miss, cold_repeats, no_sync)),
                "fastkernel_first_call": bench.median(
                    bench.time_single_calls(first, cold_repeats, no_sync)),
            }
            drv.reset()
        library = {}
        if reference is not None:  # Triton's launcher runs the unpatched calls
            library = time_library_calls(drv, max(iterations // 10, 1), repeats)
        helpers = time_host_helpers(repeats)
    finally:
        if reference is not None:
            reference.__exit__(None, None, None)
        _C._testing.set_host_testing(False, 0, 0)
        shutil.rmtree(bundles, ignore_errors=True)

    from . import _bench_warm
    warm = _bench_warm.measure(host=True, repeats=1 if opts.quick else 3, stream=HOST_STREAM,
                               driver_library=os.environ.get("FASTKERNEL_CUDA_DRIVER"))
    rows = bench.result_rows(shape_results, shape_info)
    report = {
        "environment": env,
        "method": {**bench._method(iterations, repeats), "sync_before_clock": False,
                   "driver": "recording stand-in (tests/stand_in_driver)"},
        "systems": HOST_LABELS,
        "absent": absent,
        "results": rows,
        "cold_us": cold,
        "fastkernel_path": fast_path,
        "floor_params_match": params_match,
        "warm_start": warm,
        "library_calls_us": library,
        "host_helpers_ns": helpers,
    }
    stem = f"host-{bench.slug(env['cpu'])}-{env['date'][:10]}"
    bench.finish_report(report, bench.results_dir(opts.out, repo), stem, list(HOST_LABELS),
                        HOST_LABELS, "ns")
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    plain = [s for s in shape_results if not s.endswith((PATCHED_GROUP, HOOKS_GROUP))]
    print("\nfastkernel's own cost per hit (tuple grid minus the floor), ns:")
    print("  " + "  ".join(f"{s}: {1e3 * (us[(s, 'fastkernel')] - us[(s, 'floor')]):.0f}"
                           for s in plain))
    if reference is not None:
        print("Triton kernel[grid] / fastkernel (host-side cost against the same stand-in):")
        print("  " + "  ".join(f"{s}: {us[(s, 'triton')] / us[(s, 'fastkernel')]:.1f}x"
                               for s in plain))
    print("C++ Bundle::launch minus the floor, ns:")
    print("  " + "  ".join(f"{s}: {1e3 * (us[(s, 'fastkernel_cpp')] - us[(s, 'floor')]):.0f}"
                           for s in plain))
    print("autotuned hit minus plain hit, ns:")
    print("  " + "  ".join(
        f"{s}: {1e3 * (us[(s, 'fastkernel_autotuned')] - us[(s, 'fastkernel')]):.0f}"
        for s in plain if (s, "fastkernel_autotuned") in us))
    patched_rows = [s for s in shape_results if s.endswith(PATCHED_GROUP)]
    if patched_rows:
        print("patched Triton kernel / @fastkernel kernel, and patched triton.autotune tuned hit "
              "/ patched plain hit (timed in one interleaved group, patch on):")
        print("  " + "  ".join(
            f"{s[:-len(PATCHED_GROUP)]}: {us[(s, 'patched')] / us[(s, 'fastkernel')]:.3f}"
            + (f", {us[(s, 'patched_autotuned')] / us[(s, 'patched')]:.3f}"
               if (s, "patched_autotuned") in us else "")
            for s in patched_rows))
        print("Triton's own triton.autotune tuned call / the same call patched:")
        print("  " + "  ".join(
            f"{s}: {us[(s, 'triton_autotuned')] / us[(s + PATCHED_GROUP, 'patched_autotuned')]:.1f}x"
            for s in shape_results if (s, "triton_autotuned") in us
            and (s + PATCHED_GROUP, "patched_autotuned") in us))
    for name, row in library.items():
        print(f"{name}, through its own Python function: unpatched {row['unpatched']:.2f} us, "
              f"patched {row['patched']:.2f} us per call ({row['ratio']:.2f}x); patched without "
              f"the host helpers {row['patched_without_helpers']:.2f} us")
    print("host calls, ns (median; Triton's ConstexprFunction.__call__ / fastkernel's host "
          "helpers):")
    for name, row in helpers.items():
        print(f"  {name}: " + " / ".join(f"{v:.0f}" for v in row.values()))
    for group in (s for s in shape_results if s.endswith(HOOKS_GROUP)):
        print(f"launch hooks at {group[:-len(HOOKS_GROUP)]}, ns more than no hook: enter "
              f"{1e3 * (us[(group, 'enter_hook')] - us[(group, 'fastkernel')]):.0f}, enter and "
              f"exit {1e3 * (us[(group, 'enter_exit_hooks')] - us[(group, 'fastkernel')]):.0f}")
    tutorial = [s for s in plain if (s, "fastkernel_tutorial_helpers") in us]
    if tutorial:
        print("tutorial grid minus tuple grid, ns (Triton's cdiv / host helpers):")
        print("  " + "  ".join(
            f"{s}: {1e3 * (us[(s, 'fastkernel_tutorial')] - us[(s, 'fastkernel')]):.0f} / "
            f"{1e3 * (us[(s, 'fastkernel_tutorial_helpers')] - us[(s, 'fastkernel')]):.0f}"
            for s in tutorial))
    print("callable grid minus tuple grid, ns:")
    print("  " + "  ".join(
        f"{s}: {1e3 * (us[(s, 'fastkernel_callable')] - us[(s, 'fastkernel')]):.0f}"
        for s in shape_results if (s, "fastkernel_callable") in us))
    bench._print_cold(cold, "us")
    _bench_warm.print_report(warm)
    bench._print_fast_path(fast_path)
    ok = bench._all_hits(fast_path)
    for name, match in params_match.items():
        if not match:
            ok = False
            print(f"WARNING: {name}: the floor's parameter bytes differ from fastkernel's")
    return 0 if ok else 1


#: The name suffix of a shape's group timed with fastkernel.patch() on.
PATCHED_GROUP = " (patched)"
#: The name suffix of the group timed with Triton's launch hooks set.
HOOKS_GROUP = " (hooks)"


def time_hooks(fk, shape, args, iterations: int, repeats: int, sync, reset
               ) -> Dict[str, List[float]]:
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

    loop = bench.call_loop(fk, shape.grid, args)
    systems = {"fastkernel": bench.Timed(loop, prepare=hooks(False, False)),
               "enter_hook": bench.Timed(loop, prepare=hooks(True, False)),
               "enter_exit_hooks": bench.Timed(loop, prepare=hooks(True, True))}
    try:
        return bench.time_systems(systems, iterations, repeats, sync, before_repeat=reset)
    finally:
        hooks(False, False)()


def triton_autotuned_call(shape) -> Optional[Tuple[Any, tuple]]:
    """The shape's kernel under Triton's own ``triton.autotune`` (two BLOCK configs, key
    ``["n"]``), tuned by one first call (the first config wins: no GPU to time on), and its
    call arguments without BLOCK; None for shapes without a BLOCK constexpr."""
    import triton
    from triton.runtime.jit import JITFunction
    if shape.num_tensors == 0 or shape.kernel.arg_names[-1] != "BLOCK":
        return None
    block = shape.make_args("cpu")[-1]
    configs = [triton.Config({"BLOCK": block}), triton.Config({"BLOCK": 2 * block})]
    kernel = triton.autotune(configs, key=["n"], do_bench=_first_config_wins)(
        JITFunction(shape.kernel.fn))
    args = shape.make_args("cpu")[:-1]
    kernel[shape.grid](*args)
    return kernel, args


def time_patched(shape, fk, triton_tuned, iterations: int, repeats: int, sync, reset
                 ) -> Dict[str, List[float]]:
    """With fastkernel.patch() on: a Triton kernel's ``kernel[grid]`` and Triton's autotuned
    kernel's tuned call, interleaved with the ``@fastkernel`` kernel's hit."""
    from triton.runtime.jit import JITFunction

    from .patch import patched
    args = shape.make_args("cpu")
    jit = JITFunction(shape.kernel.fn)  # a kernel of its own: its dispatch is made here
    with patched():
        systems = {"fastkernel": bench.Timed(bench.call_loop(fk, shape.grid, args)),
                   "patched": bench.Timed(bench.call_loop(jit, shape.grid, args))}
        if triton_tuned is not None:
            systems["patched_autotuned"] = bench.Timed(
                bench.call_loop(triton_tuned[0], shape.grid, triton_tuned[1]))
        return bench.time_systems(systems, iterations, repeats, sync, before_repeat=reset)


def _liger_rms_norm() -> Optional[Callable[[], Any]]:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    import torch
    x, w = torch.randn(1, 2048), torch.randn(2048)
    return lambda: LigerRMSNormFunction.apply(x, w, 1e-6)


def time_host_helpers(repeats: int) -> Dict[str, Dict[str, float]]:
    """Nanoseconds per host call (``timeit``, median of ``repeats``) of ``triton.cdiv`` and
    ``triton.next_power_of_2`` with Triton's own ``ConstexprFunction.__call__`` and with
    fastkernel's host helpers, beside the same arithmetic written inline."""
    import timeit

    import triton

    from . import _host_helpers
    cases = {
        "triton.cdiv(4096, 1024)": lambda: triton.cdiv(4096, 1024),
        "triton.next_power_of_2(4000)": lambda: triton.next_power_of_2(4000),
    }
    out: Dict[str, Dict[str, float]] = {}
    try:
        for name, fn in cases.items():
            out[name] = {}
            for mode, switch in (("triton", _host_helpers.uninstall),
                                 ("host helpers", _host_helpers.install)):
                switch()
                out[name][mode] = bench.median(
                    [timeit.timeit(fn, number=20000) / 20000 * 1e9 for _ in range(repeats)])
    finally:
        _host_helpers.uninstall()
    inline = bench.median([timeit.timeit(lambda: (4096 + 1023) // 1024, number=20000) / 20000
                           * 1e9 for _ in range(repeats)])
    out["inline (4096 + 1023) // 1024"] = {"python": inline}
    return out


def time_library_calls(drv, calls: int, repeats: int) -> Dict[str, Dict[str, float]]:
    """A library op called through its own Python function (Liger-Kernel's RMSNorm autograd
    function, batch 1, hidden 2048; its wrapper calls triton.next_power_of_2 on every call):
    unpatched, patched, and patched with the host helpers switched off, alternating per repeat
    (switched outside the timing, each mode warmed up after the switch). Microseconds per call,
    medians; the op's own Python and torch allocations are in every mode."""
    from . import _host_helpers
    from .patch import patch, unpatch
    ops = {"Liger-Kernel RMSNorm": _liger_rms_norm()}
    out: Dict[str, Dict[str, float]] = {}
    for name, op in ops.items():
        if op is None:
            continue
        samples: Dict[str, List[float]] = {"unpatched": [], "patched": [],
                                           "patched_without_helpers": []}
        for _ in range(repeats):
            for mode in samples:
                if mode != "unpatched":
                    patch()
                if mode == "patched_without_helpers":
                    _host_helpers.uninstall()
                try:
                    for _ in range(20):
                        op()
                    drv.reset()
                    start = time.perf_counter_ns()
                    for _ in range(calls):
                        op()
                    samples[mode].append((time.perf_counter_ns() - start) / 1e3 / calls)
                finally:
                    if mode != "unpatched":
                        unpatch()
                drv.reset()
        unpatched, patched_us = bench.median(samples["unpatched"]), bench.median(samples["patched"])
        out[name] = {"unpatched": unpatched, "patched": patched_us,
                     "patched_without_helpers": bench.median(samples["patched_without_helpers"]),
                     "ratio": unpatched / patched_us}
    return out


# ---- callgrind --------------------------------------------------------------------------------

# Run by the callgrind child: loads the unstripped profiling build of the extension as
# fastkernel._C before the package imports the installed one, then runs callgrind_child.
_CHILD_BOOTSTRAP = """\
import importlib.util
import sys
import torch  # the extension resolves torch's libraries, which torch loads
spec = importlib.util.spec_from_file_location("fastkernel._C", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["fastkernel._C"] = module
spec.loader.exec_module(module)
from fastkernel import _bench_host
sys.exit(_bench_host.callgrind_child(sys.argv[2:]))
"""


def _tool(name: str) -> Optional[str]:
    """``name`` on PATH or beside this interpreter (a virtual environment's bin)."""
    found = shutil.which(name)
    if found:
        return found
    beside = pathlib.Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else None


def build_profile_extension(repo: pathlib.Path) -> pathlib.Path:
    """Build an unstripped, non-LTO copy of ``_C`` for callgrind's symbol names.

    The wheel's extension is stripped and link-time optimized (pybind11's defaults for a
    Release build), which removes the names of the functions the breakdown is about. This copy
    is built from the same sources at the same ``-O3``, without LTO and unstripped (CMake build
    type "None", which pybind11 leaves unstripped), in ``build/callgrind-profile`` of the
    checkout; kept between runs and rebuilt incrementally. It has no ``-g`` on purpose: with
    line tables, callgrind_annotate splits a function's count by the source file of each inlined
    piece, and the groups are read per function.

    Returns
    -------
    pathlib.Path
        The built extension module.

    Raises
    ------
    RuntimeError
        When cmake or pybind11 is missing or the build fails (with the build's output).
    """
    cmake = _tool("cmake")
    if cmake is None:
        raise RuntimeError("--callgrind builds a profiling copy of the extension and needs cmake")
    try:
        import pybind11
    except ImportError as exc:
        raise RuntimeError("--callgrind needs pybind11 (a build dependency) to build the "
                           "profiling copy of the extension") from exc
    build_dir = repo / "build" / "callgrind-profile"
    env = dict(os.environ)
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    configure = [cmake, "-S", str(repo), "-B", str(build_dir),
                 "-DCMAKE_BUILD_TYPE=None",
                 "-DCMAKE_CXX_FLAGS=-O3 -DNDEBUG",
                 "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF",
                 f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
    if _tool("ninja"):
        configure += ["-G", "Ninja"]
    stamp = build_dir / "fastkernel-configure.txt"
    steps = []
    if not stamp.is_file() or stamp.read_text() != "\n".join(configure):
        steps.append(configure)
    steps.append([cmake, "--build", str(build_dir), "--target", "_C"])
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"building the profiling extension failed ({' '.join(cmd)}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}")
        if cmd is configure:
            stamp.write_text("\n".join(configure))
    built = sorted(build_dir.glob("_C*.so"))
    if not built:
        raise RuntimeError(f"no _C*.so in {build_dir} after the build")
    return built[0]


def parse_annotate_output(text: str) -> Tuple[Optional[int], Dict[str, int]]:
    """Parse ``callgrind_annotate --inclusive=yes`` output.

    Parameters
    ----------
    text : str
        The annotate report.

    Returns
    -------
    total : int or None
        The ``PROGRAM TOTALS`` instruction count.
    functions : dict of str to int
        Inclusive instruction count per function name (file and object stripped).
    """
    total = None
    functions: Dict[str, int] = {}
    line_re = re.compile(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.+?)\s*$")
    for line in text.splitlines():
        m = line_re.match(line)
        if m is None:
            continue
        count = int(m.group(1).replace(",", ""))
        rest = m.group(2)
        if rest.startswith("PROGRAM TOTALS"):
            total = count
            continue
        rest = re.sub(r"\s+\[[^\]]*\]$", "", rest)  # the object file
        _, _, name = rest.partition(":")  # "file:function"; a file name has no ':'
        functions[name] = max(functions.get(name, 0), count)
    return total, functions


def _inclusive(functions: Dict[str, int], symbol: str) -> Optional[int]:
    """The inclusive count of ``symbol`` (a name prefix; an exact name when it has no '(')."""
    if "(" in symbol:
        counts = [c for name, c in functions.items() if name.startswith(symbol)]
    else:
        counts = [c for name, c in functions.items()
                  if name == symbol or name.startswith(symbol + "'")]
    return max(counts) if counts else None


def breakdown(total: int, functions: Dict[str, int], hits: int) -> Dict[str, Optional[float]]:
    """Instructions per hit, in total and by function group.

    ``entry`` (Python to native: ``kernel[grid]``, vectorcall dispatch, grid, counters and the
    return value) is what remains after the named groups; ``packing`` is ``fastkernel::launch``
    less the driver call it makes. A group whose symbol is absent (inlined or renamed) is None
    and its cost stays in ``entry``.
    """
    inc = {group: _inclusive(functions, symbol) for group, symbol in GROUP_SYMBOLS}
    driver_call = inc["driver call"] or 0
    launch = inc["packing + launch"]
    named = sum(v for k, v in inc.items() if v is not None and k != "driver call")
    if launch is None:
        named += driver_call
    per = {
        "total": total / hits,
        "entry": (total - named) / hits,
        "key build": None if inc["key build"] is None else inc["key build"] / hits,
        "lookup": None if inc["lookup"] is None else inc["lookup"] / hits,
        "stream query": None if inc["stream query"] is None else inc["stream query"] / hits,
        "packing": None if launch is None else (launch - driver_call) / hits,
        "driver call": driver_call / hits if inc["driver call"] is not None else None,
    }
    per["fastkernel"] = (total - driver_call) / hits if inc["driver call"] is not None else None
    return per


def callgrind_child(argv: List[str]) -> int:
    """Under valgrind: register each shape, then one collected loop of hits per grid kind."""
    parser = argparse.ArgumentParser(prog="fastkernel callgrind child")
    parser.add_argument("--hits", type=int, required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--repo", required=True)
    opts = parser.parse_args(argv)

    from . import _C, _host_helpers
    from ._bench_kernels import SHAPES, autotuned_call, tutorial_grid
    from .kernel import PATCH_ATTR, FastKernel
    from .patch import patched

    drv = use_stand_in_driver(pathlib.Path(opts.repo))
    loops = []
    for shape in SHAPES:
        args = shape.make_args("cpu")
        fk = FastKernel(shape.kernel)
        fk[shape.grid](*args)  # the miss: registers from Triton's disk cache (warmed by the parent)

        def callable_grid(meta, _grid=shape.grid):
            return _grid

        grids = [("tuple", shape.grid, None), ("callable", callable_grid, None)]
        tutorial = tutorial_grid(shape)
        if tutorial is not None:  # Triton's own triton.cdiv, then fastkernel's host helpers
            grids += [("tutorial", tutorial, _host_helpers.uninstall),
                      ("tutorial+helpers", tutorial, _host_helpers.install)]
        for grid_kind, grid, switch in grids:
            if switch is not None:
                switch()
            for _ in range(_CALLGRIND_WARMUP):
                fk[grid](*args)
            drv.reset()
            hits_before = fk.stats()["hits"]
            _C.bench_call_loop(fk, grid, args, opts.hits)  # collected, then dumped
            hits = fk.stats()["hits"] - hits_before
            loops.append({"shape": shape.name, "grid": grid_kind, "num_args": shape.num_args,
                          "num_tensors": shape.num_tensors, "hits": hits,
                          "launches": drv.launch_count()})
        _host_helpers.uninstall()
        # The same kernel as a plain Triton JITFunction under fastkernel.patch(), tuple grid.
        with patched():
            shape.kernel[shape.grid](*args)  # its dispatch's miss (warm index and disk cache)
            dispatch = shape.kernel.__dict__[PATCH_ATTR]
            for _ in range(_CALLGRIND_WARMUP):
                shape.kernel[shape.grid](*args)
            drv.reset()
            hits_before = dispatch.stats()["hits"]
            _C.bench_call_loop(shape.kernel, shape.grid, args, opts.hits)
            loops.append({"shape": shape.name, "grid": "patched", "num_args": shape.num_args,
                          "num_tensors": shape.num_tensors,
                          "hits": dispatch.stats()["hits"] - hits_before,
                          "launches": drv.launch_count()})
    _C._testing.set_host_testing(False, 0, 0)
    with open(opts.manifest, "w") as f:
        json.dump({"loops": loops, "hits_requested": opts.hits}, f)
    return 0


def _dump_index(path: pathlib.Path) -> int:
    suffix = path.name.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def run_callgrind(opts: argparse.Namespace, repo: Optional[pathlib.Path]) -> int:
    """Instructions per hit per shape under callgrind, with the function-group breakdown."""
    from ._bench_kernels import SHAPES, autotuned_call
    from .kernel import FastKernel

    valgrind, annotate = _tool("valgrind"), _tool("callgrind_annotate")
    if valgrind is None or annotate is None:
        print("error: --callgrind needs valgrind and callgrind_annotate on PATH", file=sys.stderr)
        return 2
    try:
        drv = use_stand_in_driver(repo)
    except StandInUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    hits = opts.iterations if opts.iterations is not None else _CALLGRIND_HITS
    print("callgrind: building an unstripped, non-LTO copy of the extension (same sources, -O3) "
          "in build/callgrind-profile, so that function names survive", flush=True)
    try:
        extension = build_profile_extension(repo)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Compiling under valgrind would take minutes: fill Triton's disk cache natively first.
    for shape in SHAPES:
        FastKernel(shape.kernel)[shape.grid](*shape.make_args("cpu"))
    drv.reset()

    with tempfile.TemporaryDirectory(prefix="fastkernel-callgrind-") as tmp:
        tmp_dir = pathlib.Path(tmp)
        manifest_path = tmp_dir / "manifest.json"
        cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no",
               f"--toggle-collect={_TOGGLE}", f"--dump-after={_TOGGLE}",
               f"--callgrind-out-file={tmp_dir / 'callgrind.out'}",
               sys.executable, "-c", _CHILD_BOOTSTRAP, str(extension),
               "--hits", str(hits), "--manifest", str(manifest_path), "--repo", str(repo)]
        print(f"callgrind: {hits} hits per shape and grid kind under valgrind (importing torch "
              f"under valgrind takes about a minute)", flush=True)
        start = time.monotonic()
        # A fixed hash seed keeps dict layouts, hence the callable-grid counts, the same run to run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not manifest_path.is_file():
            print(f"error: the callgrind run failed (exit {proc.returncode}):\n"
                  f"{(proc.stdout + proc.stderr)[-4000:]}", file=sys.stderr)
            return 1
        print(f"callgrind: done in {time.monotonic() - start:.0f} s")
        manifest = json.loads(manifest_path.read_text())
        dumps = sorted((p for p in tmp_dir.glob("callgrind.out.*") if _dump_index(p) > 0),
                       key=_dump_index)
        loops = manifest["loops"]
        if len(dumps) != len(loops):
            print(f"error: expected {len(loops)} callgrind dumps, found {len(dumps)}",
                  file=sys.stderr)
            return 1
        for loop, dump in zip(loops, dumps):
            out = subprocess.run([annotate, "--inclusive=yes", "--threshold=100", str(dump)],
                                 capture_output=True, text=True, check=True).stdout
            total, functions = parse_annotate_output(out)
            if total is None or loop["hits"] <= 0:
                print(f"error: no counts for {loop['shape']} ({loop['grid']} grid)",
                      file=sys.stderr)
                return 1
            loop["instructions_per_hit"] = breakdown(total, functions, loop["hits"])

    _print_callgrind(loops)
    env = bench.environment("callgrind", None)
    report = {
        "environment": env,
        "method": {"tool": "valgrind --tool=callgrind", "collected_in": _TOGGLE,
                   "extension": "profiling build: -O3, no LTO, unstripped",
                   "driver": "recording stand-in (tests/stand_in_driver)",
                   "hits_per_loop": hits, "groups": dict(GROUP_SYMBOLS)},
        "loops": loops,
    }
    out_dir = bench.results_dir(opts.out, repo)
    path = out_dir / f"callgrind-{env['date'][:10]}.json"
    bench.write_json(path, report)
    print(f"\nresults: {path}")
    ok = all(loop["hits"] == hits and loop["launches"] == hits for loop in loops)
    if not ok:
        print("WARNING: not every collected call was a fastkernel hit that launched")
    return 0 if ok else 1


def _print_callgrind(loops: List[Dict[str, Any]]) -> None:
    columns = ["total", "fastkernel", "entry", "key build", "lookup", "stream query", "packing",
               "driver call"]
    print("\ninstructions per hit (callgrind; driver call = the stand-in's cuLaunchKernel; "
          "fastkernel = total less the driver call; entry = Python to native, grid and glue):")
    head = f"  {'shape':<12}{'grid':<18}" + "".join(f"{c:>14}" for c in columns)
    print(head)
    print("  " + "-" * (len(head) - 2))
    for loop in loops:
        per = loop["instructions_per_hit"]
        cells = "".join(f"{'n/a' if per[c] is None else format(per[c], '.0f'):>14}"
                        for c in columns)
        print(f"  {loop['shape']:<12}{loop['grid']:<18}{cells}")
    own = {(l["shape"], l["grid"]): l["instructions_per_hit"]["fastkernel"] for l in loops}
    for kind, label in (("callable", "a callable grid"),
                        ("tutorial", "a tutorial grid with Triton's triton.cdiv"),
                        ("tutorial+helpers", "a tutorial grid with the host helpers")):
        extra = [f"{shape}: {own[(shape, kind)] - own[(shape, 'tuple')]:.0f}"
                 for shape, grid in own if grid == "tuple" and (shape, kind) in own]
        if extra:
            print(f"{label} adds (fastkernel's instructions per hit, over the tuple grid): "
                  + "  ".join(extra))
    ratios = [f"{shape}: {own[(shape, 'patched')] / own[(shape, 'tuple')]:.3f}"
              for shape, grid in own if grid == "tuple" and (shape, "patched") in own
              and own[(shape, "tuple")]]
    if ratios:
        print("patched Triton kernel / @fastkernel kernel (fastkernel's own instructions per hit, "
              "tuple grid; the stand-in driver's share varies run to run): " + "  ".join(ratios))
