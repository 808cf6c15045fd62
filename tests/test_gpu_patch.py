"""fastkernel.patch() on a real GPU: plain Triton kernels, Triton's own autotune and heuristics,
launched natively, give exactly what Triton's own launcher gives on the same inputs, and the
repeated calls are native hits. Marked ``gpu``."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import corpus
import kernels
import pytest
import torch
import triton
import triton.language as tl
from test_corpus import triton_allocator_for_scratch  # noqa: F401 - a fixture used below

import fastkernel
from fastkernel.kernel import PATCH_ATTR

pytestmark = pytest.mark.gpu

NAMES = list(corpus.CASES)


def _dispatch_stats(kernel):
    return kernel.__dict__[PATCH_ATTR].stats()


def _plain(kernel):
    return kernel if isinstance(kernel, tuple) else (kernel,)


@pytest.mark.parametrize("name", NAMES)
def test_patched_corpus_equals_triton_bit_for_bit(name, triton_allocator_for_scratch):
    case = corpus.CASES[name]
    if case.hopper and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs compute capability 9.0")
    expected = case.run(case.kernel, "cuda")  # Triton's own launcher
    with fastkernel.patched():
        got = case.run(case.kernel, "cuda")  # a miss: registered natively
        again = case.run(case.kernel, "cuda")  # native hits
        torch.cuda.synchronize()
        stats = [_dispatch_stats(k) for k in _plain(case.kernel)]
    for e, g, a in zip(expected, got, again):
        assert torch.equal(e, g) and torch.equal(e, a), name
    for s in stats:
        assert s["fallbacks"] == 0 and s["hits"] >= 1, (name, s)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
    ],
    key=["n"],
)
@triton.jit
def _tuned_axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * x + y, mask=mask)


def _tuned_calls_patched(kernel, x, y, out, expected):
    """Three calls of the tuned axpy ``kernel`` (``out = 0.5 * x + y``, BLOCK from its
    configs) under the patch, each checked against ``expected``; the grid function and the
    dispatch's counters."""
    n = x.numel()

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK"]),)

    with fastkernel.patched():
        for _ in range(3):
            out.fill_(float("nan"))
            kernel[grid](x, y, out, 0.5, n)
            torch.cuda.synchronize()
            torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
        return grid, _dispatch_stats(kernel)


def test_patched_triton_autotune_tunes_as_triton_and_then_hits_natively():
    n = 100_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    grid, stats = _tuned_calls_patched(_tuned_axpy, x, y, out, 0.5 * x + y)
    assert _tuned_axpy.best_config is not None
    assert stats["hits"] >= 2 and stats["fallbacks"] == 0, stats
    # The tuned launch equals Triton's own launch of the chosen config, bit for bit.
    ref = torch.empty_like(x)
    _tuned_axpy[grid](x, y, ref, 0.5, n)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _heuristic_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2)
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@pytest.mark.parametrize("n", [4096, 4097])
def test_patched_heuristics_launch_natively_and_compute_what_triton_computes(n):
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    grid = (triton.cdiv(n, 1024),)
    with fastkernel.patched():
        for _ in range(2):
            _heuristic_scale[grid](x, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        stats = _dispatch_stats(_heuristic_scale)
    assert torch.equal(out, x * 2)
    assert stats["hits"] >= 1 and stats["fallbacks"] == 0, stats


@triton.heuristics({"HAS_Y": lambda args: args["y_ptr"] is not None})
@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
    ],
    key=["n", "HAS_Y"],
)
@triton.jit
def _stacked_axpy(x_ptr, y_ptr, out_ptr, a, n, HAS_Y: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = a * tl.load(x_ptr + offs, mask=mask)
    if HAS_Y:
        x += tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x, mask=mask)


