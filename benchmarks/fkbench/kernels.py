"""The dispatch benchmark's kernels and call shapes (``benchmarks/dispatch.py``).

Each shape is a tiny kernel whose launch cost, not its run time, dominates a call:

- ``nop-0``: no arguments at all;
- ``add-2``, ``add-8``, ``add-16``: an add-style kernel over N=4096 fp32 with 2, 8 and 16 tensor
  arguments (``x0 += x1 + ... + x{k-1}``), plus ``n`` and the ``BLOCK`` constexpr;
- ``overhead-19``: the shape of Triton's launch-overhead microbenchmark
  (python/test/microbenchmark: 5 tensors, 9 ints, 5 constexprs).

The add variants are written out one by one: Triton specializes on the declared signature, so
each tensor count needs its own kernel, and generating source at run time would hide what runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

#: Elements per tensor in the add shapes (fp32).
N = 4096
#: Elements per program in the add shapes.
BLOCK = 1024


@triton.jit
def nop_kernel():
    pass


@triton.jit
def add2_kernel(x0, x1, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x1 + offs, mask=mask)
    tl.store(x0 + offs, tl.load(x0 + offs, mask=mask) + acc, mask=mask)


@triton.jit
def add8_kernel(x0, x1, x2, x3, x4, x5, x6, x7, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x1 + offs, mask=mask)
    acc += tl.load(x2 + offs, mask=mask)
    acc += tl.load(x3 + offs, mask=mask)
    acc += tl.load(x4 + offs, mask=mask)
    acc += tl.load(x5 + offs, mask=mask)
    acc += tl.load(x6 + offs, mask=mask)
    acc += tl.load(x7 + offs, mask=mask)
    tl.store(x0 + offs, tl.load(x0 + offs, mask=mask) + acc, mask=mask)


@triton.jit
def add16_kernel(
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, n, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x1 + offs, mask=mask)
    acc += tl.load(x2 + offs, mask=mask)
    acc += tl.load(x3 + offs, mask=mask)
    acc += tl.load(x4 + offs, mask=mask)
    acc += tl.load(x5 + offs, mask=mask)
    acc += tl.load(x6 + offs, mask=mask)
    acc += tl.load(x7 + offs, mask=mask)
    acc += tl.load(x8 + offs, mask=mask)
    acc += tl.load(x9 + offs, mask=mask)
    acc += tl.load(x10 + offs, mask=mask)
    acc += tl.load(x11 + offs, mask=mask)
    acc += tl.load(x12 + offs, mask=mask)
    acc += tl.load(x13 + offs, mask=mask)
    acc += tl.load(x14 + offs, mask=mask)
    acc += tl.load(x15 + offs, mask=mask)
    tl.store(x0 + offs, tl.load(x0 + offs, mask=mask) + acc, mask=mask)


@triton.jit
def overhead19_kernel(
    a0,
    a1,
    a2,
    a3,
    a4,
    i0,
    i1,
    i2,
    i3,
    i4,
    i5,
    i6,
    i7,
    i8,
    c0: tl.constexpr,
    c1: tl.constexpr,
    c2: tl.constexpr,
    c3: tl.constexpr,
    c4: tl.constexpr,
):
    # One store that reads every int and constexpr, so none of them is dead.
    total = i0 + i1 + i2 + i3 + i4 + i5 + i6 + i7 + i8 + c0 + c1 + c2 + c3 + c4
    tl.store(a0 + tl.program_id(0), total.to(tl.float32))


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark call shape: a kernel, how many tensors it takes, and its call arguments.

    Attributes
    ----------
    name : str
        Short label used in tables, JSON and plots (``"add-8"``).
    kernel : triton.runtime.jit.JITFunction
        The Triton kernel.
    num_tensors : int
        Tensor arguments per call.
    num_args : int
        All arguments per call (tensors, ints and constexprs), the plot's x axis.
    grid : tuple of int
        The launch grid, in programs.
    make_args : callable
        ``make_args(device) -> tuple``: fresh call arguments with tensors on ``device``
        (a torch device string; ``"cpu"`` for the host-side benchmark).
    """

    name: str
    kernel: Any
    num_tensors: int
    num_args: int
    grid: tuple[int, ...]
    make_args: Callable[[str], tuple]


