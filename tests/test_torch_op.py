"""The example custom op (examples/torch_op): a TORCH_LIBRARY op implemented in C++ that
launches a fastkernel bundle kernel. Built here with CMake against the installed torch and
fastkernel, as a user would. CPU: registration, the Meta kernel torch.compile traces with,
errors. GPU: the launch itself, eager and under torch.compile."""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from test_cpp_bundle import _tool

import fastkernel

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ops():
    # One build directory per environment: CMake keeps the torch it configured against, and
    # another environment's (a version-matrix cell's, since removed) would not build.
    environment = hashlib.sha256(f"{sys.prefix}\0{torch.__version__}".encode()).hexdigest()
    build = ROOT / "build" / "test-torch-op" / environment[:16]
    env = {
        **os.environ,
        "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    subprocess.run(
        [
            _tool("cmake"),
            "-S",
            str(ROOT / "examples" / "torch_op"),
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
        [_tool("cmake"), "--build", str(build)], check=True, capture_output=True, text=True, env=env
    )
    torch.ops.load_library(str(next(build.glob("libfastkernel_example_ops*.so"))))
    return torch.ops.fastkernel_example


def test_the_op_traces_with_fake_tensors_for_torch_compile(ops):
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        return ops.add(x, y) * 2

    gm = make_fx(f, tracing_mode="fake")(torch.randn(8, 3), torch.randn(8, 3))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "fastkernel_example.add.default" in targets
    out = ops.add(torch.empty(5, 7, device="meta"), torch.empty(5, 7, device="meta"))
    assert out.shape == (5, 7) and out.device.type == "meta"


def test_the_op_reports_bad_inputs_and_a_missing_bundle(ops, tmp_path):
    with pytest.raises(RuntimeError, match="x and y differ in shape"):
        ops.add(torch.empty(3, device="meta"), torch.empty(4, device="meta"))
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        ops.add(torch.randn(3), torch.randn(3))  # the op is CUDA-only
    with pytest.raises(RuntimeError, match="cannot read"):
        ops.load_bundle(str(tmp_path / "missing"))


@pytest.mark.gpu
def test_the_op_launches_the_bundle_kernel_eager_and_compiled(ops, tmp_path):
    sys.path.insert(0, str(ROOT / "examples" / "torch_op"))
    import add_kernel as example

    example.export_bundle(tmp_path / "add")
    ops.load_bundle(str(tmp_path / "add"))
    for dtype in (torch.float32, torch.bfloat16):
        for n in (100_003, 100_000, 1):  # each class of n Triton specializes on
            x = torch.randn(n + 1, device="cuda", dtype=dtype)
            y = torch.randn(n + 1, device="cuda", dtype=dtype)
            assert torch.equal(ops.add(x[:n], y[:n]), x[:n] + y[:n])
            assert torch.equal(ops.add(x[1:], y[1:]), x[1:] + y[1:])  # unaligned inputs
    compiled = torch.compile(lambda a, b: ops.add(a, b) * 2, fullgraph=True)
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    torch.testing.assert_close(compiled(x, y), (x + y) * 2)
