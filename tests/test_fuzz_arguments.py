"""Property-based: random argument lists never crash the process.

Every call either launches (and then the driver receives the tensors' pointers and the
parameter count the cubin declares) or raises a clear, typed exception. Run with -s to see how
many cases ran."""

from __future__ import annotations

import struct

import kernels
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastkernel import CudaError, fastkernel

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
_BASE = {d: torch.zeros(80, dtype=d) for d in DTYPES}


class WithDataPtr:
    """A non-tensor object with a data_ptr method (Triton accepts such objects as pointers)."""

    def __init__(self, value):
        self.value = value

    def data_ptr(self):
        return self.value


def _tensor(dtype, kind):
    base = _BASE[dtype]
    return {
        "contiguous": lambda: base[:64],
        "unaligned": lambda: base[1:65],
        "empty": lambda: base[:0],
        "scalar": lambda: base[0],
        "strided": lambda: base.view(8, 10).t(),
        "sparse": lambda: (
            base[:64].to_sparse() if dtype != torch.complex64 else base[:4].to_sparse()
        ),
    }[kind]()


tensors = st.builds(
    _tensor,
    st.sampled_from(DTYPES),
    st.sampled_from(["contiguous", "unaligned", "empty", "scalar", "strided", "sparse"]),
)
scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 16, 2**31, 2**63, 2**64 - 1, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.complex_numbers(max_magnitude=10),
    st.builds(WithDataPtr, st.integers(min_value=-(2**65), max_value=2**65)),
    st.lists(st.integers(0, 3), max_size=3),
    st.tuples(st.integers(0, 3)),
    st.just(object()),
)
values = st.one_of(tensors, tensors, scalars)
keywords = st.dictionaries(
    st.sampled_from(
        [
            "x_ptr",
            "y_ptr",
            "out_ptr",
            "n",
            "BLOCK",
            "num_warps",
            "num_stages",
            "bogus",
            "debug",
            "stream",
        ]
    ),
    st.one_of(values, st.sampled_from([64, 32, 4])),
    max_size=4,
)

# What "a clear exception" may be: typed errors naming the problem, Triton's own compile and
# runtime errors for arguments it rejects, never a crash.
EXPECTED = (
    TypeError,
    ValueError,
    OverflowError,
    KeyError,
    RuntimeError,
    CudaError,
    AssertionError,
    IndexError,
    NotImplementedError,
    AttributeError,
)

RAN = {"cases": 0, "launched": 0, "raised": 0}

# Calls of the right shape with mutated values, so that launches (not only binding errors) are
# exercised: pointer slots mostly tensors of a few dtypes and layouts, n mostly an int.
near_tensors = st.builds(
    _tensor,
    st.sampled_from([torch.float32, torch.float16, torch.int32]),
    st.sampled_from(["contiguous", "unaligned", "empty", "strided", "sparse"]),
)
# Mostly (9 in 10) the right kind; hypothesis would otherwise favour the many scalar kinds.
pointer_slot = st.integers(0, 9).flatmap(lambda i: near_tensors if i else scalars)
n_slot = st.integers(0, 9).flatmap(
    lambda i: (
        st.sampled_from([64, 1, 16, 17, 0, 2**40, 2**63])
        if i > 3
        else st.integers(min_value=-(2**65), max_value=2**65)
        if i
        else scalars
    )
)
near_valid = st.tuples(pointer_slot, pointer_slot, pointer_slot, n_slot)


@pytest.fixture(scope="module")
def add_kernel():
    return fastkernel(kernels.add_kernel)


def _call(kernel, stand_in, grid, args, kwargs):
    """Make one call; check it either launched correctly or raised a clear, typed error."""
    RAN["cases"] += 1
    before = stand_in.launch_count()
    try:
        kernel[grid](*args, **kwargs)
    except Exception as exc:
        # Typed errors naming the problem, or Triton's own errors for calls it rejects itself
        # (its compile errors; on this machine, its launcher finding no GPU driver).
        assert isinstance(exc, EXPECTED) or type(exc).__module__.startswith("triton"), repr(exc)
        assert str(exc), f"{type(exc).__name__} without a message"
        assert stand_in.launch_count() == before
        RAN["raised"] += 1
        return
    RAN["launched"] += 1
    if not (isinstance(grid, tuple) and grid and all(isinstance(g, int) and g > 0 for g in grid)):
        assert stand_in.launch_count() == before  # an empty grid launches nothing
        return
    assert stand_in.launch_count() == before + 1
    launch = stand_in.launches()[-1]
    names = ["x_ptr", "y_ptr", "out_ptr", "n"]
    bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    for name, param in zip(names[:3], launch.params):
        value = bound[name]
        if isinstance(value, torch.Tensor):
            assert param == struct.pack("<Q", value.data_ptr()), name


SETTINGS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
GRIDS = st.one_of(
    st.tuples(st.integers(-2, 4)),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.just(()),
    st.just((1, 1, 1, 1)),
    st.just("x"),
)


@SETTINGS
@given(args=st.lists(values, max_size=6), kwargs=keywords, grid=GRIDS)
def test_random_calls_launch_correctly_or_raise_clearly(add_kernel, stand_in, args, kwargs, grid):
    _call(add_kernel, stand_in, grid, args, kwargs)


@SETTINGS
@given(args=near_valid, grid=st.one_of(st.just((1,)), st.just((2, 1)), GRIDS))
def test_near_valid_calls_launch_correctly_or_raise_clearly(add_kernel, stand_in, args, grid):
    _call(add_kernel, stand_in, grid, list(args), {"BLOCK": 64})


@pytest.mark.stand_in
def test_report_fuzz_cases(add_kernel, stand_in, capsys):
    """The property tests above made calls and launched (they are not vacuous), printed for the
    record; they assert the behaviour. Run here first when this session has not run them
    (this test alone, or another order)."""
    if RAN["cases"] == 0:
        test_random_calls_launch_correctly_or_raise_clearly(add_kernel, stand_in)
        test_near_valid_calls_launch_correctly_or_raise_clearly(add_kernel, stand_in)
    with capsys.disabled():
        print(f"\nfuzz: {RAN['cases']} cases, {RAN['launched']} launched, {RAN['raised']} raised")
    assert RAN["cases"] > 0 and RAN["launched"] > 0
