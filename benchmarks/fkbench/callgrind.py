"""``python benchmarks/dispatch.py --callgrind``: instructions per hit, deterministic.

Re-runs the hit loops under ``valgrind --tool=callgrind``, collecting only inside
``_C.bench_call_loop`` (``--toggle-collect=fastkernel_bench_call_loop``) and dumping once per
loop (``--dump-after``), which gives instructions per hit on a noisy machine, and a breakdown
by function group from ``callgrind_annotate``'s inclusive counts. Launches go to the recording
stand-in driver (:func:`fkbench.host.use_stand_in_driver`).
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
from collections.abc import Callable
from typing import Any

from . import common
from .host import StandInUnavailable, use_stand_in_driver

#: Warm-up hits before a collected callgrind loop.
_CALLGRIND_WARMUP = 20
#: Hits per collected loop unless --iterations says otherwise.
_CALLGRIND_HITS = 1000
#: The function callgrind collects in and dumps after (csrc/python/bench_floor.cpp): an exact
#: name, as --dump-after takes no wildcard.
_TOGGLE = "fastkernel_bench_call_loop"

#: The warm first call's count collects inside the native entry of ``kernel[grid](...)``, whose
#: miss reaches the disk cache through Python (a wildcard: the symbol is in an anonymous
#: namespace and --toggle-collect matches the demangled name with its parameters).
_WARM_TOGGLE = "fastkernel::(anonymous namespace)::launch_bound*"
#: The shape whose warm first call is counted.
_WARM_SHAPE = "add-2"

#: The call-site compile options of the "options" loops: Triton's defaults, given at the call
#: as Liger-Kernel gives num_warps on every call.
CALL_SITE_OPTIONS = {"num_warps": 4, "num_stages": 3}

#: Function groups of a hit, by the symbol whose inclusive count measures them (in call order).
#: "fastkernel::launch" includes the driver call; the breakdown subtracts it.
GROUP_SYMBOLS: list[tuple[str, str]] = [
    ("key build", "fastkernel::bind_and_build_key("),
    ("lookup", "fastkernel::LaunchTable::lookup("),
    ("stream query", "fastkernel::current_launch_context("),
    ("packing + launch", "fastkernel::launch("),
    ("driver call", "cuLaunchKernel"),
]


# ---- callgrind --------------------------------------------------------------------------------

# Run by the callgrind child: loads the unstripped profiling build of the extension as
# fastkernel._C before the package imports the installed one, then runs callgrind_child
# (argv: the extension, the benchmarks directory, the child's options).
_CHILD_BOOTSTRAP = """\
import importlib.util
import sys
import torch  # the extension resolves torch's libraries, which torch loads
spec = importlib.util.spec_from_file_location("fastkernel._C", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["fastkernel._C"] = module
spec.loader.exec_module(module)
sys.path.insert(0, sys.argv[2])
from fkbench import callgrind
sys.exit(callgrind.callgrind_child(sys.argv[3:]))
"""


def child_command(extension: pathlib.Path, repo: pathlib.Path, *options: str) -> list[str]:
    """The command line of a callgrind child (:func:`callgrind_child`) that loads the extension
    at ``extension`` as ``fastkernel._C``; ``options``: the child's own, after ``--repo``."""
    bootstrap = [sys.executable, "-c", _CHILD_BOOTSTRAP, str(extension), str(repo / "benchmarks")]
    return [*bootstrap, "--repo", str(repo), *options]


def _tool(name: str) -> str | None:
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
        raise RuntimeError(
            "--callgrind needs pybind11 (a build dependency) to build the "
            "profiling copy of the extension"
        ) from exc
    build_dir = repo / "build" / "callgrind-profile"
    env = dict(os.environ)
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    configure = [
        cmake,
        "-S",
        str(repo),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=None",
        "-DCMAKE_CXX_FLAGS=-O3 -DNDEBUG",
        "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF",
        "-DFASTKERNEL_TESTING=ON",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
    ]
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
            raise RuntimeError(
                f"building the profiling extension failed ({' '.join(cmd)}):\n"
                f"{(proc.stdout + proc.stderr)[-4000:]}"
            )
        if cmd is configure:
            stamp.write_text("\n".join(configure))
    built = sorted(build_dir.glob("_C*.so"))
    if not built:
        raise RuntimeError(f"no _C*.so in {build_dir} after the build")
    return built[0]


def parse_annotate_output(text: str) -> tuple[int | None, dict[str, int]]:
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
    functions: dict[str, int] = {}
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


def _inclusive(functions: dict[str, int], symbol: str) -> int | None:
    """The inclusive count of ``symbol`` (a name prefix; an exact name when it has no '(')."""
    if "(" in symbol:
        counts = [c for name, c in functions.items() if name.startswith(symbol)]
    else:
        counts = [
            c for name, c in functions.items() if name == symbol or name.startswith(symbol + "'")
        ]
    return max(counts) if counts else None


def breakdown(total: int, functions: dict[str, int], hits: int) -> dict[str, float | None]:
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


#: The shape whose hits are also counted with a no-op launch_enter_hook set.
HOOKED_SHAPE = "add-2"


def _no_op_hook(metadata) -> None:
    return None


def _set_enter_hook() -> None:
    from triton import knobs

    knobs.runtime.launch_enter_hook.add(_no_op_hook)


def _clear_enter_hook() -> None:
    from triton import knobs

    if _no_op_hook in knobs.runtime.launch_enter_hook.calls:
        knobs.runtime.launch_enter_hook.remove(_no_op_hook)


def callgrind_child(argv: list[str]) -> int:
    """Under valgrind: register each shape, then one collected loop of hits per grid kind; with
    ``--warm-first-call``, only the warm first call (:func:`count_warm_first_call`)."""
    parser = argparse.ArgumentParser(prog="fastkernel callgrind child")
    parser.add_argument("--hits", type=int)
    parser.add_argument("--manifest")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--warm-first-call", action="store_true")
    opts = parser.parse_args(argv)
    if opts.warm_first_call:
        return _warm_first_call(pathlib.Path(opts.repo))
    if opts.hits is None or opts.manifest is None:
        parser.error("the hit loops need --hits and --manifest")

    from fastkernel import _C, _host_helpers
    from fastkernel.kernel import FastKernel
    from fastkernel.patch import patched

    from .kernels import SHAPES, callable_grid, called_grid, tutorial_grid

    drv = use_stand_in_driver(pathlib.Path(opts.repo))
    loops = []
    for shape in SHAPES:
        args = shape.make_args("cpu")
        fk = FastKernel(shape.kernel)
        # The miss: registers from Triton's disk cache (warmed by the parent).
        handle = fk[shape.grid](*args)

        grids = [
            ("tuple", shape.grid, None),
            ("callable", callable_grid(shape), None),
            ("called", called_grid(shape), None),
        ]
        tutorial = tutorial_grid(shape)
        if tutorial is not None:  # Triton's own triton.cdiv, then fastkernel's host helpers
            grids += [
                ("tutorial", tutorial, _host_helpers.uninstall),
                ("tutorial+helpers", tutorial, _host_helpers.install),
            ]
        # (kind, grid, host-helper switch, positional arguments, keyword arguments)
        calls: list[tuple[str, Any, Any, tuple, dict]] = [
            (kind, grid, switch, args, {}) for kind, grid, switch in grids
        ]
        if args:  # every argument by keyword; then positional with two call-site options
            names = shape.kernel.arg_names
            calls.append(("keywords", shape.grid, None, (), dict(zip(names, args))))
            calls.append(("options", shape.grid, None, args, CALL_SITE_OPTIONS))
        if shape.name == HOOKED_SHAPE:  # a no-op launch_enter_hook set (removed after the loop)
            calls.append(("enter hook", shape.grid, _set_enter_hook, args, {}))
        for grid_kind, grid, switch, call_args, call_kwargs in calls:
            if switch is not None:
                switch()
            for _ in range(_CALLGRIND_WARMUP):
                fk[grid](*call_args, **call_kwargs)
            drv.reset()
            hits_before = fk.stats()["hits"]
            # collected, then dumped
            _C.bench_call_loop(fk, grid, call_args, opts.hits, call_kwargs)
            hits = fk.stats()["hits"] - hits_before
            loops.append(
                {
                    "shape": shape.name,
                    "grid": grid_kind,
                    "num_args": shape.num_args,
                    "num_tensors": shape.num_tensors,
                    "hits": hits,
                    "launches": drv.launch_count(),
                }
            )
        _host_helpers.uninstall()
        _clear_enter_hook()
        # The same kernel as a plain Triton JITFunction under fastkernel.patch(), tuple grid;
        # then under Triton's own autotune and heuristics, patched.
        # Last, the CompiledKernel handle that Triton's warmup returns, launched as Triton's
        # fused-softmax tutorial launches it (`compiled[(g0, g1, g2)](*args)`), patched.
        with patched():
            patched_calls = [
                ("patched", shape.kernel, shape.grid, args, _patched_dispatch),
                *_patched_tuned_calls(shape),
                _patched_handle_call(shape, handle, args),
            ]
            for grid_kind, kernel, grid, call_args, counters_of in patched_calls:
                kernel[grid](*call_args)  # the miss (warm index and disk cache)
                counters = counters_of(kernel)
                for _ in range(_CALLGRIND_WARMUP):
                    kernel[grid](*call_args)
                drv.reset()
                before = counters.stats()
                _C.bench_call_loop(kernel, grid, call_args, opts.hits)
                after = counters.stats()
                loops.append(
                    {
                        "shape": shape.name,
                        "grid": grid_kind,
                        "num_args": shape.num_args,
                        "num_tensors": shape.num_tensors,
                        # A tuned or heuristics call that Triton's own run served is no hit.
                        "hits": after["hits"] - before["hits"]
                        if after["fallbacks"] == before["fallbacks"]
                        else 0,
                        "launches": drv.launch_count(),
                    }
                )
    _C._testing.set_host_testing(False, 0, 0)
    with open(opts.manifest, "w") as f:
        json.dump({"loops": loops, "hits_requested": opts.hits}, f)
    return 0


def _warm_first_call(repo: pathlib.Path) -> int:
    """One call of a fresh kernel object of the warm shape, in a fresh process whose disk cache
    holds its binary. The stand-in driver library is mapped before it, as a GPU process has
    ``libcuda.so.1`` mapped by then (see :mod:`fkbench.warm`)."""
    import ctypes

    from fastkernel.kernel import FastKernel

    from .kernels import SHAPES

    drv = use_stand_in_driver(repo)
    ctypes.CDLL(os.environ["FASTKERNEL_CUDA_DRIVER"])
    shape = next(s for s in SHAPES if s.name == _WARM_SHAPE)
    args = shape.make_args("cpu")
    FastKernel(shape.kernel)[shape.grid](*args)
    return 0 if len(drv.launches()) == 1 else 1


def count_warm_first_call(valgrind: str, extension: pathlib.Path, repo: pathlib.Path) -> int:
    """Instructions of the warm first call (:func:`_warm_first_call`) under callgrind,
    collecting inside the native entry: one native run fills a private disk cache, a second
    process runs under valgrind. Raises RuntimeError when a run fails."""
    with tempfile.TemporaryDirectory(prefix="fastkernel-callgrind-warm-") as tmp:
        out = pathlib.Path(tmp) / "callgrind.out"
        child = child_command(extension, repo, "--warm-first-call")
        env = {
            **os.environ,
            "PYTHONHASHSEED": "0",
            "FASTKERNEL_CACHE_DIR": str(pathlib.Path(tmp) / "cache"),
        }
        valgrind_cmd = [
            valgrind,
            "--tool=callgrind",
            "--collect-atstart=no",
            f"--toggle-collect={_WARM_TOGGLE}",
            f"--callgrind-out-file={out}",
        ]
        for cmd in (child, valgrind_cmd + child):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"the warm first call failed (exit {proc.returncode}):\n"
                    f"{(proc.stdout + proc.stderr)[-4000:]}"
                )
        totals = re.search(r"^totals: (\d+)$", out.read_text(), re.MULTILINE)
        if totals is None:
            raise RuntimeError(f"no totals in {out}")
        return int(totals.group(1))


