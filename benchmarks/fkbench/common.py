"""What every part of the dispatch benchmark shares: the timing loops, the systems timed the
same way on a GPU and host-side, the environment record, and the report (table, JSON, plot,
targets)."""

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
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Systems in table and plot order, with their labels.
SYSTEM_LABELS: dict[str, str] = {
    "floor": "floor: C++ cuLaunchKernel loop",
    "triton_run": "Triton CompiledKernel.run",
    "triton": "Triton kernel[grid]",
    "fastkernel": "fastkernel, tuple grid",
    "fastkernel_callable": "fastkernel, callable grid (a grid program)",
    "fastkernel_called": "fastkernel, callable grid called in Python",
    "fastkernel_tutorial": "fastkernel, tutorial grid (triton.cdiv), Triton's cdiv",
    "fastkernel_tutorial_helpers": "fastkernel, tutorial grid, host helpers on",
    "fastkernel_autotuned": "fastkernel.autotune, tuned hit",
    "fastkernel_cpp": "fastkernel C++ Bundle::launch",
    "triton_handle": "Triton CompiledKernel[grid]: a kept handle's launch",
    "fastkernel_handle": "fastkernel, a kept handle's launch (handle[grid])",
    "inductor_static": "Inductor static CUDA launcher",
    "cuda_graph": "CUDA graph replay, per launch",
    "triton_autotuned": "Triton's triton.autotune, tuned call",
    "triton_heuristics": "Triton's triton.heuristics (BLOCK from n)",
    "patched": "fastkernel.patch(): Triton kernel[grid]",
    "patched_autotuned": "fastkernel.patch(): Triton's triton.autotune, tuned hit",
    "patched_heuristics": "fastkernel.patch(): Triton's triton.heuristics, hit",
    "patched_triton_run": "Triton CompiledKernel.run, kept as launch caches keep it",
    "patched_run": "fastkernel.patch(): the same kept CompiledKernel.run",
}

#: Launches captured in one CUDA graph for the amortized reference.
GRAPH_LAUNCHES = 100

# (iterations per repeat, repeats) by mode; --iterations / --repeats override them.
GPU_DEFAULTS = (10000, 7)
GPU_QUICK = (2000, 3)
# The stand-in records 4096 launches; staying under that keeps every timed launch identical.
HOST_DEFAULTS = (4000, 15)
HOST_QUICK = (1000, 5)
# Misses and first calls are milliseconds each: a few samples suffice.
COLD_REPEATS = 5
COLD_REPEATS_QUICK = 2


