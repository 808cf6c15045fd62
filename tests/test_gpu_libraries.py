"""Real Triton kernel libraries under fastkernel.patch() on a GPU: each op of
tests/test_libraries.py, called through the library's own host function, computes exactly what
it computes with Triton's own launcher, and its repeat call is all native hits. Marked ``gpu``;
the libraries are test dependencies, which a GPU machine without a registry may lack (the
module then skips)."""

from __future__ import annotations

import warnings

import pytest
import test_libraries as libraries
import torch
from test_libraries import (  # noqa: F401 - fixtures used below
    _flag_gems_import,
    _sglang_import,
    flag_gems,
    sglang,
)

import fastkernel

pytestmark = pytest.mark.gpu


def _cases():
    # flash-linear-attention last: its autotuned kernels compile and time every config first,
    # the slowest part under a time limit (scripts/gpu_session.sh all).
    cases = [("liger", name) for name in libraries.LIGER_CASES]
    cases += [("conch", name) for name in libraries.CONCH_CASES]
    cases += [("flag_gems", name) for name in libraries.FLAGGEMS_CASES]
    cases += [("sglang", name) for name in libraries.SGLANG_CASES]
    cases += [("fla", name) for name in libraries.FLA_CASES]
    return cases


def _factory(library: str, name: str, request):
    if library == "liger":
        return libraries.LIGER_CASES[name]
    if library == "flag_gems":
        return libraries._flag_gems_cases(request.getfixturevalue("flag_gems"))[name]
    if library == "sglang":
        request.getfixturevalue("sglang")
        return libraries._sglang_cases()[name]
    if library == "fla":
        pytest.importorskip("fla", reason="fla-core is a test dependency")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", ImportWarning)
            return libraries._fla_cases()[name]
    pytest.importorskip("conch", reason="conch-triton-kernels is a test dependency")
    return libraries._conch_cases()[name]


def _tensors(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _tensors(r)]
    return []


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(libraries, "DEVICE", "cuda")


@pytest.mark.parametrize("library,name", _cases())
def test_a_patched_library_op_computes_what_triton_computes(library, name, on_cuda, request):
    factory = _factory(library, name, request)

    def run():
        torch.manual_seed(0)  # the same inputs every time (some ops write into theirs)
        out = [t.clone() for t in _tensors(factory()())]
        torch.cuda.synchronize()
        return out

    try:
        theirs, again = run(), run()  # Triton's own launcher (tuning autotuned kernels first)
    except RuntimeError as error:
        # fla refuses some ops on Triton versions it knows to miscompile them for this GPU
        # (fla/ops/common/chunk_o.py: gated chunk_bwd_dqkwg on Hopper with Triton 3.4-3.7.0).
        if library == "fla" and "upgrade Triton" in str(error):
            pytest.skip(f"{name}: flash-linear-attention refuses it here: {error}")
        raise
    assert not any(t.is_floating_point() and t.isnan().any() for t in theirs), (
        f"{name}: Triton's own result has NaN, so comparing with it proves nothing"
    )
    deterministic = all(torch.equal(a, b) for a, b in zip(theirs, again))
    with fastkernel.patched():
        first = run()
        before = fastkernel.stats()
        second = run()
        after = fastkernel.stats()
    assert theirs and len(first) == len(second) == len(theirs)
    for mine in (first, second):
        for a, b in zip(mine, theirs):
            if deterministic:
                assert torch.equal(a, b), name
            else:  # the op itself is not bit-reproducible (atomics): close, as its own reruns
                torch.testing.assert_close(a, b)
    hits = sum(s["hits"] - before.get(k, {}).get("hits", 0) for k, s in after.items())
    misses = sum(s["misses"] - before.get(k, {}).get("misses", 0) for k, s in after.items())
    fallbacks = {
        k: s["fallback_reasons"]
        for k, s in after.items()
        if s["fallbacks"] != before.get(k, {}).get("fallbacks", 0)
    }
    assert hits >= 1 and misses == 0 and not fallbacks, (hits, misses, fallbacks)