def _patched_dispatch(kernel) -> Any:
    """The dispatch that serves ``kernel`` under ``fastkernel.patch()`` (it counts the hits)."""
    from fastkernel.kernel import PATCH_ATTR

    return kernel.__dict__[PATCH_ATTR]


def _patched_tuned_calls(shape) -> list[tuple[str, Any, Any, tuple, Callable[[Any], Any]]]:
    """The shape's kernel under Triton's own ``triton.autotune`` (tuned by its first call,
    the first config winning: there is no GPU to time them on), ``triton.heuristics``, a
    heuristics over an autotuner and an autotuner over a heuristics, each as (grid kind, kernel, grid, arguments, what counts its
    hits given the kernel). Empty for shapes without BLOCK. Call under ``fastkernel.patch()``."""
    from . import common
    from .host import _first_config_wins

    calls = []
    tuned = common.triton_autotuned_call(shape, "cpu", _first_config_wins)
    if tuned is not None:
        calls.append(("patched autotune", tuned[0], shape.grid, tuned[1], _patched_dispatch))
    heuristics = common.triton_heuristics_call(shape, "cpu")
    if heuristics is not None:
        calls.append(
            ("patched heuristics", heuristics[0], shape.grid, heuristics[1], _patched_dispatch)
        )
    for name, autotune_outside in (
        ("patched heuristics+autotune", False),
        ("patched autotune+heuristics", True),
    ):
        stack = common.triton_heuristics_autotuned_call(
            shape, "cpu", _first_config_wins, autotune_outside
        )
        if stack is not None:
            calls.append((name, stack[0], shape.grid, stack[1], _patched_dispatch))
    return calls