def testing_build() -> bool:
    """Whether the installed ``fastkernel._C`` has the benchmark loops and the host-testing
    switch (a build configured with ``-DFASTKERNEL_TESTING=ON``)."""
    from fastkernel import _C

    return hasattr(_C, "bench_call_loop") and hasattr(_C, "_testing")


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

    def __init__(
        self,
        loop: Callable[[int], Any],
        launches_per_iteration: int = 1,
        prepare: Callable[[], None] | None = None,
    ):
        self.loop = loop
        self.launches_per_iteration = launches_per_iteration
        #: Runs before each of this system's loops, outside the timing (for instance, switching
        #: fastkernel's host helpers on or off).
        self.prepare = prepare

    def iterations_for(self, launches: int) -> int:
        """Iterations giving about ``launches`` launches (at least one)."""
        return max(1, launches // self.launches_per_iteration)


def time_systems(
    systems: dict[str, Timed],
    launches: int,
    repeats: int,
    sync: Callable[[], None],
    before_repeat: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
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
    samples: dict[str, list[float]] = {name: [] for name in systems}
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


def time_single_calls(
    prepare: Callable[[], Callable[[], Any]], repeats: int, sync: Callable[[], None]
) -> list[float]:
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
    "i1": "<i",
    "i8": "<b",
    "i16": "<h",
    "i32": "<i",
    "i64": "<q",
    "u1": "<I",
    "u8": "<B",
    "u16": "<H",
    "u32": "<I",
    "u64": "<Q",
    "fp32": "<f",
    "f32": "<f",
    "fp64": "<d",
}


def triton_param_bytes(compiled, args: Sequence[Any]) -> list[bytes]:
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
    from fastkernel import _triton_abi as abi

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


def floor_timed(
    compiled, args: Sequence[Any], grid: tuple[int, ...], device: int, stream: int
) -> Timed:
    """The floor for one shape: ``_C.BenchFloor`` on Triton's cubin and parameter bytes.

    The cubin is loaded here, once; the timed loop is only ``cuLaunchKernel`` calls.
    """
    from fastkernel import _C

    md = compiled.metadata
    launcher = _C.BenchFloor(
        compiled.asm["cubin"],
        md.name,
        device,
        32 * md.num_warps,
        md.shared,
        triton_param_bytes(compiled, args),
    )
    grid3 = (tuple(grid) + (1, 1))[:3]

    def loop(n: int) -> None:
        launcher.run(grid3, stream, n)

    return Timed(loop)


def bundle_timed(
    fk,
    args: Sequence[Any],
    grid: tuple[int, ...],
    device: int,
    stream: int,
    directory: pathlib.Path,
) -> Timed:
    """The C++ row: ``fk``'s registered specializations exported as a bundle
    (``fastkernel.export``) and launched by a C++ loop of ``fastkernel::Bundle::launch`` with
    the call's runtime arguments (``_C.BenchBundle``)."""
    import torch

    from fastkernel import _C
    from fastkernel.bundle import export

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


def tutorial_grid_systems(fk, shape, args: tuple) -> dict[str, Timed]:
    """The shape's kernel with the grid Triton's tutorials write,
    ``lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)``, with Triton's own
    ``triton.cdiv`` and with fastkernel's host helpers installed (switched before each loop,
    outside the timing; left off). Empty for shapes without ``n`` and ``BLOCK``."""
    from fastkernel import _host_helpers

    from .kernels import tutorial_grid

    grid = tutorial_grid(shape)
    if grid is None:
        return {}
    return {
        "fastkernel_tutorial": Timed(call_loop(fk, grid, args), prepare=_host_helpers.uninstall),
        "fastkernel_tutorial_helpers": Timed(
            call_loop(fk, grid, args), prepare=_host_helpers.install
        ),
    }


def call_loop(launcher, grid, args: tuple) -> Callable[[int], None]:
    """``n`` calls of ``launcher[grid](*args)``, the way user code writes them."""

    def loop(n: int) -> None:
        for _ in range(n):
            launcher[grid](*args)

    return loop


def triton_systems(jit, compiled, grid, args: tuple, stream: int) -> dict[str, Timed]:
    """Triton's own dispatch: ``kernel[grid](*args)`` (``triton``), the compiled kernel's
    ``run`` with the launch facts already in hand (``triton_run``) and the compiled kernel's own
    launch ``compiled[(g0, g1, g2)](*args)`` (``triton_handle``, Triton's runner: what the
    fused-softmax tutorial and libraries' launch caches call), for a kernel ``jit`` whose
    ``compiled`` specialization a first ``jit[grid](*args)`` returned."""
    g = (tuple(grid) + (1, 1))[:3]
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata

    def triton_run_loop(
        n: int, run=run, function=function, packed=packed, args=args, g0=g[0], g1=g[1], g2=g[2]
    ) -> None:
        for _ in range(n):
            run(g0, g1, g2, stream, function, packed, None, None, None, *args)

    return {
        "triton_run": Timed(triton_run_loop),
        "triton": Timed(call_loop(jit, grid, args)),
        "triton_handle": Timed(call_loop(compiled, g, args)),
    }


def handle_timed(fk, grid, args: tuple) -> Timed:
    """``handle[(g0, g1, g2)](*args)`` for the handle ``fk.warmup(*args, grid=grid)`` returns:
    the native launch of a kept handle's binary (``fastkernel_handle``)."""
    handle = fk.warmup(*args, grid=grid)
    return Timed(call_loop(handle, (tuple(grid) + (1, 1))[:3], args))


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


def driver_api_version(library: str) -> str | None:
    """``cuDriverGetVersion`` of the driver library at ``library`` as "major.minor", or None."""
    try:
        lib = ctypes.CDLL(library)
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def nvidia_driver_release() -> str | None:
    """The NVIDIA kernel driver release (``nvidia-smi``), or None where it cannot be read."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def environment(mode: str, device: int | None) -> dict[str, Any]:
    """What a result depends on: device, driver, CUDA, library versions, CPU and date."""
    import torch
    import triton

    from fastkernel import _C, __version__

    env: dict[str, Any] = {
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
        env["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(device))
        env["nvidia_driver"] = nvidia_driver_release()
    else:
        env["device"] = "none: host-side run against the recording stand-in driver"
    return env


# ---- reporting --------------------------------------------------------------------------------


def slug(text: str) -> str:
    """``text`` reduced to a file-name-safe lowercase token."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def results_dir(out: str | None, repo: pathlib.Path) -> pathlib.Path:
    """``--out``, else ``benchmarks/results`` of the checkout."""
    path = pathlib.Path(out) if out else repo / "benchmarks" / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def format_table(
    rows: list[dict[str, Any]],
    shapes: list[str],
    systems: list[str],
    labels: dict[str, str],
    unit: str = "us",
) -> str:
    """A systems x shapes table of median time per call and its ratio to the floor.

    ``rows`` are result records (``shape``, ``system``, ``us_per_call``, ``ratio_to_floor``);
    ``unit`` is ``"us"`` or ``"ns"``.
    """
    scale = 1e3 if unit == "ns" else 1.0
    cell: dict[tuple[str, str], dict[str, Any]] = {(r["system"], r["shape"]): r for r in rows}
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


def result_rows(
    shape_results: dict[str, dict[str, list[float]]], shape_info: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    """Flatten per-shape samples into records with medians and ratios to the floor."""
    rows = []
    for shape, samples in shape_results.items():
        floor = median(samples["floor"]) if "floor" in samples else None
        for system, values in samples.items():
            us = median(values)
            rows.append(
                {
                    "shape": shape,
                    **shape_info[shape],
                    "system": system,
                    "us_per_call": us,
                    "ratio_to_floor": us / floor if floor else None,
                    "samples_us": values,
                }
            )
    return rows


def write_json(path: pathlib.Path, report: dict[str, Any]) -> None:
    """Write ``report`` as indented JSON."""
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")


def write_plot(
    path: pathlib.Path,
    rows: list[dict[str, Any]],
    systems: list[str],
    labels: dict[str, str],
    title: str,
    unit: str = "us",
) -> bool:
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
        points = sorted(
            (position[r["shape"]], r["us_per_call"] * scale) for r in rows if r["system"] == system
        )
        if not points:
            continue
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            label=labels.get(system, system),
        )
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


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dispatch targets, each with the measured value and whether met.

    Ratios: fastkernel tuple grid <= 1.10 x floor at 0-2 tensors and <= 1.20 x at 16 tensors and
    the 19-argument shape; Triton ``kernel[grid]`` / fastkernel >= 5 at 2 tensors; fastkernel
    faster than ``CompiledKernel.run`` at every shape; a callable grid adds <= 0.3 us.
    """
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    targets = []

    def add(text: str, value: float | None, limit: float, at_most: bool) -> None:
        if value is None:
            return
        met = value <= limit if at_most else value >= limit
        targets.append({"target": text, "measured": value, "met": met})

    def ratio(shape: str, a: str, b: str) -> float | None:
        if (shape, a) in us and (shape, b) in us:
            return us[(shape, a)] / us[(shape, b)]
        return None

    for shape, limit in (("nop-0", 1.10), ("add-2", 1.10), ("add-16", 1.20), ("overhead-19", 1.20)):
        add(
            f"fastkernel / floor at {shape} <= {limit:.2f}",
            ratio(shape, "fastkernel", "floor"),
            limit,
            True,
        )
    add(
        "Triton kernel[grid] / fastkernel at add-2 >= 5",
        ratio("add-2", "triton", "fastkernel"),
        5.0,
        False,
    )
    for shape in dict.fromkeys(shape for shape, _ in us):
        add(
            f"fastkernel / CompiledKernel.run at {shape} < 1",
            ratio(shape, "fastkernel", "triton_run"),
            1.0,
            True,
        )
        if (shape, "fastkernel_cpp") in us and (shape, "floor") in us:
            add(
                f"C++ Bundle::launch - floor at {shape} <= 0.15 us",
                us[(shape, "fastkernel_cpp")] - us[(shape, "floor")],
                0.15,
                True,
            )
        if (shape, "fastkernel_autotuned") in us and (shape, "fastkernel") in us:
            add(
                f"autotuned hit / plain hit at {shape} <= 1.10",
                ratio(shape, "fastkernel_autotuned", "fastkernel"),
                1.10,
                True,
            )
        if (shape, "fastkernel_callable") in us and (shape, "fastkernel") in us:
            add(
                f"callable grid - tuple grid at {shape} <= 0.30 us",
                us[(shape, "fastkernel_callable")] - us[(shape, "fastkernel")],
                0.30,
                True,
            )
    return targets


def finish_report(
    report: dict[str, Any],
    out_dir: pathlib.Path,
    stem: str,
    systems: list[str],
    labels: dict[str, str],
    unit: str,
) -> pathlib.Path:
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
    title = (
        f"dispatch cost per call: {env['device']}\n"
        f"torch {env['torch']}, Triton {env['triton']}, fastkernel {env['fastkernel']}, "
        f"{env['date'][:10]}"
    )
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
    for module in (
        "torch._inductor.runtime.static_triton_launcher",
        "torch._inductor.runtime.static_cuda_launcher",
    ):
        try:
            return importlib.import_module(module).StaticallyLaunchedCudaKernel, None
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}: {exc}")
    return None, "; ".join(errors)


def inductor_static_timed(
    compiled, args: tuple, grid: tuple[int, ...], device: int, stream: int, scratch_dir: str
) -> tuple[Timed | None, str | None]:
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


# ---- shared helpers ---------------------------------------------------------------------------


def mode_counts(opts: argparse.Namespace, defaults: tuple[int, int]) -> tuple[int, int]:
    iterations = opts.iterations if opts.iterations is not None else defaults[0]
    repeats = opts.repeats if opts.repeats is not None else defaults[1]
    return iterations, repeats


def method_record(iterations: int, repeats: int) -> dict[str, Any]:
    return {
        "statistic": "median over repeats of wall time per call",
        "calls_per_repeat": iterations,
        "repeats": repeats,
        "sync_before_clock": True,
        "graph_launches": GRAPH_LAUNCHES,
    }


def fast_path_record(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """fastkernel's counters over a timed section: hits, misses and fallbacks it made."""
    return {
        "hits": after["hits"] - before["hits"],
        "misses": after["misses"] - before["misses"],
        "fallbacks": after["fallbacks"] - before["fallbacks"],
        "fallback_reasons": after.get("fallback_reasons", {}),
    }


def table_memory(fk) -> dict[str, int]:
    """Heap bytes of ``fk``'s native launch table (``stats()["table_bytes"]``: keys and launch
    records, the loaded modules excepted): ``per_kernel``, the empty table, and
    ``per_specialization``, what each registered specialization adds. Clears the table: the
    next call is a miss."""

    held = fk.stats()
    fk._clear_records()
    empty = fk.stats()["table_bytes"]
    count = held["specializations"]
    return {
        "per_kernel": empty,
        "per_specialization": (held["table_bytes"] - empty) // count if count else 0,
        "specializations": count,
    }


def print_table_memory(memory: dict[str, dict[str, int]]) -> None:
    if not memory:
        return
    empty = next(iter(memory.values()))["per_kernel"]
    print(
        f"native launch table, heap bytes (modules excepted): {empty} per kernel (empty table); "
        "per specialization: "
        + "  ".join(f"{shape}: {m['per_specialization']}" for shape, m in memory.items())
    )


def all_hits(fast_path: dict[str, dict[str, Any]]) -> bool:
    return all(
        r["hits"] > 0 and r["misses"] == 0 and r["fallbacks"] == 0 for r in fast_path.values()
    )


def print_fast_path(fast_path: dict[str, dict[str, Any]]) -> None:
    for shape, r in fast_path.items():
        if r["hits"] == 0 or r["misses"] or r["fallbacks"]:
            print(
                f"WARNING: {shape}: the native path did not serve every timed fastkernel call "
                f"(hits {r['hits']}, misses {r['misses']}, fallbacks {r['fallbacks']}, "
                f"reasons {r['fallback_reasons']})"
            )


def print_cold(cold: dict[str, dict[str, float]], unit: str) -> None:
    if not cold:
        return
    names = list(dict.fromkeys(k for costs in cold.values() for k in costs))
    print("\nmisses and first calls, us (median):")
    width = max(len(n) for n in names)
    print(f"  {'':<{width}}" + "".join(f"{s:>13}" for s in cold))
    for name in names:
        print(
            f"  {name:<{width}}"
            + "".join(f"{cold[s].get(name, float('nan')):>13.0f}" for s in cold)
        )


def print_floor_vs_graph(rows: list[dict[str, Any]]) -> None:
    us = {(r["shape"], r["system"]): r["us_per_call"] for r in rows}
    close = [
        shape
        for (shape, system), value in us.items()
        if system == "floor"
        and (shape, "cuda_graph") in us
        and value <= 1.1 * us[(shape, "cuda_graph")]
    ]
    if close:
        print(
            f"note: the floor is within 10% of CUDA graph replay at {', '.join(close)}: there "
            f"the GPU's run time, not the launch, may bound the floor, which compresses ratios"
        )


# ---- Triton's own wrappers, and the patch --------------------------------------------------

#: The name suffix of a shape's group timed with fastkernel.patch() on.
PATCHED_GROUP = " (patched)"


def _tunable_block(shape, device: str) -> int | None:
    """The shape's BLOCK (its last argument on ``device``), or None for shapes without a BLOCK
    constexpr or without tensors: the shapes the Triton wrappers below serve."""
    if shape.num_tensors == 0 or shape.kernel.arg_names[-1] != "BLOCK":
        return None
    return shape.make_args(device)[-1]


def _block_from_n(block: int) -> dict[str, Callable]:
    """Triton heuristics values computing BLOCK from ``n`` (as Liger-Kernel and
    flash-linear-attention compute block sizes). The heuristic reads only the argument mapping
    and a constant default, as library heuristics do; one reading a closure variable would be
    computed by Triton's own Heuristics.run on every call (fastkernel/_heuristic_code.py)."""
    return {"BLOCK": lambda args, block=block: block if args["n"] >= block else 2 * block}


def triton_autotuned_call(
    shape, device: str, do_bench: Callable | None = None
) -> tuple[Any, tuple] | None:
    """The shape's kernel under Triton's own ``triton.autotune`` (two BLOCK configs, key
    ``["n"]``) on ``device``, tuned by one first call (with ``do_bench``, else Triton's timer),
    and its call arguments without BLOCK; None for shapes without a BLOCK constexpr."""
    import triton
    from triton.runtime.jit import JITFunction

    block = _tunable_block(shape, device)
    if block is None:
        return None
    configs = [triton.Config({"BLOCK": block}), triton.Config({"BLOCK": 2 * block})]
    kernel = triton.autotune(configs, key=["n"], do_bench=do_bench)(JITFunction(shape.kernel.fn))
    args = shape.make_args(device)[:-1]
    kernel[shape.grid](*args)
    return kernel, args


def triton_heuristics_call(shape, device: str) -> tuple[Any, tuple] | None:
    """The shape's kernel under Triton's own ``triton.heuristics`` computing BLOCK from ``n``
    (:func:`_block_from_n`), and its call arguments on ``device`` without BLOCK; None for shapes
    without a BLOCK constexpr."""
    import triton
    from triton.runtime.jit import JITFunction

    block = _tunable_block(shape, device)
    if block is None:
        return None
    kernel = triton.heuristics(_block_from_n(block))(JITFunction(shape.kernel.fn))
    return kernel, shape.make_args(device)[:-1]


def triton_heuristics_autotuned_call(
    shape, device: str, do_bench: Callable | None = None, autotune_outside: bool = False
) -> tuple[Any, tuple] | None:
    """The shape's kernel under Triton's own ``triton.heuristics`` computing BLOCK from ``n``
    (:func:`_block_from_n`) over Triton's own ``triton.autotune`` tuning ``num_warps`` (two
    configs, key ``["n"]``), as flash-linear-attention stacks them (or, ``autotune_outside``,
    the autotuner over the heuristics, as FlagGems' upsampling stacks them), tuned by one
    first call (with ``do_bench``, else Triton's timer); and its call arguments on ``device``
    without BLOCK; None for shapes without a BLOCK constexpr."""
    import triton
    from triton.runtime.jit import JITFunction

    block = _tunable_block(shape, device)
    if block is None:
        return None
    configs = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)]
    tune = triton.autotune(configs, key=["n"], do_bench=do_bench)
    if autotune_outside:
        kernel = tune(triton.heuristics(_block_from_n(block))(JITFunction(shape.kernel.fn)))
    else:
        kernel = triton.heuristics(_block_from_n(block))(tune(JITFunction(shape.kernel.fn)))
    args = shape.make_args(device)[:-1]
    kernel[shape.grid](*args)
    return kernel, args