def _zeros(count: int, device: str) -> list[Any]:
    import torch

    return [torch.zeros(N, dtype=torch.float32, device=device) for _ in range(count)]


def _nop_args(device: str) -> tuple:
    return ()


def _add_args(count: int) -> Callable[[str], tuple]:
    def make(device: str) -> tuple:
        return (*_zeros(count, device), N, BLOCK)

    return make


def _overhead_args(device: str) -> tuple:
    # Ints of 2..10: none equals 1, so Triton keeps all nine as kernel parameters (an int equal
    # to 1 would become a constexpr and leave the launch).
    ints = tuple(range(2, 11))
    constexprs = (32, 32, 32, 32, 32)
    return (*_zeros(5, device), *ints, *constexprs)


#: The shapes, in plot order (arguments per call ascending).
SHAPES: list[Shape] = [
    Shape("nop-0", nop_kernel, 0, 0, (1,), _nop_args),
    Shape("add-2", add2_kernel, 2, 4, (triton.cdiv(N, BLOCK),), _add_args(2)),
    Shape("add-8", add8_kernel, 8, 10, (triton.cdiv(N, BLOCK),), _add_args(8)),
    Shape("add-16", add16_kernel, 16, 18, (triton.cdiv(N, BLOCK),), _add_args(16)),
    Shape("overhead-19", overhead19_kernel, 5, 19, (1,), _overhead_args),
]


def callable_grid(shape: Shape) -> Callable[..., tuple[int, ...]]:
    """A grid function returning the shape's tuple grid (held as a default argument): one that
    fastkernel evaluates natively as a grid program (``fastkernel._grid_program``)."""

    def grid(meta, _grid=shape.grid):
        return _grid

    return grid


def called_grid(shape: Shape) -> Callable[..., tuple[int, ...]]:
    """The same grid from a function outside the grid programs' fast case (it calls
    ``tuple``), which fastkernel calls in Python as Triton does: the cost of calling a grid
    function."""

    def grid(meta, _grid=shape.grid):
        return tuple(_grid)

    return grid


def tutorial_grid(shape: Shape) -> Callable[[dict], tuple[int, ...]] | None:
    """The grid function Triton's tutorials (and flash-linear-attention, FlagGems) write, for a
    shape whose kernel takes ``n`` and ``BLOCK``: ``(triton.cdiv(meta["n"], meta["BLOCK"]),)``,
    the same grid as the shape's tuple. None for other shapes."""
    if not {"n", "BLOCK"} <= set(shape.kernel.arg_names):
        return None
    return lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)


def autotuned_call(
    shape: Shape, device: str, do_bench: Callable | None = None
) -> tuple[Any, tuple] | None:
    """The shape's kernel under ``fastkernel.autotune`` (two BLOCK configs, key ``["n"]``) and
    its call arguments without BLOCK, tuned by one first call; None for shapes without a BLOCK
    constexpr. ``do_bench`` replaces Triton's timer (the host benchmark has no GPU to time on)."""
    import triton as _triton

    from fastkernel._autotune import autotune
    from fastkernel.kernel import FastKernel

    if shape.num_tensors == 0 or shape.kernel.arg_names[-1] != "BLOCK":
        return None
    configs = [_triton.Config({"BLOCK": BLOCK}), _triton.Config({"BLOCK": 2 * BLOCK})]
    kernel = autotune(configs, key=["n"], do_bench=do_bench, cache_results=False)(
        FastKernel(shape.kernel)
    )
    args = shape.make_args(device)[:-1]
    kernel[shape.grid](*args)
    return kernel, args
