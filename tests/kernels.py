"""Triton kernels shared by the tests (jit functions must live in a source file)."""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scalars_kernel(out_ptr, i32v, i64v, u64v, f32v, h: tl.float16, b: tl.bfloat16, d: tl.float64,
                   flag, maybe_ptr, one, BLOCK: tl.constexpr):
    # Every scalar kind Triton packs differently, a None (dropped) and an int that may be 1.
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32) + f32v
    acc = acc + i32v + i64v + u64v + one
    acc = acc + h.to(tl.float32) + b.to(tl.float32) + d.to(tl.float32)
    if flag:
        acc = acc + 1.0
    if maybe_ptr is not None:
        acc = acc + tl.load(maybe_ptr + offs)
    tl.store(out_ptr + offs, acc)


@triton.jit
def typed_kernel(out_ptr, n: tl.int32, big: tl.int64, small: tl.uint8, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, (n + big + small).to(tl.float32) + tl.zeros([BLOCK], tl.float32))


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["x_ptr"])
def no_spec_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def constexpr_kernel(out_ptr, SCALE: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.zeros([BLOCK], tl.float32) + SCALE
    if MODE == "double":
        v = v * 2
    tl.store(out_ptr + offs, v)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_row_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_row_stride + offs, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def times_two(x):
    return x * 2


@triton.jit
def times_three(x):
    return x * 3


@triton.jit
def cast_kernel(out_ptr, in_ptr, n, OUT_DTYPE: tl.constexpr, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(in_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, FN(x).to(OUT_DTYPE), mask=mask)


@triton.jit
def device_descriptor_kernel(in_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A device-side tensor descriptor: on Hopper Triton needs a per-CTA global scratch buffer
    # for the TMA descriptor, so the launcher must allocate one.
    desc_in = tl.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1],
                                        block_shape=[BLOCK_M, BLOCK_N])
    desc_out = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1],
                                         block_shape=[BLOCK_M, BLOCK_N])
    pid = tl.program_id(0)
    tile = desc_in.load([pid * BLOCK_M, 0])
    desc_out.store([pid * BLOCK_M, 0], tile)
