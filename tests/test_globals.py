"""A global a kernel read must not change under a compiled binary: like Triton, the call
raises instead of launching the stale binary (jit.py JITFunction.run)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fastkernel import fastkernel

SCALE = tl.constexpr(2.0)


@triton.jit
def scaled_copy(in_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(in_ptr + offs) * SCALE)


def test_a_changed_global_raises_tritons_error_and_launches_nothing(stand_in):
    global SCALE
    k = fastkernel(scaled_copy)
    x, out = torch.randn(16), torch.empty(16)
    k[(1,)](x, out, BLOCK=16)
    k[(1,)](x, out, BLOCK=16)
    assert k.stats()["hits"] == 1
    old = SCALE
    SCALE = tl.constexpr(3.0)
    try:
        with pytest.raises(
            RuntimeError, match="Global variable SCALE has changed since we compiled this kernel"
        ):
            k[(1,)](x, out, BLOCK=16)
        assert len(stand_in.launches()) == 2
    finally:
        SCALE = old
    k[(1,)](x, out, BLOCK=16)  # restored: the binary is valid again
    assert len(stand_in.launches()) == 3


def test_an_equal_new_object_is_not_a_change(stand_in):
    global SCALE
    k = fastkernel(scaled_copy)
    x, out = torch.randn(16), torch.empty(16)
    k[(1,)](x, out, BLOCK=16)
    old = SCALE
    SCALE = tl.constexpr(2.0)  # a new object, equal value: Triton compares with ==
    try:
        k[(1,)](x, out, BLOCK=16)
    finally:
        SCALE = old
    assert len(stand_in.launches()) == 2


class _LaunchingConstant(tl.constexpr):
    """A constexpr global whose equality check (run on every hit: Triton stores a copy of each
    global, so the check compares two objects) launches the kernel with a new specialization."""

    on_compare = None

    def __eq__(self, other):
        hook, _LaunchingConstant.on_compare = _LaunchingConstant.on_compare, None
        if hook is not None:
            hook()
        return self.value == (other.value if isinstance(other, tl.constexpr) else other)

    def __hash__(self):
        return hash(self.value)


OFFSET = _LaunchingConstant(1.0)
BIAS = _LaunchingConstant(0.5)
SHIFT = _LaunchingConstant(0.25)


@triton.jit
def offset_copy(in_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(in_ptr + offs) + OFFSET + BIAS + SHIFT)


def test_a_global_check_that_registers_another_specialization_finishes_its_checks(stand_in):
    # The nested miss replaces the kernel's global checks while the outer hit still iterates
    # over the old ones (which it must keep alive).
    k = fastkernel(offset_copy)
    x, out = torch.randn(64), torch.empty(64)
    k[(1,)](x, out, BLOCK=16)
    for block in (32, 64, 8):
        _LaunchingConstant.on_compare = lambda block=block: k[(1,)](x, out, BLOCK=block)
        k[(1,)](x, out, BLOCK=16)
        assert _LaunchingConstant.on_compare is None  # the nested launch ran
    stats = k.stats()
    assert (stats["misses"], stats["hits"], stats["specializations"]) == (4, 3, 4)
    assert len(stand_in.launches()) == 7
