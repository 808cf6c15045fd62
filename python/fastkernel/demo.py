"""``python -m fastkernel demo``: run example kernels through fastkernel, check them against
torch, and on a GPU print per-call dispatch time beside Triton's ``kernel[grid]``.

Without a GPU the same kernels run in Triton's interpreter on CPU tensors (checked the same
way), and the demo says that timings need a GPU."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _check(name: str, got, want, **tol) -> bool:
    import torch

    ok = torch.allclose(got, want, **tol) if tol else torch.equal(got, want)
    print(f"  {name:<28} {'ok' if ok else 'MISMATCH'}")
    return ok


def run_examples(device: str) -> bool:
    import torch
    import triton

    from . import _examples as ex

    torch.manual_seed(0)
    ok = True
    n = 10000
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.empty_like(x)
    ex.add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    ok &= _check("add (tuple grid)", out, x + y)
    out2 = torch.empty_like(x)[1:]
    ex.add_kernel[lambda meta: (triton.cdiv(n - 1, meta["BLOCK"]),)](
        x[1:], y[1:], out2, n - 1, BLOCK=512, num_warps=4
    )
    ok &= _check("add (callable grid, x[1:])", out2, x[1:] + y[1:])

    s = torch.randn(64, 300, device=device)
    so = torch.empty_like(s)
    ex.softmax_kernel[(s.shape[0],)](
        so, s, s.stride(0), so.stride(0), s.shape[1], BLOCK=triton.next_power_of_2(s.shape[1])
    )
    ok &= _check("fused softmax", so, torch.softmax(s, dim=1), atol=1e-6, rtol=1e-5)

    m, nn, k = 96, 80, 64
    dtype = torch.float16 if device == "cuda" else torch.float32
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, nn, device=device, dtype=dtype)
    c = torch.empty(m, nn, device=device, dtype=torch.float32)
    ex.matmul_kernel[(triton.cdiv(m, 32), triton.cdiv(nn, 32))](
        a,
        b,
        c,
        m,
        nn,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        BLOCK_M=32,
        BLOCK_N=32,
        BLOCK_K=32,
    )
    ok &= _check("matmul", c, a.float() @ b.float(), atol=5e-2, rtol=1e-2)

    acc = torch.zeros(n, device=device)
    for _ in range(2):  # the first call tunes (3 configs), the second is a tuned hit
        acc.zero_()
        ex.axpy_accumulate_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, acc, 0.5, n)
        ok &= _check("autotuned axpy (accumulate)", acc, 0.5 * x + y, atol=1e-6, rtol=1e-5)
    return bool(ok)


def _per_call_us(fn, iterations: int, repeats: int = 5) -> float:
    """Median wall-clock microseconds per call of a steady-state loop (synchronized)."""
    import torch

    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(samples)


def time_dispatch(iterations: int) -> None:
    import torch

    from . import _examples as ex

    n = 4096
    x, y, out = (torch.randn(n, device="cuda") for _ in range(3))
    fk = lambda: ex.add_kernel[(4,)](x, y, out, n, BLOCK=1024)  # noqa: E731
    tr = lambda: ex.add_kernel.jit_function[(4,)](x, y, out, n, BLOCK=1024)  # noqa: E731
    fk_us = _per_call_us(fk, iterations)
    tr_us = _per_call_us(tr, iterations)
    print(
        f"\nPer-call dispatch, add kernel N={n} fp32 (median of 5 x {iterations} calls, "
        f"{torch.cuda.get_device_name()}):"
    )
    print(f"  Triton kernel[grid]      {tr_us:8.2f} us")
    print(f"  fastkernel kernel[grid]  {fk_us:8.2f} us   ({tr_us / fk_us:.1f}x faster)")
    print(f"  native path: {ex.add_kernel.stats()}")

    # An autotuned kernel: fastkernel's tuned hit against triton.autotune's (both tuned first).
    import triton

    tuned = ex.axpy_accumulate_kernel
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    tuned[grid](x, y, out, 0.5, n)
    triton_tuned = triton.autotune(configs=tuned.configs, key=["n"], reset_to_zero=["out_ptr"])(
        tuned.jit_function
    )
    triton_tuned[grid](x, y, out, 0.5, n)
    fk_tuned_us = _per_call_us(lambda: tuned[grid](x, y, out, 0.5, n), iterations)
    tr_tuned_us = _per_call_us(lambda: triton_tuned[grid](x, y, out, 0.5, n), iterations)
    print(f"\nPer-call dispatch, autotuned axpy N={n} (config {tuned.best_config}):")
    print(f"  triton.autotune kernel[grid]      {tr_tuned_us:8.2f} us")
    print(
        f"  fastkernel.autotune kernel[grid]  {fk_tuned_us:8.2f} us   "
        f"({tr_tuned_us / fk_tuned_us:.1f}x faster)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastkernel demo", description=__doc__)
    parser.add_argument(
        "--iterations",
        type=int,
        default=20000,
        help="calls per timing repeat on a GPU (default 20000)",
    )
    args = parser.parse_args(argv)
    import torch

    if torch.cuda.is_available():
        print(f"fastkernel demo on {torch.cuda.get_device_name()}: native launches")
        ok = run_examples("cuda")
        if ok:
            time_dispatch(args.iterations)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        # The interpreter must be chosen before triton is first imported (triton.language's own
        # jit helpers are decorated at import), so rerun this demo in a process that sets it.
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        return subprocess.call([sys.executable, "-m", "fastkernel", "demo", *(argv or [])], env=env)
    else:
        print(
            "fastkernel demo: no CUDA GPU here, so the kernels run in Triton's interpreter on "
            "CPU tensors"
        )
        ok = run_examples("cpu")
        print(
            "Timings need a GPU: on one, this demo prints per-call dispatch time beside "
            "Triton's kernel[grid]."
        )
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1
