"""Example kernels the demo runs: an elementwise add, a fused softmax, a tiled matmul and an
autotuned accumulating axpy.

Decorated when this module is imported, so the demo imports it only after choosing between a
GPU (native launches) and Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors)."""

import triton
import triton.language as tl

from ._autotune import autotune
from .kernel import fastkernel


@fastkernel
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(
        out_ptr + offs,
        tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
        mask=mask,
    )


@fastkernel
@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_row_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_row_stride + offs, num / tl.sum(num, axis=0), mask=mask)


@fastkernel
@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
            mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a, b)
    tl.store(
        c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn,
        acc,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


@autotune(
    configs=[
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
        triton.Config({"BLOCK": 4096}, num_warps=8),
    ],
    key=["n"],
    reset_to_zero=["out_ptr"],
)
@fastkernel
@triton.jit
def axpy_accumulate_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    # out += alpha * x + y with atomics: an accumulator that needs its output zeroed, tuned
    # over BLOCK and num_warps (reset_to_zero keeps the tuning runs out of the result).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    tl.atomic_add(out_ptr + offs, v, mask=mask)
