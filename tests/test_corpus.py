"""The differential corpus (tests/corpus.py): on a GPU, every case's outputs through fastkernel
equal Triton's own launch on the same inputs, bit for bit; on CPU, every case compiles for sm_90
and launches through the native path against the recording stand-in (no fallback)."""

from __future__ import annotations

import pytest
import torch

from fastkernel import fastkernel

import corpus
from conftest import STAND_IN

NAMES = list(corpus.CASES)


def _stats(kernel):
    kernels = kernel if isinstance(kernel, tuple) else (kernel,)
    return [k.stats() for k in kernels]


@pytest.mark.parametrize("name", NAMES)
def test_every_corpus_case_takes_the_native_path(name, stand_in, triton_allocator_for_scratch):
    case = corpus.CASES[name]
    fk = corpus.wrap(case.kernel, fastkernel)
    case.run(fk, "cpu")
    for stats in _stats(fk):
        assert stats["fallbacks"] == 0 and stats["misses"] >= 1, (name, stats)
    assert len(stand_in.launches()) >= 1


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
    """Triton's allocator set to torch (the device-descriptor case needs global scratch)."""
    import triton
    from triton.runtime import _allocation
    token = _allocation._allocator.set(_allocation._allocator.get())
    device = "cpu" if STAND_IN else "cuda"
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size + alignment,
                                                                     dtype=torch.int8,
                                                                     device=device))
    yield
    _allocation._allocator.reset(token)