def time_patched(
    shape,
    device: str,
    fk,
    triton_tuned,
    triton_heuristics,
    iterations: int,
    repeats: int,
    sync,
    reset=None,
) -> dict[str, list[float]]:
    """With fastkernel.patch() on: a Triton kernel's ``kernel[grid]``, Triton's autotuned
    kernel's tuned call and Triton's heuristics kernel's call, interleaved with the
    ``@fastkernel`` kernel's hit."""
    from triton.runtime.jit import JITFunction

    from fastkernel.patch import patched

    args = shape.make_args(device)
    jit = JITFunction(shape.kernel.fn)  # a kernel of its own: its dispatch is made here
    with patched():
        systems = {
            "fastkernel": Timed(call_loop(fk, shape.grid, args)),
            "patched": Timed(call_loop(jit, shape.grid, args)),
        }
        if triton_tuned is not None:
            systems["patched_autotuned"] = Timed(
                call_loop(triton_tuned[0], shape.grid, triton_tuned[1])
            )
        if triton_heuristics is not None:
            systems["patched_heuristics"] = Timed(
                call_loop(triton_heuristics[0], shape.grid, triton_heuristics[1])
            )
        systems.update(_kept_run_systems(jit, shape, args))
        timings = time_systems(systems, iterations, repeats, sync, before_repeat=reset)
        kernels = {"patched": jit}
        if triton_tuned is not None:
            kernels["patched_autotuned"] = triton_tuned[0]
        if triton_heuristics is not None:
            kernels["patched_heuristics"] = triton_heuristics[0]
        _warn_unless_native(shape, kernels)
        return timings


