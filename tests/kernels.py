"""Triton kernels shared by the tests (jit functions must live in a source file)."""

import triton
import triton.language as tl

from fastkernel import _examples


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scalars_kernel(
    out_ptr,
    i32v,
    i64v,
    u64v,
    f32v,
    h: tl.float16,
    b: tl.bfloat16,
    d: tl.float64,
    flag,
    maybe_ptr,
    one,
    BLOCK: tl.constexpr,
):
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


# The demo's softmax and matmul (fastkernel._examples) are the GPU corpus's too; the tests take
# the plain triton.jit functions so Triton's own launch can run beside fastkernel's.
# (Under FASTKERNEL_DISABLE=1 the examples are already plain triton.jit functions.)
softmax_kernel = getattr(_examples.softmax_kernel, "jit_function", _examples.softmax_kernel)
matmul_kernel = getattr(_examples.matmul_kernel, "jit_function", _examples.matmul_kernel)


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
    desc_in = tl.make_tensor_descriptor(
        in_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    desc_out = tl.make_tensor_descriptor(
        out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    pid = tl.program_id(0)
    tile = desc_in.load([pid * BLOCK_M, 0])
    desc_out.store([pid * BLOCK_M, 0], tile)


@triton.jit
def big_shared_kernel(in_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    # A transpose through shared memory large enough (fp32 128x128 tiles) to need > 48 KB.
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    tile = tl.load(in_ptr + r[:, None] * COLS + c[None, :])
    tl.store(out_ptr + c[:, None] * ROWS + r[None, :], tl.trans(tile))


# -- autotune (tests/test_autotune.py) ---------------------------------------------------------
# The launch_metadata callbacks play each kernel on CPU tensors when a launch hook asks for the
# metadata, so the CPU tests can check what every launch (benchmark repetitions included) saw.


def _play_accumulate(grid, metadata, args):
    if args["out_ptr"].device.type == "cpu":
        args["out_ptr"] += args["x_ptr"]
    return {}


def _play_scale_in_place(grid, metadata, args):
    if args["x_ptr"].device.type == "cpu":
        args["x_ptr"].mul_(2).add_(1)
    return {}


@triton.jit(launch_metadata=_play_accumulate)
def accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # out += x (atomics: a split-K style accumulator that needs a zeroed output)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit(launch_metadata=_play_scale_in_place)
def scale_in_place_kernel(x_ptr, n, BLOCK: tl.constexpr):
    # x = 2 * x + 1, in place
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2 + 1, mask=mask)


@triton.jit
def copy2d_kernel(
    x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rn[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], x, mask=mask)


@triton.jit
def needs_pow2_kernel(out_ptr, BLOCK: tl.constexpr):
    # tl.arange needs a power-of-two range: BLOCK=48 fails to compile.
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.float32))


@triton.jit
def fused_add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # res += x (in place); out = res / rms(res) * w, one row per program.
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    r = tl.load(res_ptr + row * n_cols + offs, mask=mask, other=0.0) + tl.load(
        x_ptr + row * n_cols + offs, mask=mask, other=0.0
    )
    tl.store(res_ptr + row * n_cols + offs, r, mask=mask)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + offs, r * inv * w, mask=mask)


@triton.jit
def tuple_kernel(out_ptr, pair, n, nested, BLOCK: tl.constexpr):
    # pair = (x_ptr, k); nested = (b, (s, y_ptr)): out = x * k + b * s + y
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(pair[0] + offs, mask=mask)
    y = tl.load(nested[1][1] + offs, mask=mask)
    tl.store(out_ptr + offs, x * pair[1] + nested[0] * nested[1][0] + y, mask=mask)


@triton.jit
def two_pairs_kernel(out_ptr, s, a, b, BLOCK: tl.constexpr):
    # s an int, a = (a0, a1), b = (b0, b1): out = s * (a0 + a1 * b0 + b1)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.float32) + s * (a[0] + a[1] * b[0] + b[1]))


@triton.jit
def stream_named_kernel(x_ptr, stream, BLOCK: tl.constexpr):
    # A parameter named `stream`, the keyword of Triton's runner.
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.zeros((BLOCK,), tl.float32) + stream)


# -- host tensor descriptors (triton.tools.tensor_descriptor.TensorDescriptor) -----------------


@triton.jit
def descriptor_copy_kernel(in_desc, out_desc, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A tile copy through two host descriptors (TMA on sm_90+, pointers below), scaled.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    tile = in_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N])
    out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], tile * scale)


@triton.jit
def descriptor_tuple_kernel(pair, out_ptr, BLOCK: tl.constexpr):
    # A tuple holding a descriptor and an int: the descriptor's parameters sit among the tuple's.
    desc, row = pair
    tile = desc.load([row, 0])
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs[:, None] * BLOCK + offs[None, :], tile)


@triton.jit
def matmul_descriptor_persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    # A persistent matmul C = A @ B.T over host descriptors (B is N x K): each program walks
    # the output tiles start, start + NUM_PROGRAMS, ...
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS):
        pid_m = tile // num_n
        pid_n = tile % num_n
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.float16))


@triton.jit
def flag_kernel(out_ptr, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    # A constexpr that is a fill value: Triton compiles numpy scalars and enum members here.
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full([BLOCK], FLAG, tl.float32))


@triton.jit
def scaled_kernel(x_ptr, out_ptr, n, scale=2.0, BLOCK: tl.constexpr = 128):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


@triton.jit
def optional_add_kernel(x_ptr, y_ptr, out_ptr, n, HAS_Y: tl.constexpr, BLOCK: tl.constexpr):
    # y_ptr may be None (then a constexpr): libraries pick the branch with a heuristic.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if HAS_Y:
        x = x + tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def flag_add_kernel(x_ptr, out_ptr, n, flag, BLOCK: tl.constexpr):
    # A runtime bool (a u1 parameter, not specialized): its value is not in Triton's binary key.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if flag:
        x = x + 1.0
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def grouped_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr = 128, GROUP: tl.constexpr = 1):
    # Two constexprs with defaults: what an autotuner's pruned configs or a heuristic may set.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * GROUP, mask=mask)
