"""End-to-end on a real GPU: fastkernel's results equal Triton's own ``kernel[grid]`` and torch.

Marked ``gpu``: skipped where there is no CUDA device (CI), run wherever one is."""

from __future__ import annotations

import kernels
import pytest
import torch
import triton

from fastkernel import fastkernel

pytestmark = pytest.mark.gpu

DEV = "cuda"


def test_vector_add_matches_triton_and_torch():
    k = fastkernel(kernels.add_kernel)
    n = 98432
    x, y = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
    out, ref = torch.empty_like(x), torch.empty_like(x)
    grid = (triton.cdiv(n, 1024),)
    k[grid](x, y, out, n, BLOCK=1024)
    kernels.add_kernel[grid](x, y, ref, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.equal(out, x + y)


def test_fused_softmax_matches_triton_and_torch():
    k = fastkernel(kernels.softmax_kernel)
    x = torch.randn(123, 781, device=DEV)
    out, ref = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    k[(x.shape[0],)](out, x, x.stride(0), out.stride(0), x.shape[1], BLOCK=block, num_warps=8)
    kernels.softmax_kernel[(x.shape[0],)](
        ref, x, x.stride(0), ref.stride(0), x.shape[1], BLOCK=block, num_warps=8
    )
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    torch.testing.assert_close(out, torch.softmax(x, dim=1))


def _matmul_problem(m, n, kdim):
    """fp16 a (m x kdim) and b (kdim x n), two fp32 outputs, the grid rule and the size/stride
    arguments that come between the pointers and c's strides."""
    a = torch.randn(m, kdim, device=DEV, dtype=torch.float16)
    b = torch.randn(kdim, n, device=DEV, dtype=torch.float16)
    c, ref = (torch.empty(m, n, device=DEV, dtype=torch.float32) for _ in range(2))

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))

    return a, b, c, ref, grid, (m, n, kdim, a.stride(0), a.stride(1), b.stride(0), b.stride(1))