def _kept_run_systems(jit, shape, args: tuple) -> dict[str, Timed]:
    """A kept handle's launcher object called as launch caches call it (vLLM's ``CachedKernel``
    keeps ``compiled.run`` and calls ``run(gx, gy, gz, stream, function, packed_metadata,
    None, enter_hook, exit_hook, *args)``, the stream read per call through Triton's driver):
    Triton's own (``patched_triton_run``) and, under the patch, fastkernel's native one
    (``patched_run``). Call under ``fastkernel.patch()``."""
    import triton

    from fastkernel import _C
    from fastkernel.kernel import tritons_own_launches

    compiled = jit[shape.grid](*args)
    with tritons_own_launches():
        triton_run = compiled.run
    native_run = compiled.run
    if type(native_run) is not _C.RunLauncher:
        print(f"warning: {shape.name}: the kept run is not native ({type(native_run)})")
    function, packed = compiled.function, compiled.packed_metadata
    knobs = triton.knobs.runtime
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    drv = triton.runtime.driver.active
    device, get_stream = drv.get_current_device(), drv.get_current_stream
    g0, g1, g2 = (tuple(shape.grid) + (1, 1))[:3]

    def kept(run):
        def loop(n: int) -> None:
            for _ in range(n):
                run(g0, g1, g2, get_stream(device), function, packed, None, enter, exit_, *args)

        return loop

    return {"patched_triton_run": Timed(kept(triton_run)), "patched_run": Timed(kept(native_run))}


def _warn_unless_native(shape, kernels: dict[str, Any]) -> None:
    """Warns for each patched kernel whose timed calls were not all native hits (a row timing
    Triton's own path would otherwise pass for a patched hit)."""
    from fastkernel.kernel import PATCH_ATTR

    for name, kernel in kernels.items():
        dispatch = kernel.__dict__.get(PATCH_ATTR)
        stats = dispatch.stats() if dispatch is not None else None
        if stats is None or stats["hits"] == 0 or stats["fallbacks"]:
            print(
                f"WARNING: {shape.name}: {name}: the patched calls were not all native hits "
                f"({stats})"
            )