def _patched_handle_call(shape, handle, args: tuple) -> tuple[str, Any, tuple, tuple, Callable]:
    """The ``CompiledKernel`` of the shape's binary (what Triton's ``warmup`` returns; here
    made, unloaded, from the disk-cache entry ``handle`` that the shape's first launch
    returned, since no Triton driver runs here), launched on a grid of three dims with every
    argument (constexprs included), as Triton's fused-softmax tutorial launches it; in the form
    of :func:`_patched_tuned_calls`: its launcher, made by its first launch, counts the hits.
    Call under ``fastkernel.patch()``."""
    from fastkernel import _C
    from fastkernel.cache import CachedKernel

    if isinstance(handle, CachedKernel):
        handle = handle._triton_kernel(load=False)
    return ("patched handle", handle, (tuple(shape.grid) + (1, 1))[:3], args, _C.handle_launcher)


def _dump_index(path: pathlib.Path) -> int:
    suffix = path.name.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def run_callgrind(opts: argparse.Namespace, repo: pathlib.Path) -> int:
    """Instructions per hit per shape under callgrind, with the function-group breakdown."""
    from fastkernel.kernel import FastKernel

    from .kernels import SHAPES

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
    print(
        "callgrind: building an unstripped, non-LTO copy of the extension (same sources, -O3) "
        "in build/callgrind-profile, so that function names survive",
        flush=True,
    )
    try:
        extension = build_profile_extension(repo)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Compiling under valgrind would take minutes: fill Triton's disk cache natively first,
    # the autotuned kernels' configs included.
    from fastkernel.patch import patched

    for shape in SHAPES:
        FastKernel(shape.kernel)[shape.grid](*shape.make_args("cpu"))
        with patched():
            for _, kernel, grid, call_args, _ in _patched_tuned_calls(shape):
                kernel[grid](*call_args)
    drv.reset()

    with tempfile.TemporaryDirectory(prefix="fastkernel-callgrind-") as tmp:
        tmp_dir = pathlib.Path(tmp)
        manifest_path = tmp_dir / "manifest.json"
        cmd = [
            valgrind,
            "--tool=callgrind",
            "--collect-atstart=no",
            f"--toggle-collect={_TOGGLE}",
            f"--dump-after={_TOGGLE}",
            f"--callgrind-out-file={tmp_dir / 'callgrind.out'}",
            *child_command(extension, repo, "--hits", str(hits), "--manifest", str(manifest_path)),
        ]
        print(
            f"callgrind: {hits} hits per shape and grid kind under valgrind (importing torch "
            f"under valgrind takes about a minute)",
            flush=True,
        )
        start = time.monotonic()
        # A fixed hash seed keeps dict layouts, hence the callable-grid counts, the same run to run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not manifest_path.is_file():
            print(
                f"error: the callgrind run failed (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-4000:]}",
                file=sys.stderr,
            )
            return 1
        print(f"callgrind: done in {time.monotonic() - start:.0f} s")
        manifest = json.loads(manifest_path.read_text())
        dumps = sorted(
            (p for p in tmp_dir.glob("callgrind.out.*") if _dump_index(p) > 0), key=_dump_index
        )
        loops = manifest["loops"]
        if len(dumps) != len(loops):
            print(
                f"error: expected {len(loops)} callgrind dumps, found {len(dumps)}", file=sys.stderr
            )
            return 1
        keep = pathlib.Path(opts.keep_dumps) if opts.keep_dumps else None
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        for loop, dump in zip(loops, dumps):
            if keep is not None:
                shutil.copyfile(dump, keep / f"{loop['shape']}-{loop['grid']}.callgrind")
            out = subprocess.run(
                [annotate, "--inclusive=yes", "--threshold=100", str(dump)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            total, functions = parse_annotate_output(out)
            if total is None or loop["hits"] <= 0:
                print(
                    f"error: no counts for {loop['shape']} ({loop['grid']} grid)", file=sys.stderr
                )
                return 1
            loop["instructions_per_hit"] = breakdown(total, functions, loop["hits"])

    _print_callgrind(loops)
    print(f"\ncallgrind: the warm first call ({_WARM_SHAPE}) in a fresh process", flush=True)
    try:
        warm_first_call = count_warm_first_call(valgrind, extension, repo)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"a fresh process's first call of {_WARM_SHAPE}, its binary in the disk cache: "
        f"{warm_first_call:,} instructions (inside the native entry; the stand-in driver "
        f"mapped before it)"
    )
    env = common.environment("callgrind", None)
    report = {
        "environment": env,
        "method": {
            "tool": "valgrind --tool=callgrind",
            "collected_in": _TOGGLE,
            "extension": "profiling build: -O3, no LTO, unstripped",
            "driver": "recording stand-in (tests/stand_in_driver)",
            "hits_per_loop": hits,
            "groups": dict(GROUP_SYMBOLS),
            "warm_first_call_collected_in": _WARM_TOGGLE,
        },
        "loops": loops,
        "warm_first_call": {"shape": _WARM_SHAPE, "instructions": warm_first_call},
    }
    out_dir = common.results_dir(opts.out, repo)
    path = out_dir / f"callgrind-{env['date'][:10]}.json"
    common.write_json(path, report)
    print(f"\nresults: {path}")
    ok = all(loop["hits"] == hits and loop["launches"] == hits for loop in loops)
    if not ok:
        print("WARNING: not every collected call was a fastkernel hit that launched")
    return 0 if ok else 1


def _print_callgrind(loops: list[dict[str, Any]]) -> None:
    columns = [
        "total",
        "fastkernel",
        "entry",
        "key build",
        "lookup",
        "stream query",
        "packing",
        "driver call",
    ]
    print(
        "\ninstructions per hit (callgrind; driver call = the stand-in's cuLaunchKernel; "
        "fastkernel = total less the driver call; entry = Python to native, grid and glue):"
    )
    head = f"  {'shape':<12}{'grid':<18}" + "".join(f"{c:>14}" for c in columns)
    print(head)
    print("  " + "-" * (len(head) - 2))
    for loop in loops:
        per = loop["instructions_per_hit"]
        cells = "".join(
            f"{'n/a' if per[c] is None else format(per[c], '.0f'):>14}" for c in columns
        )
        print(f"  {loop['shape']:<12}{loop['grid']:<18}{cells}")
    own = {(lp["shape"], lp["grid"]): lp["instructions_per_hit"]["fastkernel"] for lp in loops}

    def against(kind: str, base: str, value: Callable[[float, float], str]) -> str:
        """'shape: value(count of the `kind` loop, count of the `base` loop)' for each shape
        that has both loops."""
        return "  ".join(
            f"{shape}: {value(own[(shape, kind)], own[(shape, base)])}"
            for shape, grid in own
            if grid == base and (shape, kind) in own
        )

    def against_tuple(kind: str, value: Callable[[float, float], str]) -> str:
        return against(kind, "tuple", value)

    options = ", ".join(f"{k}={v}" for k, v in CALL_SITE_OPTIONS.items())
    lines = [
        (
            f"{label} adds (fastkernel's instructions per hit, over the tuple grid): ",
            against_tuple(kind, lambda k, t: f"{k - t:.0f}"),
        )
        for kind, label in (
            ("callable", "a callable grid (a grid program)"),
            ("called", "a callable grid called in Python"),
            ("tutorial", "a tutorial grid with Triton's triton.cdiv"),
            ("tutorial+helpers", "a tutorial grid with the host helpers"),
        )
    ]
    lines += [
        (
            "every argument by keyword / positional (fastkernel's own instructions per hit, "
            "tuple grid): ",
            against_tuple("keywords", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            f"a call-site option ({options}) adds, each (fastkernel's instructions per hit, over "
            "the positional call): ",
            against_tuple("options", lambda k, t: f"{(k - t) / len(CALL_SITE_OPTIONS):.0f}"),
        ),
        (
            "patched Triton kernel / @fastkernel kernel (fastkernel's own instructions per hit, "
            "tuple grid; the stand-in driver's share varies run to run): ",
            against_tuple("patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "patched triton.autotune tuned hit / patched plain hit (fastkernel's own "
            "instructions per hit, tuple grid): ",
            against("patched autotune", "patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "patched triton.heuristics hit / patched plain hit (fastkernel's own instructions "
            "per hit, tuple grid): ",
            against("patched heuristics", "patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "patched triton.heuristics over triton.autotune hit / patched plain hit "
            "(fastkernel's own instructions per hit, tuple grid): ",
            against("patched heuristics+autotune", "patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "patched triton.autotune over triton.heuristics hit / patched plain hit "
            "(fastkernel's own instructions per hit, tuple grid): ",
            against("patched autotune+heuristics", "patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "patched CompiledKernel handle launch / patched plain hit (fastkernel's own "
            "instructions per hit, tuple grid): ",
            against("patched handle", "patched", lambda k, t: f"{k / t:.3f}"),
        ),
        (
            "a no-op launch_enter_hook adds (fastkernel's instructions per hit, over the "
            "unhooked tuple grid; the hook's own call included): ",
            against_tuple("enter hook", lambda k, t: f"{k - t:.0f}"),
        ),
    ]
    for label, text in lines:
        if text:
            print(label + text)
