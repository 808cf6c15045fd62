"""The differential corpus: kernels of the kinds real code uses, each with a function
that builds fresh inputs and runs one launch. The GPU test runs each case through Triton's own
``kernel[grid]`` and through fastkernel on identical inputs and compares the outputs exactly;
the CPU test launches each through fastkernel against the recording stand-in (so every kernel
compiles for sm_90 and takes the native path)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import kernels
import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@triton.jit
def layer_norm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, stride, n_cols, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1 / tl.sqrt(var + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(y_ptr + row * stride + cols, xc * rstd * w + b, mask=mask)


@triton.jit
def layer_norm_bwd_dx_kernel(
    dx_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, stride, n_cols, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    wdy = tl.where(mask, w * dy, 0.0)
    c1 = tl.sum(xhat * wdy, axis=0) / n_cols
    c2 = tl.sum(wdy, axis=0) / n_cols
    tl.store(dx_ptr + row * stride + cols, (wdy - (xhat * c1 + c2)) * rstd, mask=mask)


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed: tl.int64, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.rand(seed, offs) > p
    tl.store(out_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


@triton.jit
def strided_scale_kernel(x_ptr, out_ptr, n, stride, scale: tl.bfloat16, BLOCK: tl.constexpr):
    # stride is 1 on some calls (then Triton makes it a constexpr) and not on others; scale is a
    # bf16 scalar parameter.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, x * scale.to(tl.float32), mask=mask)


@gluon.jit
def gluon_scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    gl.store(out_ptr + offs, gl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


@dataclasses.dataclass
class Case:
    """One corpus case: ``run(kernel, device)`` makes fresh inputs (seeded, so both launches of
    the differential test see the same values), launches ``kernel`` once and returns the output
    tensors. ``hopper``: needs compute capability 9.0."""

    name: str
    kernel: Callable
    run: Callable
    hopper: bool = False


def _seeded(device: str):
    return torch.Generator(device=device).manual_seed(1234)


def _add(k, device):
    g = _seeded(device)
    x = torch.randn(98432, device=device, generator=g)
    y = torch.randn(98432, device=device, generator=g)
    out = torch.empty_like(x)
    k[(triton.cdiv(98432, 1024),)](x, y, out, 98432, BLOCK=1024)
    return [out]


def _softmax(k, device):
    x = torch.randn(123, 781, device=device, generator=_seeded(device))
    out = torch.empty_like(x)
    k[(123,)](out, x, x.stride(0), out.stride(0), 781, BLOCK=1024, num_warps=8)
    return [out]


def _layer_norm(k_fwd, k_bwd, device):
    g = _seeded(device)
    rows, cols = 64, 1000
    x = torch.randn(rows, cols, device=device, generator=g)
    w = torch.randn(cols, device=device, generator=g)
    b = torch.randn(cols, device=device, generator=g)
    dy = torch.randn(rows, cols, device=device, generator=g)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(rows, device=device)
    rstd = torch.empty(rows, device=device)
    k_fwd[(rows,)](x, y, w, b, mean, rstd, x.stride(0), cols, 1e-5, BLOCK=1024)
    k_bwd[(rows,)](dx, dy, x, w, mean, rstd, x.stride(0), cols, BLOCK=1024)
    return [y, mean, rstd, dx]


def _dropout(k, device):
    x = torch.randn(50000, device=device, generator=_seeded(device))
    out = torch.empty_like(x)
    k[(triton.cdiv(50000, 1024),)](x, out, 50000, 0.25, 2**40 + 123, BLOCK=1024)
    return [out]


def _strided(k, device):
    x = torch.randn(8192, device=device, generator=_seeded(device))
    outs = []
    for stride in (1, 2, 1):  # 1 -> a constexpr specialization, 2 -> a parameter, 1 again
        out = torch.empty(4096, device=device)
        k[(4,)](x, out, 4096, stride, -1.75, BLOCK=1024)
        outs.append(out)
    return outs


def _optional_pointer(k, device):
    g = _seeded(device)
    extra = torch.randn(16, device=device, generator=g)
    outs = []
    for maybe in (None, extra):  # an optional pointer: None specializes to a constexpr
        out = torch.empty(16, device=device)
        k[(1,)](out, 5, 2**40, 2**63 + 5, 1.25, 0.3, -2.7, 3.14159, True, maybe, 1, BLOCK=16)
        outs.append(out)
    return outs


def _big_shared(k, device):
    x = torch.randn(128, 256, device=device, generator=_seeded(device))  # 128 KB fp32 tile
    out = torch.empty(256, 128, device=device)
    k[(1,)](x, out, ROWS=128, COLS=256)
    return [out]


def _clusters(k, device):
    g = _seeded(device)
    x = torch.randn(8192, device=device, generator=g)
    y = torch.randn(8192, device=device, generator=g)
    out = torch.empty_like(x)
    k[(8,)](x, y, out, 8192, BLOCK=1024, num_ctas=2)
    return [out]


def _device_descriptor(k, device):
    src = torch.randn(64, 32, device=device, generator=_seeded(device))
    dst = torch.empty(64, 32, device=device)
    k[(4,)](src, dst, 64, 32, BLOCK_M=16, BLOCK_N=32)
    return [dst]


def _host_descriptors(k, device):
    from triton.tools.tensor_descriptor import TensorDescriptor

    g = _seeded(device)
    src = torch.randn(96, 128, device=device, generator=g)
    outs = []
    for padding in ("zero", "nan"):  # a runtime field: one binary, two tensor maps
        dst = torch.zeros(96, 128, device=device)
        k[(6, 4)](
            TensorDescriptor.from_tensor(src, [16, 32], padding=padding),
            TensorDescriptor.from_tensor(dst, [16, 32]),
            0.5,
            BLOCK_M=16,
            BLOCK_N=32,
        )
        outs.append(dst)
    return outs


def _persistent_matmul_descriptors(k, device):
    from triton.tools.tensor_descriptor import TensorDescriptor

    g = _seeded(device)
    m, n, kdim = 512, 384, 256
    a = torch.randn(m, kdim, device=device, generator=g).half()
    b = torch.randn(n, kdim, device=device, generator=g).half()
    c = torch.empty(m, n, device=device, dtype=torch.float16)
    k[(8,)](
        TensorDescriptor.from_tensor(a, [128, 64]),
        TensorDescriptor.from_tensor(b, [128, 64]),
        TensorDescriptor.from_tensor(c, [128, 128]),
        m,
        n,
        kdim,
        BLOCK_M=128,
        BLOCK_N=128,
        BLOCK_K=64,
        NUM_PROGRAMS=8,
        num_warps=8,
        num_stages=3,
    )
    return [c]


def _gluon_scale(k, device):
    x = torch.randn(5000, device=device, generator=_seeded(device))
    out = torch.empty_like(x)
    k[(triton.cdiv(5000, 512),)](x, out, 5000, 0.5, BLOCK=512)
    return [out]


def cases() -> list[Case]:
    return [
        Case("vector add", kernels.add_kernel, _add),
        Case("fused softmax", kernels.softmax_kernel, _softmax),
        Case(
            "layer norm forward and backward",
            (layer_norm_fwd_kernel, layer_norm_bwd_dx_kernel),
            lambda k, device: _layer_norm(k[0], k[1], device),
        ),
        Case("dropout with an int64 seed", dropout_kernel, _dropout),
        Case("bf16 scalar, int that is 1 on some calls", strided_scale_kernel, _strided),
        Case("None optional pointer", kernels.scalars_kernel, _optional_pointer),
        Case("128 KB of shared memory", kernels.big_shared_kernel, _big_shared, hopper=True),
        Case("num_ctas=2 (clusters)", kernels.add_kernel, _clusters, hopper=True),
        Case(
            "device-side tensor descriptors (global scratch)",
            kernels.device_descriptor_kernel,
            _device_descriptor,
            hopper=True,
        ),
        Case(
            "host tensor descriptors, zero and nan padding",
            kernels.descriptor_copy_kernel,
            _host_descriptors,
        ),
        Case(
            "persistent matmul over host tensor descriptors (TMA)",
            kernels.matmul_descriptor_persistent_kernel,
            _persistent_matmul_descriptors,
            hopper=True,
        ),
        Case("Gluon kernel with a blocked layout", gluon_scale_kernel, _gluon_scale),
    ]


def wrap(kernel, wrapper: Callable):
    """Apply ``wrapper`` (fastkernel, or identity for Triton) to a case's kernel or kernels."""
    if isinstance(kernel, tuple):
        return tuple(wrapper(k) for k in kernel)
    return wrapper(kernel)


CASES: dict[str, Case] = {c.name: c for c in cases()}
