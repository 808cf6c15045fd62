"""The dispatch benchmark's host-side part, run at tiny counts on the CPU.

Checks the structure of what ``python benchmarks/dispatch.py --host`` writes and that the timed
fastkernel calls really were native hits (a fast path that silently never engaged would
otherwise pass as a fast benchmark). No timing is asserted: this machine's speed is no one's
contract. The callgrind report parser is checked on a canned ``callgrind_annotate`` report.
"""

import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from fastkernel import _C, CudaError
from fkbench.callgrind import breakdown, parse_annotate_output
from fkbench.kernels import SHAPES

# The host-side benchmark opens the recording stand-in driver in its own process.
pytestmark = pytest.mark.stand_in

REPO = pathlib.Path(__file__).resolve().parent.parent
ITERATIONS = 40
REPEATS = 2


@pytest.fixture(scope="module")
def host_report(tmp_path_factory):
    """Runs the host-side benchmark once, in its own process (it opens the stand-in driver)."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "dispatch.py"),
            "--host",
            "--quick",
            "--iterations",
            str(ITERATIONS),
            "--repeats",
            str(REPEATS),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = list(out.glob("host-*.json"))
    assert len(files) == 1, sorted(p.name for p in out.iterdir())
    return json.loads(files[0].read_text()), proc.stdout


def test_environment_is_recorded(host_report):
    report, _ = host_report
    env = report["environment"]
    for key in (
        "date",
        "mode",
        "device",
        "driver_version",
        "cuda_version",
        "torch",
        "triton",
        "fastkernel",
        "cpu",
    ):
        assert key in env
    assert env["mode"] == "host"
    assert ".so" in pathlib.Path(env["driver_library"]).name


def test_every_shape_and_system_has_a_result(host_report):
    report, _ = host_report
    rows = {(r["shape"], r["system"]): r for r in report["results"]}
    for shape in SHAPES:
        systems = [
            "floor",
            "triton",
            "triton_run",
            "fastkernel",
            "fastkernel_callable",
            "fastkernel_called",
            "fastkernel_cpp",
        ]
        if shape.name.startswith("add-"):  # the shapes with a BLOCK to tune
            systems.append("fastkernel_autotuned")
        for system in systems:
            row = rows[(shape.name, system)]
            assert row["num_args"] == shape.num_args
            assert row["num_tensors"] == shape.num_tensors
            assert len(row["samples_us"]) == REPEATS
            assert row["us_per_call"] > 0
            assert row["ratio_to_floor"] > 0
        assert rows[(shape.name, "floor")]["ratio_to_floor"] == 1.0
    assert {"inductor_static", "cuda_graph"} <= set(report["absent"])
    assert not {"triton", "triton_run"} & set(report["absent"])


def test_timed_calls_were_native_hits(host_report):
    report, _ = host_report
    from fkbench.kernels import tutorial_grid

    warmup = max(50, ITERATIONS // 5)
    for shape in SHAPES:
        # Tuple, callable (a grid program) and called grid loops, and two tutorial-grid loops
        # where the shape has one.
        loops = 3 + (2 if tutorial_grid(shape) is not None else 0)
        path = report["fastkernel_path"][shape.name]
        assert path["misses"] == 0 and path["fallbacks"] == 0, path
        assert path["hits"] == loops * (warmup + REPEATS * ITERATIONS), path


def test_floor_passes_the_bytes_fastkernel_passes(host_report):
    report, _ = host_report
    assert report["floor_params_match"] == {shape.name: True for shape in SHAPES}


def test_the_native_table_memory_is_reported(host_report):
    report, stdout = host_report
    for shape in SHAPES:
        memory = report["table_bytes"][shape.name]
        assert memory["specializations"] == 1
        assert 0 < memory["per_specialization"] <= 1024 and memory["per_kernel"] > 0
    assert "native launch table, heap bytes" in stdout


def test_library_calls_are_timed_on_the_native_path(host_report):
    """Liger-Kernel's RMSNorm, a decoder step built from Liger's ops and flash-linear-attention's
    token shift, causal-conv1d update and WALL attention decode, and Liger's fused gate/up
    SwiGLU (config pre_hooks), each timed unpatched and
    patched (the causal-conv1d update also with fla's CachedAutotuner.run kept); the patched
    calls were native hits with no fallback."""
    report, _ = host_report
    library = report["library_calls_us"]
    fla = importlib.util.find_spec("fla") is not None  # fla-core, a test dependency
    assert len(library) == 3 + 3 * fla and any(name.startswith("decoder step") for name in library)
    assert any("config pre_hooks" in name for name in library)
    assert any(name.startswith("flash-linear-attention") for name in library) == fla
    own_run = [name for name, row in library.items() if "patched_own_run" in row]
    assert own_run == (["flash-linear-attention causal conv1d update (decode)"] if fla else [])
    for name, row in library.items():
        assert row["unpatched"] > 0 and row["patched"] > 0, name
        assert row["patched_hits"] > 0 and row["patched_fallbacks"] == 0, name


def test_misses_and_first_calls_are_reported(host_report):
    report, stdout = host_report
    for shape in SHAPES:
        cold = report["cold_us"][shape.name]
        assert cold["fastkernel_miss_from_disk_cache"] > 0
        assert cold["fastkernel_first_call"] > 0
    assert "ns/call (x floor)" in stdout


@pytest.mark.parametrize("option", ["--iterations", "--repeats"])
def test_a_count_below_one_is_a_clear_error(option, capsys):
    import dispatch

    # The run stops before touching the driver.
    assert dispatch.main(["--host", option, "0"]) == 2
    assert f"{option} must be >= 1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def stand_in():
    """The recording stand-in driver, opened by this process's first launch."""
    sys.path.insert(0, str(REPO / "tests"))
    from stand_in_driver.recording import RecordingDriver, build_recording_driver

    path = build_recording_driver()
    if _C.driver_loaded() and _C.driver_library_path() != str(path):
        pytest.skip(f"this process already opened the driver {_C.driver_library_path()}")
    os.environ["FASTKERNEL_CUDA_DRIVER"] = str(path)
    drv = RecordingDriver(path)
    drv.reset()
    yield drv
    drv.reset()


@pytest.fixture(scope="module")
def add2_cubin():
    """(cubin, kernel name) of the add-2 benchmark kernel built for sm_90 (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fkbench.kernels import add2_kernel

    signature = {"x0": "*fp32", "x1": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    compiled = triton.compile(
        ASTSource(add2_kernel, signature, {(3,): 1024}), target=GPUTarget("cuda", 90, 32)
    )
    return compiled.asm["cubin"], compiled.name


# x0, x1, n, then Triton's global_scratch and profile_scratch pointers (NULL).
ADD2_PARAMS = [
    struct.pack("<Q", 0x1000),
    struct.pack("<Q", 0x2000),
    struct.pack("<i", 4096),
    bytes(8),
    bytes(8),
]


def test_bench_floor_launches_the_given_bytes(stand_in, add2_cubin):
    cubin, name = add2_cubin
    stand_in.reset()
    _C.bench_floor(cubin, name, 0, (4, 1, 1), 128, 0, ADD2_PARAMS, 0x55, 3)
    launches = stand_in.launches()
    assert len(launches) == 3
    for launch in launches:
        assert (launch.name, launch.grid, launch.block, launch.stream) == (
            name,
            (4, 1, 1),
            (128, 1, 1),
            0x55,
        )
        assert launch.params == ADD2_PARAMS


def test_bench_floor_loads_once_and_reports_errors(stand_in, add2_cubin):
    cubin, name = add2_cubin
    stand_in.reset()
    floor = _C.BenchFloor(cubin, name, 0, 128, 0, ADD2_PARAMS)
    floor.run((1, 1, 1), 0, 2)
    floor.run((1, 1, 1), 0, 2)
    assert stand_in.module_loads() == 1 and stand_in.launch_count() == 4
    with pytest.raises(ValueError, match="grid dimension"):
        floor.run((0, 1, 1), 0, 1)
    floor.close()
    with pytest.raises(RuntimeError, match="closed"):
        floor.run((1, 1, 1), 0, 1)
    with pytest.raises(ValueError, match="ELF"):
        _C.BenchFloor(b"not a cubin", name, 0, 128, 0, ADD2_PARAMS)
    with pytest.raises(ValueError, match="block_x"):
        _C.BenchFloor(cubin, name, 0, 0, 0, ADD2_PARAMS)
    with pytest.raises(CudaError, match="cuModuleGetFunction"):
        _C.BenchFloor(cubin, "no_such_kernel", 0, 128, 0, ADD2_PARAMS)
    # Too few parameters: the driver (here the stand-in) rejects the launch.
    with pytest.raises(CudaError, match="benchmark floor"):
        _C.bench_floor(cubin, name, 0, (1, 1, 1), 128, 0, ADD2_PARAMS[:2], 0, 1)


ANNOTATE = """\
--------------------------------------------------------------------------------
Profile data file 'callgrind.out.1' (creator: callgrind-3.19.0)
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
50,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir               file:function
--------------------------------------------------------------------------------
50,000 (100.0%)  /src/bench_floor.cpp:fastkernel_bench_call_loop [/x/_C.so]
30,000 (60.00%)  /src/kernel_object.cpp:fastkernel::(anonymous namespace)::launch_bound(_object*, _object* const*, unsigned long, _object*) [/x/_C.so]
12,000 (24.00%)  /src/trampoline.cpp:fastkernel::launch(fastkernel::LaunchRecord const&, fastkernel::LaunchGrid const&, fastkernel::CUstream_st*, fastkernel::ArgValue const*, unsigned long long, unsigned long long) [/x/_C.so]
10,000 (20.00%)  /src/key_builder.cpp:fastkernel::bind_and_build_key(fastkernel::KernelObject*, _object* const*, long, _object*, fastkernel::BoundCall*) [/x/_C.so]
 9,000 (18.00%)  ???:cuLaunchKernel [/x/librecording_driver.so]
 2,000 ( 4.00%)  /src/launch_table.cpp:fastkernel::LaunchTable::lookup(fastkernel::SpecializationKey const&) [/x/_C.so]
   500 ( 1.00%)  /src/launch_context.cpp:fastkernel::current_launch_context() [/x/_C.so]
   100 ( 0.20%)  ???:cuLaunchKernelEx [/x/librecording_driver.so]
"""


def test_annotate_report_is_parsed_into_groups():
    total, functions = parse_annotate_output(ANNOTATE)
    assert total == 50000
    assert functions["cuLaunchKernel"] == 9000
    per = breakdown(total, functions, hits=10)
    assert per["total"] == 5000
    assert per["key build"] == 1000
    assert per["lookup"] == 200
    assert per["stream query"] == 50
    assert per["driver call"] == 900
    assert per["packing"] == 300  # fastkernel::launch less the driver call
    assert per["entry"] == 5000 - 1000 - 200 - 50 - 1200


def test_absent_group_stays_in_entry():
    total, functions = parse_annotate_output(ANNOTATE)
    del functions["fastkernel::current_launch_context()"]
    per = breakdown(total, functions, hits=1)
    assert per["stream query"] is None
    assert per["entry"] == 50000 - 10000 - 2000 - 12000


def test_warm_start_is_measured_in_fresh_processes(host_report):
    report, stdout = host_report
    warm = report["warm_start"]
    assert warm["fastkernel_cold"]["triton_compiles"] == [1]  # empty caches: Triton compiled
    assert all(n == 0 for n in warm["fastkernel_warm"]["triton_compiles"])  # read from disk
    for system in ("fastkernel_cold", "fastkernel_warm"):
        assert warm[system]["start_to_first_launch_s"] > warm[system]["first_call_s"] > 0
        # Host-side, the stand-in driver is mapped before the timed call, and that is reported.
        assert warm[system]["driver_map_s"] > 0
        assert len(warm[system]["first_call_samples_s"]) == len(warm[system]["triton_compiles"])
    assert "triton_warm" in warm["absent"] and warm["warm_speedup"] is None
    imports = warm["import"]
    assert imports["torch_triton_ms"] > 0 and imports["fastkernel_ms"] > 0
    assert "import fastkernel after them" in stdout
    assert "warm start (fresh processes" in stdout


def test_the_warm_start_is_the_warm_index_path(host_report):
    """The warm first call measured is the whole warm path: its specialization came from the
    warm index (Triton's binder skipped), not only its binary from the disk cache."""
    report, stdout = host_report
    warm = report["warm_start"]
    assert warm["fastkernel_cold"]["warm_index_loads"] == [0]
    assert warm["fastkernel_warm"]["warm_index_loads"] == [1] * len(
        warm["fastkernel_warm"]["first_call_samples_s"]
    )
    assert "loaded through the warm index" in stdout


def test_the_callgrind_warm_first_call_child_launches_once_from_a_cold_then_warm_cache(tmp_path):
    """The child ``--callgrind`` runs under valgrind for the warm first call count, run
    natively: twice on one private disk cache (the first compiles or reads Triton's cache, the
    second reads fastkernel's), each exactly one launch on the stand-in (else it exits 1)."""
    from fkbench.callgrind import child_command

    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        "FASTKERNEL_CACHE_DIR": str(tmp_path / "cache"),
    }
    cmd = child_command(pathlib.Path(_C.__file__), REPO, "--warm-first-call")
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list((tmp_path / "cache" / "entries").glob("*/*.fkc"))