@pytest.mark.parametrize("with_y", [True, False])
def test_patched_heuristics_over_autotune_tunes_as_triton_and_then_hits_natively(with_y):
    """flash-linear-attention's stack (a heuristics over an autotuner): tuned as Triton tunes,
    then one native hit per call, each launch computing what Triton's own launch computes."""
    n = 100_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda") if with_y else None
    out = torch.empty_like(x)
    expected = 0.5 * x + (y if with_y else 0)
    grid, stats = _tuned_calls_patched(_stacked_axpy, x, y, out, expected)
    best = _stacked_axpy.fn.best_config
    assert best is not None and PATCH_ATTR not in vars(_stacked_axpy.fn)
    assert stats["hits"] >= 2 and stats["fallbacks"] == 0, stats
    ref = torch.empty_like(x)
    _stacked_axpy[grid](x, y, ref, 0.5, n)  # Triton's own launch of the chosen config
    torch.cuda.synchronize()
    assert _stacked_axpy.fn.best_config is best and torch.equal(out, ref)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
    ],
    key=["n"],
)
@triton.heuristics(
    {
        "HAS_Y": lambda args: args["y_ptr"] is not None,
        "EVEN": lambda args: args["n"] % args["BLOCK"] == 0,
    }
)
@triton.jit
def _axpy_tuned_over_heuristics(
    x_ptr, y_ptr, out_ptr, a, n, HAS_Y: tl.constexpr, EVEN: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if EVEN:
        x = a * tl.load(x_ptr + offs)
    else:
        x = a * tl.load(x_ptr + offs, mask=mask)
    if HAS_Y:
        x += tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x, mask=mask)


@pytest.mark.parametrize("n, with_y", [(100_003, True), (100_003, False), (1 << 17, True)])
def test_patched_autotune_over_heuristics_tunes_as_triton_and_then_hits_natively(n, with_y):
    """FlagGems' upsampling stack (an autotuner over a heuristics, whose EVEN reads the tuned
    config's BLOCK): tuned as Triton tunes, then one native hit per call, each launch computing
    what Triton's own launch computes."""
    kernel = _axpy_tuned_over_heuristics
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda") if with_y else None
    out = torch.empty_like(x)
    expected = 0.5 * x + (y if with_y else 0)
    grid, stats = _tuned_calls_patched(kernel, x, y, out, expected)
    best = kernel.best_config
    assert best is not None and PATCH_ATTR not in vars(kernel.fn)
    assert stats["hits"] >= 2 and stats["fallbacks"] == 0, stats
    ref = torch.empty_like(x)
    kernel[grid](x, y, ref, 0.5, n)  # Triton's own launch of the chosen config
    torch.cuda.synchronize()
    assert kernel.best_config is best and torch.equal(out, ref)


def _zero_output(nargs):
    nargs["out_ptr"].zero_()


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 256}, pre_hook=_zero_output),
        triton.Config({"BLOCK": 1024}, pre_hook=_zero_output),
    ],
    key=["n"],
)
@triton.jit
def _atomic_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


def test_a_config_pre_hook_runs_before_every_native_hit():
    """The split-K pattern: each config's ``pre_hook`` zeroes the output the kernel adds into.
    Under the patch a tuned call is a native hit that still calls the hook first, so every
    call sums from zero (the sum of ones is exact in fp32)."""
    n = 100_003
    x = torch.ones(n, device="cuda")
    out = torch.full((1,), float("nan"), device="cuda")
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    _atomic_sum[grid](x, out, n)  # tuned unpatched, by Triton's timer
    with fastkernel.patched():
        for _ in range(3):
            _atomic_sum[grid](x, out, n)
            torch.cuda.synchronize()
            assert out.item() == n
        stats = _dispatch_stats(_atomic_sum)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats


def test_liger_tma_swiglu_patched_equals_unpatched(monkeypatch):
    """Liger-Kernel's fused gate/up SwiGLU for inference, whose configs set its host tensor
    descriptors' block shapes in a ``pre_hook``: the patched calls (native hits calling the
    hook) give Triton's own result bit for bit. Two of its configs, to keep tuning short."""
    mlp = pytest.importorskip("liger_kernel.ops.mlp")
    tuned = mlp._swiglu_kernel_forward_inference
    monkeypatch.setattr(tuned, "configs", tuned.configs[:2])
    x = torch.randn(1, 4, 256, device="cuda")
    gate, up = torch.randn(512, 256, device="cuda"), torch.randn(512, 256, device="cuda")
    expected, _ = mlp.gemm_swiglu(x, gate, up, 1.0, store_preact=False)
    with fastkernel.patched():
        outs = [mlp.gemm_swiglu(x, gate, up, 1.0, store_preact=False)[0] for _ in range(3)]
        torch.cuda.synchronize()
        stats = _dispatch_stats(tuned)
    for out in outs:
        assert torch.equal(out, expected)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats


def test_patched_handle_launches_compute_what_tritons_runner_computes():
    """Triton's fused-softmax tutorial: ``compiled = kernel.warmup(...)``, then
    ``compiled[(rows, 1, 1)](...)`` with every argument. Under the patch the handle's launches
    are native (the first makes its launcher, the later ones go straight to it) and give what
    Triton's own runner gives, bit for bit."""
    from fastkernel import _C

    x = torch.randn(123, 781, device="cuda")
    block = triton.next_power_of_2(x.shape[1])
    args = (x.stride(0), x.stride(0), x.shape[1], block)
    compiled = kernels.softmax_kernel.warmup(
        torch.empty_like(x), x, *args[:3], BLOCK=block, num_warps=8, grid=(x.shape[0],)
    )
    expected = torch.empty_like(x)
    compiled[(x.shape[0], 1, 1)](expected, x, *args)  # Triton's runner
    outs = [torch.full_like(x, float("nan")) for _ in range(3)]
    with fastkernel.patched():
        for out in outs:
            compiled[(x.shape[0], 1, 1)](out, x, *args)
        torch.cuda.synchronize()
        stats = _C.handle_launcher(compiled).stats()
    for out in outs:
        assert torch.equal(out, expected)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats


def test_a_kept_run_called_as_launch_caches_call_it_computes_what_triton_computes():
    """vLLM's ``CachedKernel`` keeps ``compiled.run`` and calls it with the current stream, the
    handle's function and packed metadata and the knobs' hooks. Under the patch that object is
    native: its launches compute what Triton's own launcher computes, and are native hits."""
    from fastkernel import _C

    n = 4097
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    args = (x, y, n, 1024)
    with fastkernel.patched():
        out = torch.empty_like(x)
        compiled = kernels.add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        run = compiled.run
        assert type(run) is _C.RunLauncher
        knobs = triton.knobs.runtime
        outs = [torch.full_like(x, float("nan")) for _ in range(3)]
        for o in outs:
            run(
                triton.cdiv(n, 1024),
                1,
                1,
                torch.cuda.current_stream().cuda_stream,
                compiled.function,
                compiled.packed_metadata,
                None,
                knobs.launch_enter_hook,
                knobs.launch_exit_hook,
                *args[:2],
                o,
                *args[2:],
            )
        torch.cuda.synchronize()
        stats = _C.handle_launcher(compiled).stats()
    for o in outs:
        assert torch.equal(o, x + y)
    assert stats["fallbacks"] == 0 and stats["hits"] == 2, stats


def test_run_patches_a_process_the_program_starts_on_the_gpu(tmp_path):
    """`python -m fastkernel run --stats prog.py` where prog.py starts another Python process
    (as torchrun starts its workers): that process launches natively on the GPU, computes what
    the kernel computes, and prints its own table."""
    tests_dir = pathlib.Path(__file__).resolve().parent
    child = tmp_path / "child.py"
    child.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(tests_dir)!r})\n"
        "import torch, kernels, fastkernel\n"
        "x = torch.randn(4096, device='cuda')\n"
        "y = torch.randn(4096, device='cuda')\n"
        "for _ in range(3):\n"
        "    out = torch.empty_like(x)\n"
        "    kernels.add_kernel[(4,)](x, y, out, 4096, BLOCK=1024)\n"
        "torch.cuda.synchronize()\n"
        "print('patched', fastkernel.is_patched(), 'equal', torch.equal(out, x + y))\n"
    )
    script = tmp_path / "prog.py"
    script.write_text(
        f"import subprocess, sys\nsubprocess.run([sys.executable, {str(child)!r}], check=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "fastkernel", "run", "--stats", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["patched", "True", "equal", "True"]
    lines = result.stderr.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("fastkernel: process "))
    assert lines[header].endswith("(child.py)")
    assert lines[header + 2].split() == ["kernels.add_kernel", "2", "1", "0"]
