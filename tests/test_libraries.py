"""Real Triton kernel libraries under fastkernel.patch(), called through their own host functions
(the autograd functions and wrappers users call, not the kernels), on the recording stand-in.

For each call: Triton's own launcher runs it first (TritonReference), then the patched process
runs it twice. Every patched launch must be the launch Triton made, byte for byte, except for
the addresses of the tensors the host function allocates itself (they differ from call to call
with or without fastkernel): those may differ only as one consistent renaming across the call's
launches. The second patched call must be all native hits, and nothing may fall back.

The libraries are test dependencies (scripts/dev.sh installs them); a machine without them
(the GPU machine has no package registry) skips this module.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import pytest
import torch
from conftest import TEST_STREAM
from stand_in_driver.recording import Launch
from triton_reference import TritonReference

import fastkernel
from fastkernel.kernel import PATCH_ATTR

liger_ops = pytest.importorskip("liger_kernel.ops", reason="liger-kernel is a test dependency")


def assert_same_launches(ours: list[Launch], theirs: list[Launch]) -> None:
    """The launches are Triton's, parameter for parameter, up to one consistent renaming of the
    8-byte parameters that differ (device addresses of tensors allocated inside the call)."""
    assert len(ours) == len(theirs), f"fastkernel made {len(ours)} launches, Triton {len(theirs)}"
    renamed: dict[bytes, bytes] = {}
    for k, (mine, triton_launch) in enumerate(zip(ours, theirs)):
        where = f"launch {k} ({triton_launch.name})"
        assert mine.name == triton_launch.name, where
        assert (mine.grid, mine.block) == (triton_launch.grid, triton_launch.block), where
        assert mine.shared_mem == triton_launch.shared_mem, where
        assert (mine.stream, mine.device) == (triton_launch.stream, triton_launch.device), where
        assert sorted(mine.attrs) == sorted(triton_launch.attrs), where
        assert mine.param_layout == triton_launch.param_layout, where
        for i, (a, b) in enumerate(zip(mine.params, triton_launch.params)):
            if a == b:
                continue
            assert len(a) == 8, (
                f"{where}, parameter {i}: fastkernel sent {a.hex()}, Triton {b.hex()}"
            )
            assert renamed.setdefault(b, a) == a, f"{where}, parameter {i}: inconsistent address"
    assert len(set(renamed.values())) == len(renamed), "two of Triton's addresses became one"


def _benchmarker(kernel_call, quantiles=None, **_):
    """Triton's benchmarker, as the stand-in can give it: the call runs once and every config
    times the same, so an autotuner picks its first config (deterministically, in both runs)."""
    kernel_call()
    return [1.0] * len(quantiles) if quantiles else 1.0


@contextlib.contextmanager
def _benchmarking_with(driver):
    saved = driver.__dict__.get("get_benchmarker")
    driver.get_benchmarker = lambda: _benchmarker
    try:
        yield
    finally:
        if saved is None:
            del driver.get_benchmarker
        else:
            driver.get_benchmarker = saved


def run_case(stand_in, call: Callable[[], object]) -> tuple[int, int]:
    """Runs ``call`` through Triton (a first time to tune autotuned kernels, then recorded), then
    twice patched; returns (kernels served, launches per call)."""
    with TritonReference(stand_in, TEST_STREAM) as reference, _benchmarking_with(reference.driver):
        call()
        stand_in.reset()
        call()
        theirs = stand_in.launches()
        stand_in.reset()
        at_start = fastkernel.stats()
        with fastkernel.patched():
            call()
            first = stand_in.launches()
            stand_in.reset()
            before = fastkernel.stats()
            call()
            second = stand_in.launches()
            after = fastkernel.stats()
    assert theirs, "the host function launched nothing"
    assert_same_launches(first, theirs)
    assert_same_launches(second, theirs)
    served = {
        name: {k: s[k] - before.get(name, {}).get(k, 0) for k in ("hits", "misses")}
        for name, s in after.items()
    }
    served = {name: d for name, d in served.items() if any(d.values())}
    # The second call: one native hit per launch, no miss; and no fallback anywhere.
    assert sum(d["hits"] for d in served.values()) == len(second), served
    assert sum(d["misses"] for d in served.values()) == 0, served
    fallbacks = {
        name: s["fallback_reasons"]
        for name, s in after.items()
        if s["fallbacks"] != at_start.get(name, {}).get("fallbacks", 0)
    }
    assert not fallbacks, fallbacks
    return len(served), len(theirs)


#: Where the cases make their tensors: "cpu" on the stand-in, "cuda" in tests/test_gpu_libraries.py.
DEVICE = "cpu"


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


# Liger-Kernel: the autograd functions its nn.Modules and model patches call (forward).
LIGER_CASES: dict[str, Callable[[], Callable[[], object]]] = {
    "rms_norm": lambda: (
        lambda X=_x(4, 256), W=_x(256): liger_ops.LigerRMSNormFunction.apply(X, W, 1e-6)
    ),
    "fused_add_rms_norm": lambda: (
        lambda X=_x(4, 256), R=_x(4, 256), W=_x(256): liger_ops.LigerFusedAddRMSNormFunction.apply(
            X, R, W, 1e-6
        )
    ),
    "layer_norm": lambda: (
        lambda X=_x(4, 256), W=_x(256), B=_x(256): liger_ops.LigerLayerNormFunction.apply(
            X, W, B, 1e-6
        )
    ),
    "swiglu": lambda: lambda a=_x(4, 512), b=_x(4, 512): liger_ops.LigerSiLUMulFunction.apply(a, b),
    "geglu": lambda: lambda a=_x(4, 512), b=_x(4, 512): liger_ops.LigerGELUMulFunction.apply(a, b),
    "rope": lambda: (
        lambda q=_x(1, 8, 16, 64), k=_x(1, 2, 16, 64), cos=_x(1, 16, 64), sin=_x(1, 16, 64): (
            liger_ops.LigerRopeFunction.apply(q, k, cos, sin)
        )
    ),
    "softmax": lambda: lambda x=_x(4, 1000): liger_ops.LigerSoftmaxFunction.apply(x),
    "relu_squared": lambda: lambda x=_x(4, 512): liger_ops.LigerReLUSquaredFunction.apply(x),
    "group_norm": lambda: (
        lambda X=_x(2, 8, 64), W=_x(8), B=_x(8): liger_ops.LigerGroupNormFunction.apply(
            X, W, B, 8, 2, 1e-6
        )
    ),
    "kl_div": lambda: (
        lambda p=_x(4, 1000).log_softmax(-1), t=_x(4, 1000).softmax(-1): (
            liger_ops.LigerKLDivLossFunction.apply(p, t, "batchmean", False, 1e-10)
        )
    ),
    "cross_entropy": lambda: (
        lambda x=_x(4, 1000), t=torch.randint(0, 1000, (4,), device=DEVICE): (
            liger_ops.LigerCrossEntropyFunction.apply(x, t, None)
        )
    ),
}


# flash-linear-attention (fla-core): its norms, activations and chunk utilities, most of them
# under triton.autotune.
def _fla_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from fla.modules import activations, l2norm
    from fla.ops.utils import cumsum, softmax

    return {
        "l2norm": lambda: lambda x=_x(4, 256): l2norm.l2norm(x),
        "swiglu": lambda: lambda a=_x(4, 256), b=_x(4, 256): activations.swiglu(a, b),
        "sigmoid": lambda: lambda x=_x(4, 256): activations.sigmoid(x),
        "logsigmoid": lambda: lambda x=_x(4, 256): activations.logsigmoid(x),
        "chunk_local_cumsum": lambda: (
            lambda g=_x(1, 128, 4): cumsum.chunk_local_cumsum(g, chunk_size=64)
        ),
        "chunk_global_cumsum": lambda: lambda g=_x(1, 128, 4): cumsum.chunk_global_cumsum(g),
        "softmax": lambda: lambda x=_x(1, 64, 4, 64): softmax.softmax_fwd(x),
    }


FLA_CASES = [
    "l2norm",
    "swiglu",
    "sigmoid",
    "logsigmoid",
    "chunk_local_cumsum",
    "chunk_global_cumsum",
    "softmax",
]


@pytest.mark.parametrize("case", FLA_CASES)
def test_flash_linear_attention_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    pytest.importorskip("fla", reason="fla-core is a test dependency")
    # fla probes Triton's active driver when imported; finding none (no GPU), it warns and
    # takes its CPU settings, which is what this machine is. It also warns that flash-attn (an
    # optional dependency) is missing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", ImportWarning)
        cases = _fla_cases()
    run_case(stand_in, cases[case]())


# conch-triton-kernels: vLLM-style activation, normalization and rotary-embedding ops.
CONCH_CASES = [
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "rms_norm",
    "fused_add_rms_norm",
    "gemma_rms_norm",
    "rotary_embedding",
]


def _conch_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from conch.ops.activation.gelu_tanh_and_mul import gelu_tanh_and_mul
    from conch.ops.activation.silu_and_mul import silu_and_mul
    from conch.ops.embedding.rotary_embedding import rotary_embedding
    from conch.ops.normalization.gemma_rms_norm import gemma_rms_norm
    from conch.ops.normalization.rms_norm import fused_add_rms_norm, rms_norm

    return {
        "silu_and_mul": lambda: lambda x=_x(8, 128): silu_and_mul(x),
        "gelu_tanh_and_mul": lambda: lambda x=_x(8, 128): gelu_tanh_and_mul(x),
        "rms_norm": lambda: lambda x=_x(8, 128), w=_x(128): rms_norm(x, w, 1e-6),
        "fused_add_rms_norm": lambda: (
            lambda x=_x(8, 128), r=_x(8, 128), w=_x(128): fused_add_rms_norm(x, r, w, 1e-6)
        ),
        "gemma_rms_norm": lambda: lambda x=_x(8, 128), w=_x(128): gemma_rms_norm(x, w, 1e-6),
        "rotary_embedding": lambda: (
            lambda pos=torch.arange(4, device=DEVICE), q=_x(4, 128), k=_x(4, 128), cache=_x(16, 64): (
                rotary_embedding(pos, q, k, 64, cache)
            )
        ),
    }


@pytest.mark.parametrize("case", CONCH_CASES)
def test_conch_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    pytest.importorskip("conch", reason="conch-triton-kernels is a test dependency")
    run_case(stand_in, _conch_cases()[case]())


@pytest.mark.parametrize("case", list(LIGER_CASES))
def test_liger_kernel_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    run_case(stand_in, LIGER_CASES[case]())


def test_a_patched_liger_kernel_keeps_its_kernels_as_jit_functions(stand_in):
    from liger_kernel.ops import rms_norm
    from triton.runtime.jit import JITFunction

    kernel = rms_norm._rms_norm_forward_kernel
    with TritonReference(stand_in, TEST_STREAM), fastkernel.patched():
        LIGER_CASES["rms_norm"]()()
        assert isinstance(kernel, JITFunction) and PATCH_ATTR in kernel.__dict__
    assert PATCH_ATTR not in kernel.__dict__
