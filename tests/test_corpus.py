"""The differential corpus (tests/corpus.py): on a GPU, every case's outputs through fastkernel
equal Triton's own launch on the same inputs, bit for bit; on CPU, every case runs through
Triton's own launcher against the recording stand-in (tests/triton_reference.py) and then, call
for call on the same tensors, through fastkernel's native path, and the two launches must be the
same bytes."""

from __future__ import annotations

import corpus
import pytest
import torch
from conftest import STAND_IN, TEST_STREAM
from triton_reference import TritonReference, assert_same_launch

from fastkernel import fastkernel

NAMES = list(corpus.CASES)


def _stats(kernel):
    kernels = kernel if isinstance(kernel, tuple) else (kernel,)
    return [k.stats() for k in kernels]


class _Recorder:
    """Stands in for a kernel: launches each ``kernel[grid](...)`` call through Triton's own
    launcher (``reference``) and keeps it."""

    def __init__(self, kernel, reference, calls: list):
        self.kernel, self.reference, self.calls = kernel, reference, calls

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((self.kernel, grid, args, kwargs))
            self.reference.launch(self.kernel, grid, *args, **kwargs)

        return call


@pytest.mark.parametrize("name", NAMES)
def test_every_corpus_case_launches_the_bytes_triton_launches(
    name, stand_in, triton_allocator_for_scratch
):
    case = corpus.CASES[name]
    calls: list = []
    with TritonReference(stand_in, TEST_STREAM) as reference:
        case.run(corpus.wrap(case.kernel, lambda k: _Recorder(k, reference, calls)), "cpu")
    theirs = stand_in.launches()
    assert len(theirs) == len(calls) >= 1
    stand_in.reset()
    plain = case.kernel if isinstance(case.kernel, tuple) else (case.kernel,)
    fk = {id(k): fastkernel(k) for k in plain}
    for kernel, grid, args, kwargs in calls:  # the same tensors, so the same addresses
        fk[id(kernel)][grid](*args, **kwargs)
    ours = stand_in.launches()
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        assert_same_launch(mine, reference)
    for k in fk.values():
        stats = k.stats()
        assert stats["fallbacks"] == 0 and stats["misses"] >= 1, (name, stats)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_fastkernel_equals_triton_bit_for_bit(name, triton_allocator_for_scratch):
    case = corpus.CASES[name]
    if case.hopper and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs compute capability 9.0")
    expected = case.run(corpus.wrap(case.kernel, lambda k: k), "cuda")
    fk = corpus.wrap(case.kernel, fastkernel)
    got = case.run(fk, "cuda")
    again = case.run(fk, "cuda")  # the native hits
    torch.cuda.synchronize()
    for e, g, a in zip(expected, got, again):
        assert torch.equal(e, g) and torch.equal(e, a), name
    for stats in _stats(fk):
        assert stats["fallbacks"] == 0 and stats["hits"] >= 1, (name, stats)


@pytest.fixture
def triton_allocator_for_scratch():
    """Triton's allocator set to torch (the device-descriptor case needs global scratch). On
    CPU it hands out one arena, so Triton's launch and fastkernel's get the same scratch
    address and their bytes compare."""
    import triton
    from triton.runtime import _allocation

    token = _allocation._allocator.set(_allocation._allocator.get())
    if STAND_IN:
        arena = torch.empty(1 << 20, dtype=torch.int8)

        def allocate(size, alignment, stream):
            assert size + alignment <= arena.numel(), "the test arena is too small"
            return arena

        triton.set_allocator(allocate)
    else:
        triton.set_allocator(
            lambda size, alignment, stream: torch.empty(
                size + alignment, dtype=torch.int8, device="cuda"
            )
        )
    yield
    _allocation._allocator.reset(token)