@pytest.mark.parametrize("m,n,kdim", [(256, 128, 64), (257, 129, 65)])
def test_matmul_matches_triton_and_torch(m, n, kdim):
    k = fastkernel(kernels.matmul_kernel)
    a, b, c, ref, grid, args = _matmul_problem(m, n, kdim)
    k[grid](a, b, c, *args, c.stride(0), c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    kernels.matmul_kernel[grid](
        a, b, ref, *args, ref.stride(0), ref.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32
    )
    torch.cuda.synchronize()
    assert torch.equal(c, ref)
    torch.testing.assert_close(c, (a.float() @ b.float()), atol=5e-2, rtol=1e-2)


def test_unaligned_slices_get_their_own_binary_and_correct_results():
    k = fastkernel(kernels.add_kernel)
    base = torch.randn(4099, device=DEV)
    for start in (0, 1, 2, 3, 4):
        x = base[start : start + 4093]
        y = torch.randn_like(x)
        out = torch.empty(4096, device=DEV)[1:4094]
        k[(triton.cdiv(4093, 1024),)](x, y, out, 4093, BLOCK=1024)
        torch.cuda.synchronize()
        assert torch.equal(out, x + y)
    assert k.stats()["specializations"] >= 2


def test_int_equal_to_one_and_none_arguments():
    k = fastkernel(kernels.scalars_kernel)
    extra = torch.randn(32, device=DEV)
    for one, maybe in [(1, None), (3, None), (1, extra), (3, extra)]:
        out, ref = torch.empty(32, device=DEV), torch.empty(32, device=DEV)
        args = (5, 2**40, 7, 1.5, 0.25, -2.0, 3.0, True, maybe, one)
        k[(1,)](out, *args, BLOCK=32)
        kernels.scalars_kernel[(1,)](ref, *args, BLOCK=32)
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
    assert k.stats()["specializations"] == 4


def test_many_repeated_calls_are_native_hits():
    k = fastkernel(kernels.add_kernel)
    n = 4096
    x, y, out = torch.randn(n, device=DEV), torch.randn(n, device=DEV), torch.empty(n, device=DEV)
    for _ in range(10000):
        k[(4,)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)
    stats = k.stats()
    assert stats["misses"] == 1 and stats["hits"] == 9999 and stats["fallbacks"] == 0


def test_launch_uses_torchs_current_stream():
    k = fastkernel(kernels.add_kernel)
    n = 1 << 20
    x, y = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
    out = torch.zeros(n, device=DEV)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # The kernel must be queued on `side`: record an event after it there and wait on it.
        k[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert torch.equal(out, x + y)


def test_warm_start_in_a_fresh_process_never_calls_the_compiler(tmp_path):
    """A second process with the disk cache warm launches without Triton's compiler."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, torch, triton
        import fastkernel, kernels
        from fastkernel import _triton_abi as abi
        if sys.argv[1] == "warm":
            def refuse(*args, **kwargs):
                raise AssertionError("the warm path called Triton's compiler")
            triton.compile = abi.compile_specialization = refuse
        k = fastkernel.fastkernel(kernels.add_kernel)
        x = torch.randn(4096, device="cuda"); out = torch.empty_like(x)
        k[(4,)](x, x, out, 4096, BLOCK=1024)
        torch.cuda.synchronize()
        assert torch.equal(out, x + x)
        print("ok", type(k._compiled[-1]).__name__)
    """)
    env = {**os.environ, "FASTKERNEL_CACHE_DIR": str(tmp_path)}
    cwd = os.path.dirname(os.path.abspath(__file__))
    cold = subprocess.run(
        [sys.executable, "-c", code, "cold"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warm = subprocess.run(
        [sys.executable, "-c", code, "warm"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cold.returncode == 0, cold.stderr
    assert warm.returncode == 0, warm.stderr
    assert cold.stdout.split() == ["ok", "CompiledKernel"]
    assert warm.stdout.split() == ["ok", "CachedKernel"]


# -- fastkernel.autotune on a GPU ----------------------------------------------------------------

MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for m, n, k, w, s in [
        (32, 32, 32, 2, 2),
        (64, 64, 32, 4, 3),
        (128, 64, 32, 4, 3),
        (64, 128, 64, 8, 3),
    ]
]


def test_autotuned_matmul_equals_triton_with_the_chosen_config():
    import fastkernel as fkmod

    k = fkmod.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])(
        fastkernel(kernels.matmul_kernel)
    )
    m, n, kdim = 300, 200, 96
    a, b, c, ref, grid, args = _matmul_problem(m, n, kdim)
    k[grid](a, b, c, *args, c.stride(0), c.stride(1))
    best = k.best_config
    kernels.matmul_kernel[grid](a, b, ref, *args, ref.stride(0), ref.stride(1), **best.all_kwargs())
    torch.cuda.synchronize()
    assert torch.equal(c, ref)
    torch.testing.assert_close(c, (a.float() @ b.float()), rtol=1e-2, atol=1e-2)
    c.zero_()
    k[grid](a, b, c, *args, c.stride(0), c.stride(1))  # the native hit
    torch.cuda.synchronize()
    assert torch.equal(c, ref)
    assert k.stats()["hits"] == 1


def test_autotuned_in_place_fused_add_rmsnorm_equals_one_clean_run():
    import fastkernel as fkmod

    configs = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)]
    k = fkmod.autotune(configs=configs, key=["n_cols"], restore_value=["res_ptr"])(
        fastkernel(kernels.fused_add_rmsnorm_kernel)
    )
    rows, cols = 64, 1000
    x = torch.randn(rows, cols, device=DEV)
    res0 = torch.randn(rows, cols, device=DEV)
    w = torch.randn(cols, device=DEV)
    res, out = res0.clone(), torch.empty(rows, cols, device=DEV)
    k[(rows,)](x, res, w, out, cols, 1e-6, BLOCK=1024)
    torch.cuda.synchronize()
    expected_res = res0 + x
    torch.testing.assert_close(res, expected_res, rtol=0, atol=0)
    rms = torch.rsqrt((expected_res * expected_res).mean(dim=1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out, expected_res * rms * w, rtol=1e-5, atol=1e-5)


def test_autotuned_accumulator_with_reset_to_zero_equals_one_clean_run():
    import fastkernel as fkmod

    configs = [triton.Config({"BLOCK": b}) for b in (128, 256, 512, 1024)]
    k = fkmod.autotune(configs=configs, key=["n"], reset_to_zero=["out_ptr"])(
        fastkernel(kernels.accumulate_kernel)
    )
    n = 100_000
    x = torch.randn(n, device=DEV)
    out = torch.zeros(n, device=DEV)
    k[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_a_second_process_reuses_the_tuned_config_without_benchmarking(tmp_path):
    import os
    import subprocess
    import sys

    script = f"""
import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
import torch, triton, triton.testing
import fastkernel
from fastkernel import fastkernel as fk
import kernels
calls = []
real = triton.testing.do_bench
triton.testing.do_bench = lambda *a, **k: calls.append(1) or real(*a, **k)
k = fastkernel.autotune(configs=[triton.Config({{"BLOCK": b}}) for b in (256, 512, 1024)],
                        key=["n"])(fk(kernels.add_kernel))
x = torch.randn(50000, device="cuda")
out = torch.empty_like(x)
k[lambda m: (triton.cdiv(50000, m["BLOCK"]),)](x, x, out, 50000)
torch.cuda.synchronize()
assert torch.equal(out, x + x)
print(len(calls), k.best_config.kwargs["BLOCK"])
"""
    env = dict(os.environ, FASTKERNEL_CACHE_DIR=str(tmp_path))
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    second = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert first[0] == "3" and second[0] == "0" and first[1] == second[1]
