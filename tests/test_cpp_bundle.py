"""C++ callers: a bundle exported from Python is loaded and launched by a C++ program built with
CMake against the installed package (find_package(fastkernel)); the driver receives the same
bytes as from the Python launch. Runs against the recording stand-in driver (CPU)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import kernels
import pytest
import torch
import triton
import triton.language as tl

import fastkernel
from fastkernel import _C
from fastkernel import fastkernel as fk

HERE = pathlib.Path(__file__).resolve().parent


def _tool(name: str) -> str:
    found = shutil.which(
        name, path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if found is None:
        pytest.fail(f"{name} is a build dependency of fastkernel and must be installed")
    return found


@pytest.fixture(scope="module")
def cpp_program(tmp_path_factory):
    build = tmp_path_factory.mktemp("cpp-build")
    cmake = _tool("cmake")
    subprocess.run(
        [
            cmake,
            "-S",
            str(HERE / "cpp"),
            "-B",
            str(build),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
            f"-Dfastkernel_DIR={fastkernel.get_cmake_dir()}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    subprocess.run([cmake, "--build", str(build)], check=True, capture_output=True, text=True)
    return build / "launch_bundle"


def test_header_compiles_on_its_own(tmp_path):
    source = tmp_path / "only_header.cpp"
    source.write_text("#include <fastkernel/fastkernel.h>\nint main() { return 0; }\n")
    result = subprocess.run(
        [
            "c++",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            f"-I{fastkernel.get_include()}",
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_cpp_program_launches_an_exported_bundle_like_python(stand_in, cpp_program, tmp_path):
    k = fk(kernels.add_kernel)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)  # registers the aligned specialization
    k[(4,)](x, y, out[1:], 4095, BLOCK=1024)  # and an unaligned one
    python_launches = stand_in.launches()
    bundle = tmp_path / "bundle"
    cubins = fastkernel.export(k, bundle)
    assert len(cubins) == 2 and (bundle / "manifest.txt").is_file()

    def run(xp, yp, op, n):
        result = subprocess.run(
            [str(cpp_program), str(bundle), hex(xp), hex(yp), hex(op), str(n), "4"],
            capture_output=True,
            text=True,
            env={**os.environ},
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.splitlines()

    # The manifest lists the aligned entry first (registration order): out_ptr "%16" there.
    for number, launch, (o, n) in zip(range(2), python_launches, [(out, 4096), (out[1:], 4095)]):
        lines = run(x.data_ptr(), y.data_ptr(), o.data_ptr(), n)
        assert lines[0] == f"entry {cubins[number].name}"
        assert lines[1] == (f"grid 4 1 1 block 128 stream {0x5EED5} params " + launch.raw.hex())
        assert lines[2].startswith(
            "mismatch: fastkernel: no entry matches add_kernel(int, pointer,"
        )
        assert "the bundle has:" in lines[2]
        (count,) = [line for line in lines if line.startswith("count: ")]
        assert count.startswith("count: fastkernel: add_kernel[")
        assert count.endswith("takes 4 arguments, got 3")
    manifest = (bundle / "manifest.txt").read_text().splitlines()
    entries = [i for i, line in enumerate(manifest) if line.startswith("entry ")]
    out_patterns = [manifest[i + 4] for i in entries]  # entry, constexprs, x, y, out
    assert out_patterns == ["arg 1 0 1 1 1 0 *fp32", "arg 1 0 2 1 1 0 *fp32"]  # %16, then not


@triton.jit
def scaled_kernel(out_ptr, n: tl.int32, scale: tl.float16, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, (n * scale).to(tl.float32) + tl.zeros([BLOCK], tl.float32))


@pytest.fixture(scope="module")
def contract_program(cpp_program):
    return cpp_program.parent / "bundle_contract"


def _contract(program, *args) -> list[str]:
    result = subprocess.run(
        [str(program), *(str(a) for a in args)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_annotated_parameters_export_one_entry_cpp_calls_with_python_values(
    stand_in, contract_program, tmp_path
):
    # Triton types an annotated parameter by its annotation: an int32 parameter passed 1 is not
    # made a constant, and an fp16 parameter takes an int (converted). Python keys the int and
    # the float apart, yet both are one specialization with one binary: exported once, and C++
    # passing the same values launches the same bytes.
    k = fk(scaled_kernel)
    out = torch.empty(128)
    k[(1,)](out, 1, 2.5, BLOCK=128)
    k[(1,)](out, 1, 2, BLOCK=128)
    as_float, as_int = stand_in.launches()
    bundle = tmp_path / "bundle"
    assert len(fastkernel.export(k, bundle)) == 1
    p = f"p:{out.data_ptr():#x}"
    for python, scale in ((as_float, "f:2.5"), (as_int, "i:2")):
        lines = _contract(contract_program, "call", bundle, "scaled_kernel", 0, p, "i:1", scale)
        assert lines == [f"grid 1 1 1 block 128 stream {0x5EED5} params {python.raw.hex()}"]
    (overflow,) = _contract(contract_program, "call", bundle, "scaled_kernel", 0, p, "i:1", "f:1e6")
    assert overflow.startswith("ParamError 2: fastkernel: scaled_kernel[*fp32 %16, i32, fp16]")
    assert overflow.endswith("argument 2: value 1000000 is out of range for fp16")


def _exported_add(tmp_path) -> tuple[pathlib.Path, str]:
    """A bundle of add_kernel's aligned specialization, and an aligned pointer (hex) to call it
    with."""
    k = fk(kernels.add_kernel)
    x = torch.randn(4096)
    k[(4,)](x, x, x, 4096, BLOCK=1024)
    bundle = tmp_path / "bundle"
    fastkernel.export(k, bundle)
    return bundle, hex(x.data_ptr())


def test_a_bundle_launches_in_the_primary_context_of_the_device_it_is_given(
    stand_in, contract_program, tmp_path
):
    bundle, p = _exported_add(tmp_path)
    assert _contract(contract_program, "devices", bundle, p, p, p) == [
        "device 1 launched on 1",
        "device 0 launched on 0",
        "device 1 launched on 1",
        "from device 1's context: launched on 0, context kept 1",
    ]


def test_a_bundle_unloads_its_modules_and_launch_entry_refuses_what_its_entry_cannot_run(
    stand_in, contract_program, tmp_path
):
    bundle, p = _exported_add(tmp_path)
    lines = _contract(contract_program, "lifetime", bundle, p, p, p)
    assert lines[0] == "loaded 2 unloaded 2"  # one module per device, unloaded with the bundle
    assert lines[1] == "moved-from: fastkernel: launch_entry on a moved-from Bundle"
    assert lines[2].startswith("misaligned: fastkernel: argument 2 (a pointer) does not have")
    assert lines[3] == "launches after the refusals 0"
    assert lines[4] == "empty directory: fastkernel: Bundle::load: the bundle directory is empty"


def test_export_needs_a_launched_kernel(tmp_path):
    with pytest.raises(ValueError, match="no registered specialization"):
        fastkernel.export(fk(kernels.add_kernel), tmp_path / "b")
    with pytest.raises(TypeError, match="fastkernel kernel"):
        fastkernel.export(kernels.add_kernel, tmp_path / "b")


def test_export_checks_its_arguments_kinds_before_values(tmp_path):
    with pytest.raises(TypeError, match="argument 'path' must be a str or os.PathLike, not int"):
        fastkernel.export(fk(kernels.add_kernel), 5)  # unlaunched too: the kind comes first
    with pytest.raises(TypeError, match="argument 'kernel' must be a @fastkernel kernel"):
        fastkernel.export(kernels.add_kernel, 5)
    assert not (tmp_path / "b").exists()


@triton.jit
def index_times_kernel(out_ptr, v, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, (offs * v).to(tl.float32))


def test_a_failed_export_leaves_the_bundle_it_would_replace_as_it_was(stand_in, tmp_path):
    """An export refused part-way (a specialization C++ cannot call) writes nothing: the
    bundle already in the directory keeps its cubins, so it still loads."""
    out = torch.empty(64)
    bundle = tmp_path / "b"
    first = fk(index_times_kernel)
    first[(1,)](out, 3, BLOCK=64)
    fastkernel.export(first, bundle)
    before = {p.name: p.read_bytes() for p in bundle.iterdir()}
    second = fk(index_times_kernel)
    second[(1,)](out, 3, BLOCK=32)  # another cubin as its first entry
    second[(1,)](out, tl.constexpr(5), BLOCK=32)  # then one whose v C++ cannot pass
    with pytest.raises(ValueError, match="constexpr object"):
        fastkernel.export(second, bundle)
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == before


def _named_in_manifest(bundle: pathlib.Path) -> set[str]:
    lines = (bundle / "manifest.txt").read_text().splitlines()
    return {line.split(" ")[2] for line in lines if line.startswith("entry ")}


def test_a_re_export_replaces_the_bundle_and_removes_the_cubins_no_manifest_names(
    stand_in, tmp_path
):
    """Cubins are named by their content (symbol and SHA-256 prefix); after a re-export the
    directory holds the new manifest, its cubins and nothing of the bundle replaced, including
    a cubin an older manifest named in the old numbered style."""
    out = torch.empty(64)
    bundle = tmp_path / "b"
    first = fk(index_times_kernel)
    first[(1,)](out, 3, BLOCK=64)
    old = fastkernel.export(first, bundle)
    assert [p.name for p in old] == [
        f"index_times_kernel-{hashlib.sha256(old[0].read_bytes()).hexdigest()[:16]}.cubin"
    ]
    numbered = bundle / "index_times_kernel-0.cubin"
    numbered.write_bytes(old[0].read_bytes())
    manifest = bundle / "manifest.txt"
    manifest.write_text(manifest.read_text().replace(old[0].name, numbered.name))
    unrelated = bundle / "notes.txt"
    unrelated.write_text("kept")
    second = fk(index_times_kernel)
    second[(1,)](out, 3, BLOCK=32)
    second[(1,)](out, 1, BLOCK=32)
    new = fastkernel.export(second, bundle)
    assert len(new) == 2 and not {p.name for p in new} & {old[0].name}
    assert _named_in_manifest(bundle) == {p.name for p in new}
    assert {p.name for p in bundle.glob("*.cubin")} == {p.name for p in new}
    assert unrelated.read_text() == "kept"
    assert len(_C._testing.load_bundle(str(bundle))) == 2


def test_an_export_stopped_before_its_manifest_leaves_the_old_bundle_whole(
    stand_in, tmp_path, monkeypatch
):
    """An export that dies after writing its cubins and before its manifest (a kill, a full
    disk) has overwritten no cubin the old manifest names: the old bundle loads, and the next
    export removes the cubins the stopped one left."""
    out = torch.empty(64)
    bundle = tmp_path / "b"
    first = fk(index_times_kernel)
    first[(1,)](out, 3, BLOCK=64)
    (old,) = fastkernel.export(first, bundle)
    old_bytes = old.read_bytes()
    second = fk(index_times_kernel)
    second[(1,)](out, 3, BLOCK=32)
    write = fastkernel.cache.files.write_file

    def stop_at_the_manifest(path, data, mode=0o600):
        if pathlib.Path(path).name == "manifest.txt":
            raise OSError(28, "No space left on device")
        write(path, data, mode)

    monkeypatch.setattr(fastkernel.cache.files, "write_file", stop_at_the_manifest)
    with pytest.raises(OSError, match="No space"):
        fastkernel.export(second, bundle)
    monkeypatch.undo()
    assert len(list(bundle.glob("*.cubin"))) == 2  # the old one and the orphan
    assert old.read_bytes() == old_bytes
    assert _named_in_manifest(bundle) == {old.name}
    assert len(_C._testing.load_bundle(str(bundle))) == 1
    third = fk(index_times_kernel)
    third[(1,)](out, 3, BLOCK=16)
    (new,) = fastkernel.export(third, bundle)
    assert [p.name for p in bundle.glob("*.cubin")] == [new.name]


def test_export_replaces_a_manifest_that_is_no_regular_file(stand_in, tmp_path):
    """The manifest being replaced is read only for the cubin names to remove, without
    following a link or blocking on a FIFO; the export then replaces it."""
    out = torch.empty(64)
    k = fk(index_times_kernel)
    k[(1,)](out, 3, BLOCK=64)
    for name, make in (("fifo", os.mkfifo), ("link", lambda p: os.symlink("/dev/zero", p))):
        bundle = tmp_path / name
        bundle.mkdir()
        make(bundle / "manifest.txt")
        (cubin,) = fastkernel.export(k, bundle)
        assert (bundle / "manifest.txt").is_file() and not (bundle / "manifest.txt").is_symlink()
        assert _named_in_manifest(bundle) == {cubin.name}


@pytest.fixture(scope="module")
def cpp_torch_program(tmp_path_factory):
    """tests/cpp_torch built against fastkernel's CMake package (fastkernel::torch)."""
    build = tmp_path_factory.mktemp("cpp-torch-build")
    cmake = _tool("cmake")
    env = {
        **os.environ,
        "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    subprocess.run(
        [
            cmake,
            "-S",
            str(HERE / "cpp_torch"),
            "-B",
            str(build),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
            f"-Dfastkernel_DIR={fastkernel.get_cmake_dir()}",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    subprocess.run(
        [cmake, "--build", str(build)], check=True, capture_output=True, text=True, env=env
    )
    return build / "launch_tensors"


def test_cpp_launch_with_at_tensors_picks_entries_by_alignment_and_dtype(
    stand_in, cpp_torch_program, tmp_path
):
    k = fk(kernels.add_kernel)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    k[(4,)](x, y, out[1:], 4095, BLOCK=1024)
    aligned, unaligned = stand_in.launches()
    bundle = tmp_path / "bundle"
    fastkernel.export(k, bundle)
    result = subprocess.run(
        [str(cpp_torch_program), str(bundle)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["cpu:"].startswith(
        "add_kernel: argument 0 is a tensor on 'cpu'; a GPU launch needs CUDA tensors"
    )
    assert "no entry matches add_kernel(pointer, pointer, pointer)" in lines["arity-cpu:"]
    xp, yp, op = (int(v, 16) for v in lines["pointers"].split())
    sp = int(lines["shifted"], 16)
    launches = [line for line in result.stdout.splitlines() if line.startswith("launch ")]
    assert len(launches) == 2
    for line, python, (o, n) in zip(launches, (aligned, unaligned), ((op, 4096), (sp, 4095))):
        head, raw_hex = line.rsplit(" ", 1)
        assert head == f"launch grid 4 1 1 block 128 stream {0x5EED5} params"
        raw = bytes.fromhex(raw_hex)
        # The same parameter layout as the Python launch of that entry, with these pointers.
        assert len(raw) == len(python.raw)
        assert raw[:28] == struct.pack("<QQQi", xp, yp, o, n)
        assert raw[28:] == python.raw[28:]
    assert "no entry matches add_kernel(pointer, pointer, pointer, int)" in lines["dtype:"]
    assert "no entry matches add_kernel(int, pointer" in lines["kind:"]
    assert "argument 0 is an undefined tensor" in lines["undefined:"]
    assert "this torch build has no CUDA support" in lines["stream:"] or torch.cuda.is_available()


def test_cpp_torch_launch_allocates_the_scratch_an_entry_needs(
    stand_in, cpp_torch_program, tmp_path
):
    from triton.runtime import _allocation

    token = _allocation._allocator.set(
        lambda size, alignment, stream: torch.empty(size + alignment, dtype=torch.int8)
    )
    try:
        k = fk(kernels.device_descriptor_kernel)
        src, dst = torch.randn(64, 32), torch.empty(64, 32)
        k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    finally:
        _allocation._allocator.reset(token)
    (python_launch,) = stand_in.launches()
    meta = k._compiled[-1].metadata
    assert meta.global_scratch_size > 0
    add = fk(kernels.add_kernel)
    flat = torch.empty(4096)
    add[(4,)](flat, flat, flat, 4096, BLOCK=1024)
    add[(4,)](flat, flat, flat[1:], 4095, BLOCK=1024)  # the program's unaligned call
    fastkernel.export(add, tmp_path / "add")
    fastkernel.export(k, tmp_path / "scratch")
    result = subprocess.run(
        [str(cpp_torch_program), str(tmp_path / "add"), str(tmp_path / "scratch")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("scratch-pointers "))
    sp, dp = (int(v, 16) for v in out[at].split()[1:])
    raw = bytes.fromhex(out[at + 1].rsplit(" ", 1)[1])
    layout = python_launch.param_layout
    params = [raw[o : o + n] for o, n in layout]
    assert params[0] == struct.pack("<Q", sp) and params[1] == struct.pack("<Q", dp)
    assert params[2:-2] == python_launch.params[2:-2]  # M, N as Python packed them
    scratch = struct.unpack("<Q", params[-2])[0]
    assert scratch != 0 and scratch % meta.global_scratch_align == 0
    assert params[-1] == b"\0" * 8  # no profile scratch
    assert out[at + 2].startswith("no-scratch: fastkernel: device_descriptor_kernel[")
    assert (
        f"needs a global scratch buffer of {meta.global_scratch_size} bytes per CTA" in out[at + 2]
    )


def test_the_benchmark_cpp_row_launches_the_bytes_python_launches(stand_in, tmp_path):
    from fastkernel import fastkernel as fk
    from fkbench import common
    from fkbench.kernels import SHAPES as shapes

    for shape in shapes:
        stand_in.reset()
        k = fk(shape.kernel)
        args = shape.make_args("cpu")
        k[shape.grid](*args)
        (python_launch,) = stand_in.launches()
        timed = common.bundle_timed(k, args, shape.grid, 0, 0x5EED5, tmp_path / shape.name)
        timed.loop(3)
        launches = stand_in.launches()[1:]
        assert len(launches) == 3
        assert all(
            l.raw == python_launch.raw
            and l.image == python_launch.image
            and l.grid == python_launch.grid
            and l.block == python_launch.block
            for l in launches
        ), shape.name


def test_the_cpp_program_leaks_nothing_under_valgrind(stand_in, cpp_program, tmp_path):
    """The native core as a C++ caller uses it (bundle load, entry selection, a launch, a
    mismatch error), run under valgrind's memcheck: no invalid access and no definite or
    indirect leak. (Python processes are not leak-checked: CPython and torch keep memory until
    exit by design.)"""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    k = fk(kernels.add_kernel)
    x = torch.randn(4096)
    k[(4,)](x, x, x, 4096, BLOCK=1024)
    bundle = tmp_path / "bundle"
    (cubin,) = fastkernel.export(k, bundle)
    p = hex(x.data_ptr())
    # The program is uninstrumented: a sanitizer runtime preloaded into this interpreter (the
    # sanitizer pass of the suite) must not follow it into valgrind.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    result = subprocess.run(
        [
            valgrind,
            "--quiet",
            "--error-exitcode=97",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect",
            str(cpp_program),
            str(bundle),
            p,
            p,
            p,
            "4096",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == f"entry {cubin.name}"


def test_the_launch_table_keeps_a_pinned_record_when_an_allocation_fails(cpp_program):
    """retire() and clear() move a pinned record (one a launch in flight holds) into the
    table's retired list; where growing that list throws std::bad_alloc, the record stays
    registered and alive and the table usable (tests/cpp/table_alloc_failure.cpp injects the
    failure through a replaced operator new). Under valgrind too when it is installed, where a
    record destroyed too early is an invalid read."""
    program = str(cpp_program.parent / "table_alloc_failure")
    expected = [
        "ok retire_throws",
        "ok retire_leaves_the_record_registered",
        "ok retire_keeps_the_record_alive",
        "ok retire_then_retires",
        "ok clear_throws",
        "ok clear_keeps_the_pinned_record",
        "ok clear_then_clears",
        "ok clear_keeps_the_retired_record_alive",
        "ok unpinned_retired_record_is_destroyed",
    ]
    runs = [[program]]
    valgrind = shutil.which("valgrind")
    if valgrind is not None:
        # Valgrind replaces a program's own operator new unless told to leave it alone.
        runs.append(
            [
                valgrind,
                "--quiet",
                "--error-exitcode=97",
                "--leak-check=full",
                "--soname-synonyms=somalloc=nouserintercepts",
                program,
            ]
        )
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # as above
    for command in runs:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines() == expected


@pytest.mark.parametrize(
    "version, standard",
    [
        ("2.9.1+cu128", "cxx_std_17"),
        ("2.12.1", "cxx_std_17"),
        ("2.13.0+cpu", "cxx_std_20"),
        ("2.14.1+cu130", "cxx_std_20"),
        ("3.0.0a0+git1234", "cxx_std_20"),
        ("unknown", None),
    ],
)
def test_fastkernel_torch_carries_the_standard_torchs_extension_builder_uses(
    tmp_path, version, standard
):
    """fastkernel::torch requires C++20 from torch 2.13 (torch 2.14's headers do not compile as
    C++17), C++17 before; a version it cannot read stops the configure with the value."""
    from torch.utils import cpp_extension

    paths = ";".join(cpp_extension.include_paths())
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\n"
        "project(standard_probe LANGUAGES CXX)\n"
        f'set(FASTKERNEL_TORCH_INCLUDE_DIRS "{paths}")\n'
        f'set(FASTKERNEL_TORCH_LIBRARY_DIR "{cpp_extension.library_paths()[0]}")\n'
        f"set(FASTKERNEL_TORCH_CXX11_ABI {int(torch._C._GLIBCXX_USE_CXX11_ABI)})\n"
        f'set(FASTKERNEL_TORCH_VERSION "{version}")\n'
        f'include("{pathlib.Path(fastkernel.get_cmake_dir()) / "fastkernelTorch.cmake"}")\n'
        "get_target_property(features fastkernel::torch INTERFACE_COMPILE_FEATURES)\n"
        'message(STATUS "features=${features}")\n'
    )
    result = subprocess.run(
        [_tool("cmake"), "-S", str(tmp_path), "-B", str(tmp_path / "build")],
        capture_output=True,
        text=True,
    )
    if standard is None:
        assert result.returncode != 0
        message = " ".join(result.stderr.split())  # CMake wraps its messages
        assert f"cannot read a torch release from FASTKERNEL_TORCH_VERSION '{version}'" in message
    else:
        assert result.returncode == 0, result.stderr
        assert f"features={standard}\n" in result.stdout
