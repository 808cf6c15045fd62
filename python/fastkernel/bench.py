"""``python -m fastkernel bench``: per-call dispatch cost of fastkernel against the alternatives.

The method is the one in the design brief (``DESIGN.md``, "How to measure dispatch cost"):
wall-clock time per call over a steady-state loop of many calls of a tiny kernel, after a
warm-up, synchronizing before each clock read; the median of several repeats; every system in
the same process and run, repeats interleaved across systems. The loop is CPU-bound, so it
measures how long a call takes to issue, not how long the kernel runs.

With a GPU, each shape of :mod:`fastkernel._bench_kernels` is timed through:

``floor``
    a C++ loop of raw ``cuLaunchKernel`` on Triton's cubin with the parameter bytes Triton
    passes (``fastkernel._C.BenchFloor``, the loaded-once form of ``_C.bench_floor``);
``triton_run``
    Triton's ``CompiledKernel.run`` called directly, as ``JITFunction.run`` calls it;
``triton``
    Triton's ``kernel[grid](...)``;
``fastkernel`` / ``fastkernel_callable``
    ``@fastkernel`` with a tuple grid and with a callable grid;
``inductor_static``
    torch Inductor's static CUDA launcher, where the installed torch has a usable one;
``cuda_graph``
    a CUDA graph replay of the same launches, per launch (the amortized reference).

It also times a miss that only registers a new specialization from Triton's on-disk cache,
and the first call of a freshly decorated kernel. Output: a table (microseconds per call and
the ratio to the floor), a JSON file and, when matplotlib imports, a PNG plot.

Without a GPU (or with ``--host``) it runs the host-side part instead, against the recording
stand-in driver from the repository's tests (see :mod:`fastkernel._bench_host`); ``--callgrind``
counts instructions per hit under valgrind.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: Systems in table and plot order, with their labels.
SYSTEM_LABELS: Dict[str, str] = {
    "floor": "floor: C++ cuLaunchKernel loop",
    "triton_run": "Triton CompiledKernel.run",
    "triton": "Triton kernel[grid]",
    "fastkernel": "fastkernel, tuple grid",
    "fastkernel_callable": "fastkernel, callable grid",
    "fastkernel_tutorial": "fastkernel, tutorial grid (triton.cdiv), Triton's cdiv",
    "fastkernel_tutorial_helpers": "fastkernel, tutorial grid, host helpers on",
    "fastkernel_autotuned": "fastkernel.autotune, tuned hit",
    "fastkernel_cpp": "fastkernel C++ Bundle::launch",
    "inductor_static": "Inductor static CUDA launcher",
    "cuda_graph": "CUDA graph replay, per launch",
}

#: Launches captured in one CUDA graph for the amortized reference.
GRAPH_LAUNCHES = 100

# (iterations per repeat, repeats) by mode; --iterations / --repeats override them.
_GPU_DEFAULTS = (10000, 7)
_GPU_QUICK = (2000, 3)
# The stand-in records 4096 launches; staying under that keeps every timed launch identical.
_HOST_DEFAULTS = (4000, 15)
_HOST_QUICK = (1000, 5)
# Misses and first calls are milliseconds each: a few samples suffice.
_COLD_REPEATS = 5
_COLD_REPEATS_QUICK = 2


# ---- timing -----------------------------------------------------------------------------------


class Timed:
    """One system's timed loop.

    Parameters
    ----------
    loop : callable
        ``loop(n)`` makes ``n`` iterations; each iteration issues ``launches_per_iteration``
        launches.
    launches_per_iteration : int
        Launches per iteration (> 1 only for a CUDA graph replay).
    prepare : callable, optional
        Run before each loop of this system, outside the timing.
    """

    def __init__(self, loop: Callable[[int], Any], launches_per_iteration: int = 1,
                 prepare: Optional[Callable[[], None]] = None):
        self.loop = loop
        self.launches_per_iteration = launches_per_iteration
        #: Runs before each of this system's loops, outside the timing (for instance, switching
        #: fastkernel's host helpers on or off).
        self.prepare = prepare

    def iterations_for(self, launches: int) -> int:
        """Iterations giving about ``launches`` launches (at least one)."""
        return max(1, launches // self.launches_per_iteration)


def time_systems(systems: Dict[str, Timed], launches: int, repeats: int,
                 sync: Callable[[], None],
                 before_repeat: Optional[Callable[[], None]] = None) -> Dict[str, List[float]]:
    """Time each system's steady-state loop; returns microseconds per launch, one per repeat.

    Every system is warmed up first; then each repeat times every system once, in turn, so
    slow drift of the machine affects all systems alike. ``sync`` runs before each clock read
    (``torch.cuda.synchronize`` on a GPU). ``before_repeat`` runs before each timed loop, outside
    the timing (the host-side benchmark resets the stand-in driver's record there). The garbage
    collector is off while loops run.

    Parameters
    ----------
    systems : dict of str to Timed
    launches : int
        Launches per timed loop.
    repeats : int
        Timed loops per system.
    sync : callable
    before_repeat : callable, optional

    Returns
    -------
    dict of str to list of float
        Per system, microseconds per launch of each repeat.
    """
    warmup = max(50, launches // 5)
    samples: Dict[str, List[float]] = {name: [] for name in systems}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for timed in systems.values():
            if before_repeat is not None:
                before_repeat()
            if timed.prepare is not None:
                timed.prepare()
            timed.loop(timed.iterations_for(warmup))
            sync()
        for _ in range(repeats):
            for name, timed in systems.items():
                if before_repeat is not None:
                    before_repeat()
                if timed.prepare is not None:
                    timed.prepare()
                n = timed.iterations_for(launches)
                sync()
                start = time.perf_counter_ns()
                timed.loop(n)
                sync()
                elapsed = time.perf_counter_ns() - start
                samples[name].append(elapsed / 1e3 / (n * timed.launches_per_iteration))
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def time_single_calls(prepare: Callable[[], Callable[[], Any]], repeats: int,
                      sync: Callable[[], None]) -> List[float]:
    """Microseconds of single cold calls: ``prepare()`` (untimed) returns the call to time."""
    samples = []
    for _ in range(repeats):
        sync()  # nothing in flight while prepare() unloads or replaces modules
        call = prepare()
        sync()
        start = time.perf_counter_ns()
        call()
        sync()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return samples


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return statistics.median(values) if values else float("nan")


# ---- the parameter bytes Triton passes ------------------------------------------------------

# struct formats of Triton's scalar signature types (driver.c packs i1/u1 in 4-byte slots).
_SCALAR_FORMATS = {
    "i1": "<i", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q",
    "u1": "<I", "u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q",
    "fp32": "<f", "f32": "<f", "fp64": "<d",
}


def triton_param_bytes(compiled, args: Sequence[Any]) -> List[bytes]:
    """The parameter bytes Triton's launcher passes to ``cuLaunchKernel`` for ``args``.

    Walks the compiled kernel's signature (``CompiledKernel.src.signature``: one Triton type per
    declared parameter, ``"constexpr"`` for those compiled in), packs each remaining parameter
    (pointers as the tensor's 8-byte address, scalars per ``_SCALAR_FORMATS``), then appends the
    scratch pointers the installed Triton passes (NULL, since these kernels need no scratch).

    Parameters
    ----------
    compiled : triton.compiler.CompiledKernel
    args : sequence
        Every declared argument in order, constexprs included (as ``JITFunction.run`` binds them).

    Returns
    -------
    list of bytes
        One entry per kernel parameter, in order.

    Raises
    ------
    ValueError
        For parameter types the benchmark does not pack, or a kernel that needs scratch memory.
    """
    from . import _triton_abi as abi
    signature = list(compiled.src.signature.values())
    if len(signature) != len(args):
        raise ValueError(f"{compiled.name}: {len(args)} arguments for {len(signature)} parameters")
    params = []
    for ty, value in zip(signature, args):
        if ty == "constexpr":
            continue
        if isinstance(ty, str) and ty.startswith("*"):
            params.append(struct.pack("<Q", 0 if value is None else value.data_ptr()))
        elif ty in _SCALAR_FORMATS:
            params.append(struct.pack(_SCALAR_FORMATS[ty], value))
        else:
            raise ValueError(f"{compiled.name}: the benchmark floor does not pack type {ty!r}")
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise ValueError(f"{compiled.name} needs scratch memory; the floor passes none")
    params.extend(bytes(8) for _ in range(abi.num_scratch_params()))
    return params


def floor_timed(compiled, args: Sequence[Any], grid: Tuple[int, ...], device: int,
                stream: int) -> Timed:
    """The floor for one shape: ``_C.BenchFloor`` on Triton's cubin and parameter bytes.

    The cubin is loaded here, once; the timed loop is only ``cuLaunchKernel`` calls.
    """
    from . import _C
    md = compiled.metadata
    launcher = _C.BenchFloor(compiled.asm["cubin"], md.name, device, 32 * md.num_warps,
                             md.shared, triton_param_bytes(compiled, args))
    grid3 = (tuple(grid) + (1, 1))[:3]

    def loop(n: int) -> None:
        launcher.run(grid3, stream, n)

    return Timed(loop)


def bundle_timed(fk, args: Sequence[Any], grid: Tuple[int, ...], device: int, stream: int,
                 directory: pathlib.Path) -> Timed:
    """The C++ row: ``fk``'s registered specializations exported as a bundle
    (``fastkernel.export``) and launched by a C++ loop of ``fastkernel::Bundle::launch`` with
    the call's runtime arguments (``_C.BenchBundle``)."""
    import torch

    from . import _C
    from .bundle import export
    export(fk, directory)
    spec = []
    for param, value in zip(fk.jit_function.params, args):
        if param.is_constexpr:
            continue
        if isinstance(value, torch.Tensor):
            spec.append(("pointer", value.data_ptr()))
        elif value is None:
            spec.append(("none", 0))
        else:
            spec.append(({bool: "bool", int: "int", float: "float"}[type(value)], value))
    launcher = _C.BenchBundle(str(directory), fk.jit_function.__name__, device, spec)
    grid3 = (tuple(grid) + (1, 1))[:3]

    def loop(n: int) -> None:
        launcher.run(grid3, stream, n)

    return Timed(loop)


def tutorial_grid_systems(fk, shape, args: tuple) -> Dict[str, "Timed"]:
    """The shape's kernel with the grid Triton's tutorials write,
    ``lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)``, with Triton's own
    ``triton.cdiv`` and with fastkernel's host helpers installed (switched before each loop,
    outside the timing; left off). Empty for shapes without ``n`` and ``BLOCK``."""
    from . import _host_helpers
    from ._bench_kernels import tutorial_grid
    grid = tutorial_grid(shape)
    if grid is None:
        return {}
    return {
        "fastkernel_tutorial": Timed(call_loop(fk, grid, args), prepare=_host_helpers.uninstall),
        "fastkernel_tutorial_helpers": Timed(call_loop(fk, grid, args),
                                             prepare=_host_helpers.install),
    }


def call_loop(launcher, grid, args: tuple) -> Callable[[int], None]:
    """``n`` calls of ``launcher[grid](*args)``, the way user code writes them."""
    def loop(n: int) -> None:
        for _ in range(n):
            launcher[grid](*args)
    return loop


def triton_systems(jit, compiled, grid, args: tuple, stream: int) -> Dict[str, "Timed"]:
    """Triton's own dispatch: ``kernel[grid](*args)`` (``triton``) and the compiled kernel's
    ``run`` with the launch facts already in hand (``triton_run``), for a kernel ``jit`` whose
    ``compiled`` specialization a first ``jit[grid](*args)`` returned."""
    g = (tuple(grid) + (1, 1))[:3]
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata

    def triton_run_loop(n: int, run=run, function=function, packed=packed, args=args,
                        g0=g[0], g1=g[1], g2=g[2]) -> None:
        for _ in range(n):
            run(g0, g1, g2, stream, function, packed, None, None, None, *args)

    return {"triton_run": Timed(triton_run_loop), "triton": Timed(call_loop(jit, grid, args))}


# ---- environment ------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_api_version(library: str) -> Optional[str]:
    """``cuDriverGetVersion`` of the driver library at ``library`` as "major.minor", or None."""
    try:
        lib = ctypes.CDLL(library)
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def nvidia_driver_release() -> Optional[str]:
    """The NVIDIA kernel driver release (``nvidia-smi``), or None where it cannot be read."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def environment(mode: str, device: Optional[int]) -> Dict[str, Any]:
    """What a result depends on: device, driver, CUDA, library versions, CPU and date."""
    import torch
    import triton

    from . import _C, __version__
    env: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fastkernel": __version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cuda_version": torch.version.cuda,
        "driver_library": _C.driver_library_path(),
        "driver_version": driver_api_version(_C.driver_library_path()),
    }
    if mode == "gpu" and device is not None:
        env["device"] = torch.cuda.get_device_name(device)
        env["capability"] = "%d.%d" % torch.cuda.get_device_capability(device)
        env["nvidia_driver"] = nvidia_driver_release()
    else:
        env["device"] = "none: host-side run against the recording stand-in driver"
    return env


# ---- reporting --------------------------------------------------------------------------------


def slug(text: str) -> str:
    """``text`` reduced to a file-name-safe lowercase token."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def results_dir(out: Optional[str], repo: Optional[pathlib.Path]) -> pathlib.Path:
    """``--out``, else ``benchmarks/results`` of the checkout, else of the working directory."""
    if out:
        path = pathlib.Path(out)
    elif repo is not None:
        path = repo / "benchmarks" / "results"
    else:
        path = pathlib.Path("benchmarks") / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def format_table(rows: List[Dict[str, Any]], shapes: List[str], systems: List[str],
                 labels: Dict[str, str], unit: str = "us") -> str:
    """A systems x shapes table of median time per call and its ratio to the floor.

    ``rows`` are result records (``shape``, ``system``, ``us_per_call``, ``ratio_to_floor``);
    ``unit`` is ``"us"`` or ``"ns"``.
    """
    scale = 1e3 if unit == "ns" else 1.0
    cell: Dict[Tuple[str, str], Dict[str, Any]] = {(r["system"], r["shape"]): r for r in rows}
    label_width = max(len(labels.get(s, s)) for s in systems)
    col = 17
    head = f"{unit + '/call (x floor)':<{label_width}}" + "".join(f"{s:>{col}}" for s in shapes)
    lines = [head, "-" * len(head)]
    for system in systems:
        line = f"{labels.get(system, system):<{label_width}}"
        for shape in shapes:
            r = cell.get((system, shape))
            if r is None:
                line += f"{'-':>{col}}"
                continue
            value = f"{r['us_per_call'] * scale:.{0 if unit == 'ns' else 2}f}"
            ratio = r.get("ratio_to_floor")
            text = f"{value} ({ratio:.2f})" if ratio is not None else value
            line += f"{text:>{col}}"
        lines.append(line)
    return "\n".join(lines)


def result_rows(shape_results: Dict[str, Dict[str, List[float]]],
                shape_info: Dict[str, Dict[str, int]]) -> List[Dict[str, Any]]:
    """Flatten per-shape samples into records with medians and ratios to the floor."""
    rows = []
    for shape, samples in shape_results.items():
        floor = median(samples["floor"]) if "floor" in samples else None
        for system, values in samples.items():
            us = median(values)
            rows.append({
                "shape": shape,
                **shape_info[shape],
                "system": system,
                "us_per_call": us,
                "ratio_to_floor": us / floor if floor else None,
                "samples_us": values,
            })
    return rows


def write_json(path: pathlib.Path, report: Dict[str, Any]) -> None:
    """Write ``report`` as indented JSON."""
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")


def write_plot(path: pathlib.Path, rows: List[Dict[str, Any]], systems: List[str],
               labels: Dict[str, str], title: str, unit: str = "us") -> bool:
    """Plot time per call against the shapes in argument-count order, one line per system;
    False without matplotlib (it is not a dependency of fastkernel)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scale = 1e3 if unit == "ns" else 1.0
    # Shapes evenly spaced in argument-count order: 18 and 19 arguments would otherwise collide.
    shapes = sorted({(r["num_args"], r["shape"]) for r in rows})
    position = {shape: i for i, (_, shape) in enumerate(shapes)}
    fig, ax = plt.subplots(figsize=(8, 5))
    for system in systems:
        points = sorted((position[r["shape"]], r["us_per_call"] * scale)
                        for r in rows if r["system"] == system)
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                label=labels.get(system, system))
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{s}\n{a} args" for a, s in shapes], fontsize=8)
    ax.set_xlabel("call shape (arguments per call)")
    ax.set_ylabel(f"{unit} per call (median)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def check_targets(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The dispatch targets, each with the measured value and whether met.

    Ratios: fastkernel tuple grid <= 1.20 x floor at 0-2 tensors and <= 1.35 x at 16 tensors and
    the 19-argument shape; Triton ``kernel[grid]`` / fastkernel >= 4 at 2 tensors; fastkernel
    faster than ``CompiledKernel.run`` at every shape; a callable grid adds <= 0.3 us.
    """
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    targets = []

    def add(text: str, value: Optional[float], limit: float, at_most: bool) -> None:
        if value is None:
            return
        met = value <= limit if at_most else value >= limit
        targets.append({"target": text, "measured": value, "met": met})

    def ratio(shape: str, a: str, b: str) -> Optional[float]:
        if (shape, a) in us and (shape, b) in us:
            return us[(shape, a)] / us[(shape, b)]
        return None

    for shape, limit in (("nop-0", 1.20), ("add-2", 1.20), ("add-16", 1.35), ("overhead-19", 1.35)):
        add(f"fastkernel / floor at {shape} <= {limit:.2f}", ratio(shape, "fastkernel", "floor"),
            limit, True)
    add("Triton kernel[grid] / fastkernel at add-2 >= 4", ratio("add-2", "triton", "fastkernel"),
        4.0, False)
    for shape in dict.fromkeys(shape for shape, _ in us):
        add(f"fastkernel / CompiledKernel.run at {shape} < 1",
            ratio(shape, "fastkernel", "triton_run"), 1.0, True)
        if (shape, "fastkernel_cpp") in us and (shape, "floor") in us:
            add(f"C++ Bundle::launch - floor at {shape} <= 0.15 us",
                us[(shape, "fastkernel_cpp")] - us[(shape, "floor")], 0.15, True)
        if (shape, "fastkernel_autotuned") in us and (shape, "fastkernel") in us:
            add(f"autotuned hit / plain hit at {shape} <= 1.10",
                ratio(shape, "fastkernel_autotuned", "fastkernel"), 1.10, True)
        if (shape, "fastkernel_callable") in us and (shape, "fastkernel") in us:
            add(f"callable grid - tuple grid at {shape} <= 0.30 us",
                us[(shape, "fastkernel_callable")] - us[(shape, "fastkernel")], 0.30, True)
    return targets


def finish_report(report: Dict[str, Any], out_dir: pathlib.Path, stem: str,
                  systems: List[str], labels: Dict[str, str], unit: str) -> pathlib.Path:
    """Print the table, write the JSON and the plot; returns the JSON path."""
    rows = report["results"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    present = [s for s in systems if any(r["system"] == s for r in rows)]
    print()
    print(format_table(rows, shapes, present, labels, unit))
    json_path = out_dir / f"{stem}.json"
    write_json(json_path, report)
    print(f"\nresults: {json_path}")
    env = report["environment"]
    title = (f"dispatch cost per call: {env['device']}\n"
             f"torch {env['torch']}, Triton {env['triton']}, fastkernel {env['fastkernel']}, "
             f"{env['date'][:10]}")
    png = out_dir / f"{stem}.png"
    if write_plot(png, rows, present, labels, title, unit):
        print(f"plot:    {png}")
    return json_path


# ---- the GPU benchmark ------------------------------------------------------------------------


def _inductor_static_launcher():
    """torch Inductor's static CUDA launcher class, or (None, why it is absent)."""
    import importlib
    errors = []
    # The module was renamed from static_cuda_launcher when it grew an XPU variant.
    for module in ("torch._inductor.runtime.static_triton_launcher",
                   "torch._inductor.runtime.static_cuda_launcher"):
        try:
            return importlib.import_module(module).StaticallyLaunchedCudaKernel, None
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}: {exc}")
    return None, "; ".join(errors)


def inductor_static_timed(compiled, args: tuple, grid: Tuple[int, ...], device: int,
                          stream: int, scratch_dir: str) -> Tuple[Optional[Timed], Optional[str]]:
    """Inductor's static launcher for one compiled kernel, or (None, why it cannot be used).

    Follows ``CachingAutotuner``'s use in torch/_inductor/runtime/triton_heuristics.py: the
    cubin is written to a file (``CompiledKernel._cubin_path``), loaded with ``load_kernel``, and
    ``run(grid_0, grid_1, grid_2, stream, *args)`` is called with the constexprs dropped.
    """
    cls, why = _inductor_static_launcher()
    if cls is None:
        return None, f"not in this torch ({why})"
    try:
        path = os.path.join(scratch_dir, f"{compiled.hash}-{compiled.name}.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        compiled._cubin_path = path
        static = cls(compiled)
        static.load_kernel(device)
        constexprs = set(static.full_constexprs)
        call_args = tuple(a for i, a in enumerate(args) if i not in constexprs)
        g = (tuple(grid) + (1, 1))[:3]
        static.run(g[0], g[1], g[2], stream, *call_args)
    except Exception as exc:  # any failure means "unusable here"; the reason is reported
        return None, f"unusable: {type(exc).__name__}: {exc}"
    run = static.run
    g0, g1, g2 = g

    def loop(n: int) -> None:
        for _ in range(n):
            run(g0, g1, g2, stream, *call_args)

    return Timed(loop), None


def graph_timed(launch: Callable[[], Any], launches: int) -> Timed:
    """A CUDA graph of ``launches`` calls of ``launch``; one iteration is one replay."""
    import torch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            launch()
    torch.cuda.synchronize()

    def loop(n: int) -> None:
        for _ in range(n):
            graph.replay()

    return Timed(loop, launches_per_iteration=launches)


def run_gpu(opts: argparse.Namespace, repo: Optional[pathlib.Path]) -> int:
    """Time every system on every shape on the current CUDA device; write the report."""
    import torch

    from ._bench_kernels import SHAPES, autotuned_call
    from .kernel import FastKernel

    iterations, repeats = _mode_counts(opts, _GPU_QUICK if opts.quick else _GPU_DEFAULTS)
    cold_repeats = _COLD_REPEATS_QUICK if opts.quick else _COLD_REPEATS
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    sync = torch.cuda.synchronize
    env = environment("gpu", device)
    print(f"fastkernel dispatch benchmark on {env['device']} (driver {env['driver_version']}, "
          f"CUDA {env['cuda_version']}); {iterations} calls x {repeats} repeats per system")

    shape_results: Dict[str, Dict[str, List[float]]] = {}
    shape_info: Dict[str, Dict[str, int]] = {}
    cold: Dict[str, Dict[str, float]] = {}
    absent: Dict[str, str] = {}
    fast_path: Dict[str, Dict[str, Any]] = {}
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

            def callable_grid(meta, _grid=grid):
                return _grid

            systems: Dict[str, Timed] = {
                "floor": floor_timed(compiled, args, grid, device, stream),
                **triton_systems(jit, compiled, grid, args, stream),
                "fastkernel": Timed(call_loop(fk, grid, args)),
                "fastkernel_callable": Timed(call_loop(fk, callable_grid, args)),
                **tutorial_grid_systems(fk, shape, args),
            }
            tuned = autotuned_call(shape, "cuda")
            if tuned is not None:
                systems["fastkernel_autotuned"] = Timed(call_loop(tuned[0], grid, tuned[1]))
            systems["fastkernel_cpp"] = bundle_timed(fk, args, grid, device, stream,
                                                     pathlib.Path(scratch_dir) / shape.name)
            static, why = inductor_static_timed(compiled, args, grid, device, stream, scratch_dir)
            if static is not None:
                systems["inductor_static"] = static
            else:
                absent["inductor_static"] = why
            try:
                systems["cuda_graph"] = graph_timed(lambda: jit[grid](*args), GRAPH_LAUNCHES)
            except Exception as exc:  # reported, and the other systems still run
                absent["cuda_graph"] = f"capture failed: {type(exc).__name__}: {exc}"

            before = fk.stats()
            shape_results[shape.name] = time_systems(systems, iterations, repeats, sync)
            after = fk.stats()
            fast_path[shape.name] = _fast_path_record(before, after)
            shape_info[shape.name] = {"num_args": shape.num_args, "num_tensors": shape.num_tensors}
            cold[shape.name] = _gpu_cold_costs(fk, jit, shape, args, cold_repeats, sync)

    for system, why in absent.items():
        print(f"{SYSTEM_LABELS[system]}: absent ({why})")
    from . import _bench_warm
    warm = _bench_warm.measure(host=False, repeats=1 if opts.quick else 3)
    rows = result_rows(shape_results, shape_info)
    report = {
        "environment": env,
        "method": _method(iterations, repeats),
        "systems": {k: v for k, v in SYSTEM_LABELS.items()},
        "absent": absent,
        "results": rows,
        "cold_us": cold,
        "fastkernel_path": fast_path,
        "warm_start": warm,
        "targets": check_targets(rows),
    }
    if warm["warm_speedup"] is not None:
        report["targets"].append({"target": "Triton warm first call / fastkernel warm first call >= 10",
                                  "measured": warm["warm_speedup"],
                                  "met": warm["warm_speedup"] >= 10.0})
    stem = f"dispatch-{slug(env['device'])}-{env['date'][:10]}"
    finish_report(report, results_dir(opts.out, repo), stem, list(SYSTEM_LABELS), SYSTEM_LABELS,
                  "us")
    _print_cold(cold, "us")
    _bench_warm.print_report(warm)
    _print_fast_path(fast_path)
    _print_floor_vs_graph(rows)
    print("\ntargets:")
    for t in report["targets"]:
        print(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['measured']:.2f}")
    return 0 if _all_hits(fast_path) else 1


def _gpu_cold_costs(fk, jit, shape, args: tuple, repeats: int,
                    sync: Callable[[], None]) -> Dict[str, float]:
    """Median microseconds of a miss served from Triton's on-disk cache and of a first call."""
    import triton

    from . import _C
    from .kernel import FastKernel
    grid = shape.grid

    def fastkernel_miss():
        _C.clear(fk)  # drops the launch records: the next call registers again from the cache
        return lambda: fk[grid](*args)

    def fastkernel_first():
        fresh = FastKernel(triton.jit(jit.fn))
        return lambda: fresh[grid](*args)

    def triton_first():
        fresh = triton.jit(jit.fn)
        return lambda: fresh[grid](*args)

    costs = {
        "fastkernel_miss_from_disk_cache": median(
            time_single_calls(fastkernel_miss, repeats, sync)),
        "fastkernel_first_call": median(time_single_calls(fastkernel_first, repeats, sync)),
        "triton_first_call": median(time_single_calls(triton_first, repeats, sync)),
    }
    if hasattr(jit, "device_caches"):
        def triton_miss():
            jit.device_caches.clear()  # Triton's in-process caches; the binary stays on disk
            return lambda: jit[grid](*args)
        costs["triton_miss_from_disk_cache"] = median(time_single_calls(triton_miss, repeats, sync))
    return costs


# ---- shared helpers ---------------------------------------------------------------------------


def _mode_counts(opts: argparse.Namespace, defaults: Tuple[int, int]) -> Tuple[int, int]:
    iterations = opts.iterations if opts.iterations is not None else defaults[0]
    repeats = opts.repeats if opts.repeats is not None else defaults[1]
    return iterations, repeats


def _method(iterations: int, repeats: int) -> Dict[str, Any]:
    return {
        "statistic": "median over repeats of wall time per call",
        "calls_per_repeat": iterations,
        "repeats": repeats,
        "sync_before_clock": True,
        "graph_launches": GRAPH_LAUNCHES,
    }


def _fast_path_record(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """fastkernel's counters over a timed section: hits, misses and fallbacks it made."""
    return {
        "hits": after["hits"] - before["hits"],
        "misses": after["misses"] - before["misses"],
        "fallbacks": after["fallbacks"] - before["fallbacks"],
        "fallback_reasons": after.get("fallback_reasons", {}),
    }


def _all_hits(fast_path: Dict[str, Dict[str, Any]]) -> bool:
    return all(r["hits"] > 0 and r["misses"] == 0 and r["fallbacks"] == 0
               for r in fast_path.values())


def _print_fast_path(fast_path: Dict[str, Dict[str, Any]]) -> None:
    for shape, r in fast_path.items():
        if r["hits"] == 0 or r["misses"] or r["fallbacks"]:
            print(f"WARNING: {shape}: the native path did not serve every timed fastkernel call "
                  f"(hits {r['hits']}, misses {r['misses']}, fallbacks {r['fallbacks']}, "
                  f"reasons {r['fallback_reasons']})")


def _print_cold(cold: Dict[str, Dict[str, float]], unit: str) -> None:
    if not cold:
        return
    names = list(dict.fromkeys(k for costs in cold.values() for k in costs))
    print("\nmisses and first calls, us (median):")
    width = max(len(n) for n in names)
    print(f"  {'':<{width}}" + "".join(f"{s:>13}" for s in cold))
    for name in names:
        print(f"  {name:<{width}}" + "".join(
            f"{cold[s].get(name, float('nan')):>13.0f}" for s in cold))


def _print_floor_vs_graph(rows: List[Dict[str, Any]]) -> None:
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    close = [shape for (shape, system), value in us.items()
             if system == "floor" and (shape, "cuda_graph") in us
             and value <= 1.1 * us[(shape, "cuda_graph")]]
    if close:
        print(f"note: the floor is within 10% of CUDA graph replay at {', '.join(close)}: there "
              f"the GPU's run time, not the launch, may bound the floor, which compresses ratios")


# ---- entry point ------------------------------------------------------------------------------


def find_repo_root(explicit: Optional[str] = None) -> Optional[pathlib.Path]:
    """The fastkernel checkout holding ``tests/stand_in_driver``, or None.

    Looked for in ``explicit`` (``--repo``), above this file (a source checkout or editable
    install), and in the working directory and its parents.
    """
    if explicit:
        candidates = [pathlib.Path(explicit).resolve()]
    else:
        here = pathlib.Path(__file__).resolve()
        cwd = pathlib.Path.cwd().resolve()
        candidates = [here.parents[2], cwd, *cwd.parents]
    for path in candidates:
        if (path / "tests" / "stand_in_driver" / "recording.py").is_file():
            return path
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastkernel bench",
        description="Per-call dispatch cost of fastkernel against raw cuLaunchKernel, Triton, "
                    "Inductor's static launcher and CUDA graphs (host-side only without a GPU).")
    parser.add_argument("--iterations", type=int, default=None, metavar="N",
                        help="calls per timed loop (default: 10000 on a GPU, 4000 host-side; "
                             "hits per shape under --callgrind, default 1000)")
    parser.add_argument("--repeats", type=int, default=None, metavar="R",
                        help="timed loops per system; the median is reported "
                             "(default: 7 on a GPU, 15 host-side)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="directory for the JSON and PNG (default: benchmarks/results of the "
                             "checkout)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer calls and repeats (2000 x 3 on a GPU, 1000 x 5 host-side)")
    parser.add_argument("--host", action="store_true",
                        help="run the host-side part against the recording stand-in driver even "
                             "when a GPU is present")
    parser.add_argument("--callgrind", action="store_true",
                        help="count instructions per hit under valgrind --tool=callgrind "
                             "(host-side, deterministic), with a breakdown by function group")
    parser.add_argument("--repo", default=None, metavar="DIR",
                        help="the fastkernel checkout holding tests/stand_in_driver (default: "
                             "found from this file or the working directory)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the dispatch benchmark; ``argv`` as after ``python -m fastkernel bench``.

    Returns
    -------
    int
        0 on success; 1 when fastkernel's native path did not serve the timed calls; 2 when
        the host-side part cannot run (no checkout with the stand-in driver, no valgrind).
    """
    opts = build_parser().parse_args(argv)
    for name in ("iterations", "repeats"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            print(f"--{name} must be >= 1", file=sys.stderr)
            return 2
    repo = find_repo_root(opts.repo)
    if opts.callgrind:
        from . import _bench_host
        return _bench_host.run_callgrind(opts, repo)
    import torch
    if opts.host or not torch.cuda.is_available():
        if not opts.host:
            print("No CUDA GPU is available: timings of launches need a GPU. Running the "
                  "host-side part (fastkernel's own cost per hit, against a stand-in driver).")
        from . import _bench_host
        return _bench_host.run_host(opts, repo)
    return run_gpu(opts, repo)


if __name__ == "__main__":
    sys.exit(main())
