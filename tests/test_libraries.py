"""Real Triton kernel libraries under fastkernel.patch(), called through their own host functions
(the autograd functions and wrappers users call, not the kernels), on the recording stand-in.

For each call: Triton's own launcher runs it first (TritonReference), then the patched process
runs it twice. Every patched launch must be the launch Triton made, byte for byte, except for
the addresses of the tensors the host function allocates itself (they differ from call to call
with or without fastkernel, and the host allocator may reuse a freed block in one run and not
in another): each run records, through a TorchDispatchMode, every storage its ops make and how
many launches preceded it, and an 8-byte parameter inside a storage made before its launch is
compared as (which storage of the run, offset). The second patched call must be all native
hits, and nothing may fall back.

The libraries are test dependencies (scripts/dev.sh installs them); a machine without them
(the GPU machine has no package registry) skips this module.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import warnings
import weakref
from collections.abc import Callable

import pytest
import torch
import triton
from conftest import TEST_STREAM
from stand_in_driver.recording import Launch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from triton_reference import TritonReference

import fastkernel
from fastkernel import _triton_abi as abi
from fastkernel.kernel import PATCH_ATTR

liger_ops = pytest.importorskip("liger_kernel.ops", reason="liger-kernel is a test dependency")


class Allocations(TorchDispatchMode):
    """The storages the ops of a call make, in order: (launches the stand-in had recorded when
    the storage was made, first address, end address)."""

    def __init__(self, stand_in):
        super().__init__()
        self.stand_in = stand_in
        self.made: list[tuple[int, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                storage = t.untyped_storage()
                start = storage.data_ptr()
                self.made.append((self.stand_in.launch_count(), start, start + storage.nbytes()))
        return out


def _in_made(address: int, k: int, made: list[tuple[int, int, int]]) -> tuple | None:
    """("made", the index of the storage made before launch ``k`` that holds ``address`` (the
    latest such, as the allocator may have reused the block), offset), or None."""
    for j in range(len(made) - 1, -1, -1):
        launches_before, start, end = made[j]
        if launches_before <= k and start <= address < max(end, start + 1):
            return ("made", j, address - start)
    return None


def canonical_params(launch: Launch, k: int, made: list[tuple[int, int, int]]) -> list[object]:
    """Launch ``k``'s parameters, an 8-byte one that points into a storage made before the launch
    written as (the storage's index among those the run made, offset), and so a tensor map's
    global address (the stand-in's encoding: "FKTM", the address at byte 16); every other
    parameter as its bytes."""
    params: list[object] = []
    for p in launch.params:
        if len(p) == 8:
            p = _in_made(int.from_bytes(p, "little"), k, made) or p
        elif len(p) == 128 and p[:4] == b"FKTM":
            where = _in_made(int.from_bytes(p[16:24], "little"), k, made)
            if where is not None:
                p = (p[:16], where, p[24:])
        params.append(p)
    return params


def assert_same_launches(ours: list[Launch], our_made, theirs: list[Launch], their_made) -> None:
    """The launches are Triton's, binary for binary and parameter for parameter, addresses inside
    the storages each run made compared as (storage, offset) (``canonical_params``)."""
    assert len(ours) == len(theirs), f"fastkernel made {len(ours)} launches, Triton {len(theirs)}"
    assert len(our_made) == len(their_made), "the runs made different numbers of storages"
    for k, (mine, triton_launch) in enumerate(zip(ours, theirs)):
        where = f"launch {k} ({triton_launch.name})"
        assert mine.name == triton_launch.name, where
        assert mine.image == triton_launch.image, f"{where}: fastkernel launched another binary"
        assert (mine.grid, mine.block) == (triton_launch.grid, triton_launch.block), where
        assert mine.shared_mem == triton_launch.shared_mem, where
        assert (mine.stream, mine.device) == (triton_launch.stream, triton_launch.device), where
        assert sorted(mine.attrs) == sorted(triton_launch.attrs), where
        assert mine.param_layout == triton_launch.param_layout, where
        a_params = canonical_params(mine, k, our_made)
        b_params = canonical_params(triton_launch, k, their_made)
        for i, (a, b) in enumerate(zip(a_params, b_params)):
            assert a == b, f"{where}, parameter {i}: fastkernel sent {a!r}, Triton {b!r}"


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


def run_case(stand_in, call: Callable[[], object], hits_per_launch: int = 1) -> tuple[int, int]:
    """Runs ``call`` through Triton (a first time to tune autotuned kernels, then recorded), then
    twice patched; returns (kernels served, launches per call). ``hits_per_launch``: the native
    hits each launch of the second patched call makes (2 where an autotuner's hit calls its
    config's ``pre_hook``, then the dispatch of the kernel under it)."""

    def recorded() -> tuple[list[Launch], list[tuple[int, int, int]]]:
        stand_in.reset()
        with Allocations(stand_in) as allocations:
            call()
        return stand_in.launches(), allocations.made

    with TritonReference(stand_in, TEST_STREAM) as reference, _benchmarking_with(reference.driver):
        call()
        theirs, their_made = recorded()
        stand_in.reset()
        at_start = fastkernel.stats()
        with fastkernel.patched():
            first, first_made = recorded()
            before = fastkernel.stats()
            second, second_made = recorded()
            after = fastkernel.stats()
    assert theirs, "the host function launched nothing"
    assert_same_launches(first, first_made, theirs, their_made)
    assert_same_launches(second, second_made, theirs, their_made)
    served = {
        name: {k: s[k] - before.get(name, {}).get(k, 0) for k in ("hits", "misses")}
        for name, s in after.items()
    }
    served = {name: d for name, d in served.items() if any(d.values())}
    # The second call: one native hit per launch, no miss; and no fallback anywhere.
    assert sum(d["hits"] for d in served.values()) == hits_per_launch * len(second), served
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


def _leaf(*shape):
    """An fp32 input that requires grad, for a training step."""
    return _x(*shape).requires_grad_()


def _ints(high: int, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, dtype=dtype, device=DEVICE)


def _slots() -> torch.Tensor:
    """The KV-cache slots of four tokens, for caches of 8 blocks of 16 (-1: a padding token)."""
    return torch.tensor([3, 17, -1, 100], device=DEVICE)


def _one() -> torch.Tensor:
    """A scale of 1 as a 0-d fp32 tensor, as KV-cache writes take their scales."""
    return torch.ones((), device=DEVICE)


def _mamba_decode_inputs() -> tuple[torch.Tensor, ...]:
    """A Mamba-2 decode step's tensors, as SGLang's and vLLM's ``selective_state_update`` take
    them: the SSM state of 2 sequences, 4 heads of 16 channels and a state of 16, then x, dt, A,
    B, C, D, z, dt_bias and the output."""
    state, x, dt, a = _x(2, 4, 16, 16), _x(2, 4, 16), _x(2, 4, 16), _x(4, 16, 16)
    b, c, d, z, dt_bias, out = (
        _x(2, 1, 16),
        _x(2, 1, 16),
        _x(4, 16),
        _x(2, 4, 16),
        _x(4, 16),
        _x(2, 4, 16),
    )
    return state, x, dt, a, b, c, d, z, dt_bias, out


def _step(forward: Callable[..., object], *inputs: torch.Tensor) -> Callable[[], object]:
    """A training step of an op: ``forward(*inputs)``, then the backward pass of the sum of its
    first output, which runs the op's backward kernels. Returns that output and the gradients
    of the inputs that require grad (each call starts with none, so every call makes the same
    launches)."""

    def call():
        for t in inputs:
            t.grad = None
        out = forward(*inputs)
        first = out[0] if isinstance(out, tuple) else out
        first.float().sum().backward()
        return (first, *[t.grad for t in inputs if t.requires_grad])

    return call


# Liger-Kernel: the autograd functions its nn.Modules and model patches call, forward and (the
# training steps) backward.
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
        lambda x=_x(4, 1000), t=_ints(1000, 4): liger_ops.LigerCrossEntropyFunction.apply(
            x, t, None
        )
    ),
    "sparsemax": lambda: lambda x=_x(4, 128): liger_ops.LigerSparsemaxFunction.apply(x, -1),
    # Training steps: forward, then backward through the op's own backward kernels.
    "rms_norm training": lambda: _step(
        lambda X, W: liger_ops.LigerRMSNormFunction.apply(X, W, 1e-6), _leaf(4, 256), _leaf(256)
    ),
    "fused_add_rms_norm training": lambda: _step(
        lambda X, R, W: liger_ops.LigerFusedAddRMSNormFunction.apply(X, R, W, 1e-6),
        _leaf(4, 256),
        _leaf(4, 256),
        _leaf(256),
    ),
    "layer_norm training": lambda: _step(
        lambda X, W, B: liger_ops.LigerLayerNormFunction.apply(X, W, B, 1e-6),
        _leaf(4, 256),
        _leaf(256),
        _leaf(256),
    ),
    "modulated_rms_norm training": lambda: _step(
        lambda X, W, scale, shift: liger_ops.LigerModulatedRMSNormFunction.apply(
            X, W, scale, shift, 1e-6, 0.0, "llama", False
        ),
        _leaf(4, 256),
        _leaf(256),
        _leaf(4, 256),
        _leaf(4, 256),
    ),
    "group_norm training": lambda: _step(
        lambda X, W, B: liger_ops.LigerGroupNormFunction.apply(X, W, B, 8, 2, 1e-6),
        _leaf(2, 8, 64),
        _leaf(8),
        _leaf(8),
    ),
    "swiglu training": lambda: _step(
        liger_ops.LigerSiLUMulFunction.apply, _leaf(4, 512), _leaf(4, 512)
    ),
    "fused_gate_up_silu_mul training": lambda: _step(
        liger_ops.LigerFusedGateUpSiLUMulFunction.apply, _leaf(4, 512)
    ),
    "geglu training": lambda: _step(
        liger_ops.LigerGELUMulFunction.apply, _leaf(4, 512), _leaf(4, 512)
    ),
    "relu_squared training": lambda: _step(liger_ops.LigerReLUSquaredFunction.apply, _leaf(4, 512)),
    "softmax training": lambda: _step(liger_ops.LigerSoftmaxFunction.apply, _leaf(4, 1000)),
    "rope training": lambda: _step(
        liger_ops.LigerRopeFunction.apply,
        _leaf(1, 8, 16, 64),
        _leaf(1, 2, 16, 64),
        _x(1, 16, 64),
        _x(1, 16, 64),
    ),
    "qwen2vl_mrope training": lambda: _step(
        lambda q, k, cos, sin: liger_ops.LigerQwen2VLMRopeFunction.apply(
            q, k, cos, sin, [8, 12, 12]
        ),
        _leaf(1, 8, 16, 64),
        _leaf(1, 2, 16, 64),
        _x(3, 1, 16, 64),
        _x(3, 1, 16, 64),
    ),
    "llama4_rope training": lambda: _step(
        liger_ops.LigerLlama4RopeFunction.apply,
        _leaf(1, 16, 8, 64),
        _leaf(1, 16, 2, 64),
        torch.randn(16, 32, dtype=torch.complex64, device=DEVICE),
    ),
    "embedding training": lambda: _step(
        liger_ops.LigerEmbeddingFunction.apply, _leaf(100, 64), _ints(100, 4, 8)
    ),
    "cross_entropy training": lambda: _step(
        lambda x, t: liger_ops.LigerCrossEntropyFunction.apply(x, t, None),
        _leaf(4, 1000),
        _ints(1000, 4),
    ),
    "kl_div training": lambda: _step(
        lambda p, t: liger_ops.LigerKLDivLossFunction.apply(p, t, "batchmean", False, 1e-10),
        _leaf(4, 1000),
        _x(4, 1000).softmax(-1),
    ),
    "jsd training": lambda: _step(
        lambda x, t: liger_ops.LigerJSDFunction.apply(x.log_softmax(-1), t, None, 0.5, -100),
        _leaf(4, 1000),
        _x(4, 1000).log_softmax(-1),
    ),
    "tvd training": lambda: _step(
        lambda p, q: liger_ops.LigerTVDLossFunction.apply(p.softmax(-1), q),
        _leaf(4, 1000),
        _x(4, 1000).softmax(-1),
    ),
    "sparsemax training": lambda: _step(
        lambda x: liger_ops.LigerSparsemaxFunction.apply(x, -1), _leaf(4, 128)
    ),
    # 8 tokens of hidden size 64 through a (vocabulary 128, 64) head, in chunks.
    "fused_linear_cross_entropy training": lambda: _step(
        lambda x, w, t: liger_ops.LigerFusedLinearCrossEntropyFunction.apply(x, w, t),
        _leaf(8, 64),
        _leaf(128, 64),
        _ints(128, 8),
    ),
    "fused_linear_jsd training": lambda: _step(
        lambda x, w, tx, tw: liger_ops.LigerFusedLinearJSDFunction.apply(x, w, tx, tw),
        _leaf(8, 64),
        _leaf(128, 64),
        _x(8, 64),
        _x(128, 64),
    ),
}


# flash-linear-attention (fla-core): its norms, activations and chunk utilities, most of them
# under triton.autotune.
def _fla_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from fla.modules import activations, causal_conv1d, l2norm, rotary, token_shift
    from fla.modules.norm import layernorm
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.utils import cumsum, softmax, solve_tril
    from fla.ops.wall_attn import build_wall_kv_cache, parallel_wall_attn_decode

    def linear_attention(op, seq_len, beta=True, **options):
        """q, k, v (batch, time, heads, head dim), the log-space decay g (batch, time, heads),
        and for the delta rules the write strength beta; one sequence. ``options`` are the op's
        keyword arguments."""
        q, k, v = (_x(1, seq_len, 2, 64) for _ in range(3))
        g = torch.nn.functional.logsigmoid(_x(1, seq_len, 2))
        if beta:
            b = _x(1, seq_len, 2).sigmoid()
            return lambda: op(q, k, v, g, beta=b, **options)  # fused_recurrent: gk, gv come first
        return lambda: op(q, k, v, g, **options)

    def linear_attention_training(op, seq_len, beta=True):
        """A training step of ``linear_attention``: every input requires grad (the decay and
        beta through their activations), q and k L2-normalized inside the op."""
        qkv = [_leaf(1, seq_len, 2, 64) for _ in range(3)]
        gates = [_leaf(1, seq_len, 2) for _ in range(2 if beta else 1)]

        def forward(q, k, v, g, *b):
            g = torch.nn.functional.logsigmoid(g)
            if beta:
                return op(q, k, v, g, b[0].sigmoid(), use_qk_l2norm_in_kernel=True)
            return op(q, k, v, g)

        return _step(forward, *qkv, *gates)

    def wall_attn_decode(window_size=None):
        """A decode step of WALL attention: one query over a cache of 64 tokens in chunks of
        16, two heads of 64 (Triton's autotuner over Triton's heuristics)."""
        k, v = _x(1, 64, 2, 64), _x(1, 64, 2, 64)
        prefix = torch.nn.functional.logsigmoid(_x(1, 64, 2, 64)).cumsum(1)
        k_tilde, r_cache = build_wall_kv_cache(k, prefix, 16)
        q, p_curr = _x(1, 1, 2, 64), prefix[:, -1:].contiguous()
        return lambda: parallel_wall_attn_decode(
            q, v, p_curr, k_tilde, r_cache, None, 0.125, 16, window_size=window_size
        )

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
        "rms_norm": lambda: lambda x=_x(4, 256), w=_x(256): layernorm.rms_norm(x, w, None),
        "layer_norm prenorm": lambda: (
            lambda x=_x(4, 256), w=_x(256), b=_x(256), r=_x(4, 256): layernorm.layer_norm(
                x, w, b, r, prenorm=True
            )
        ),
        "rotary_embedding": lambda: (
            lambda x=_x(1, 16, 4, 64), cos=_x(16, 32), sin=_x(16, 32): rotary.rotary_embedding(
                x, cos, sin
            )
        ),
        "token_shift": lambda: lambda x=_x(1, 16, 64): token_shift.token_shift(x),
        # A decode step's short convolution: 2 sequences of 64 channels, a window of 4.
        "causal_conv1d_update": lambda: (
            lambda x=_x(2, 64), cache=_x(2, 64, 4), w=_x(64, 4), b=_x(64): (
                causal_conv1d.causal_conv1d_update(x, cache.clone(), None, w, b, "silu")[0]
            )
        ),
        "solve_tril": lambda: lambda A=_x(1, 128, 2, 64): solve_tril(A),
        "wall_attn decode": wall_attn_decode,
        "wall_attn decode window": lambda: wall_attn_decode(window_size=32),
        # The recurrent delta rule expects unit-norm keys: with raw ones (norm about 8) its
        # state grows each step until the output is NaN. The kernel normalizes q and k itself.
        "fused_recurrent_gated_delta_rule": lambda: linear_attention(
            fused_recurrent_gated_delta_rule, 16, use_qk_l2norm_in_kernel=True
        ),
        "chunk_gated_delta_rule": lambda: linear_attention(chunk_gated_delta_rule, 128),
        "chunk_simple_gla": lambda: linear_attention(chunk_simple_gla, 128, beta=False),
        "rms_norm training": lambda: _step(
            lambda x, w: layernorm.rms_norm(x, w, None), _leaf(4, 256), _leaf(256)
        ),
        "l2norm training": lambda: _step(l2norm.l2norm, _leaf(4, 256)),
        "chunk_gated_delta_rule training": lambda: linear_attention_training(
            chunk_gated_delta_rule, 128
        ),
        "chunk_simple_gla training": lambda: linear_attention_training(
            chunk_simple_gla, 128, beta=False
        ),
    }


FLA_CASES = [
    "l2norm",
    "swiglu",
    "sigmoid",
    "logsigmoid",
    "chunk_local_cumsum",
    "chunk_global_cumsum",
    "softmax",
    "rms_norm",
    "layer_norm prenorm",
    "rotary_embedding",
    "token_shift",
    "causal_conv1d_update",
    "solve_tril",
    "wall_attn decode",
    "wall_attn decode window",
    "fused_recurrent_gated_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_simple_gla",
    "rms_norm training",
    "l2norm training",
    "chunk_gated_delta_rule training",
    "chunk_simple_gla training",
]


def _fla_quiet_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    pytest.importorskip("fla", reason="fla-core is a test dependency")
    # fla probes Triton's active driver when imported; finding none (no GPU), it warns and
    # takes its CPU settings, which is what this machine is. It also warns that flash-attn (an
    # optional dependency) is missing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", ImportWarning)
        return _fla_cases()


@pytest.mark.parametrize("case", FLA_CASES)
def test_flash_linear_attention_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    run_case(stand_in, _fla_quiet_cases()[case]())


# Kernels under fla's own autotuner, `CachedAutotuner` (its `fla_cache_autotune` decorator), and
# the dispatch that serves each: the autotuner itself, or a heuristics over it.
FLA_CACHED_AUTOTUNER_CASES = {
    "l2norm": "fla.modules.norm.l2norm.l2norm_fwd_kernel [triton.autotune]",
    "causal_conv1d_update": (
        "fla.modules.causal_conv1d.ops.causal_conv1d_update_kernel [triton.heuristics]"
    ),
}


def _hits_by_name(stand_in, call) -> dict[str, int]:
    """:func:`run_case`; then the hits each kernel name got, by ``fastkernel.stats()``."""
    before = fastkernel.stats()
    run_case(stand_in, call)
    after = fastkernel.stats()
    return {
        name: s["hits"] - before.get(name, {}).get("hits", 0)
        for name, s in after.items()
        if s["hits"] != before.get(name, {}).get("hits", 0)
    }


@pytest.mark.parametrize("case", list(FLA_CACHED_AUTOTUNER_CASES))
def test_flash_linear_attention_cached_autotuner_is_one_native_hit(case, stand_in):
    """fla's ``CachedAutotuner`` defines its own ``run``, which for a key in its cache does what
    Triton's ``Autotuner.run`` does (``fastkernel._autotuner_classes``): its kernels are one
    native hit of the autotuner's (or the heuristics') dispatch, launching what Triton does."""
    hits = _hits_by_name(stand_in, _fla_quiet_cases()[case]())
    assert hits == {FLA_CACHED_AUTOTUNER_CASES[case]: 1}, hits


# Kernels under Triton's autotuner over Triton's heuristics, and the dispatch serving them.
FLA_AUTOTUNE_OVER_HEURISTICS_CASES = {
    "wall_attn decode": "fla.ops.wall_attn.decode.parallel_wall_attn_decode_kernel [triton.autotune]",
    "wall_attn decode window": (
        "fla.ops.wall_attn.decode.parallel_wall_attn_decode_kernel [triton.autotune]"
    ),
}


@pytest.mark.parametrize("case", list(FLA_AUTOTUNE_OVER_HEURISTICS_CASES))
def test_flash_linear_attention_autotune_over_heuristics_is_one_native_hit(case, stand_in):
    """fla's WALL attention decode kernel, ``@triton.autotune`` over ``@triton.heuristics``: one
    native hit of the autotuner's dispatch, whose record carries the tuned config and the
    heuristics' values (which read whether optional tensors and the window are None)."""
    hits = _hits_by_name(stand_in, _fla_quiet_cases()[case]())
    assert hits == {FLA_AUTOTUNE_OVER_HEURISTICS_CASES[case]: 1}, hits


@pytest.mark.parametrize("change", ["none", "source digest", "functools.wraps"])
def test_flash_linear_attention_cached_autotuner_is_known_only_as_verified(change, monkeypatch):
    """fla's ``CachedAutotuner`` is known while its ``run`` and ``should_check_fla_cache`` are
    its module's own functions with the source read (their SHA-256); another digest (another
    fla version) or a wrapper another library put on ``run`` (``functools.wraps`` copies the
    names, and ``inspect.getsource`` follows ``__wrapped__``) keeps its own run."""
    _fla_quiet_cases()
    from fla.ops.utils.cache import CachedAutotuner

    from fastkernel import _autotuner_classes

    monkeypatch.setattr(_autotuner_classes, "_known_checked", weakref.WeakKeyDictionary())
    if change == "source digest":
        known = dict(_autotuner_classes._KNOWN)
        names, _digests, when = known[("fla.ops.utils.cache", "CachedAutotuner")]
        known[("fla.ops.utils.cache", "CachedAutotuner")] = (names, frozenset({"0" * 64}), when)
        monkeypatch.setattr(_autotuner_classes, "_KNOWN", known)
    if change == "functools.wraps":
        run = CachedAutotuner.__dict__["run"]
        monkeypatch.setattr(
            CachedAutotuner, "run", functools.wraps(run)(lambda *a, **k: run(*a, **k))
        )
    found = _autotuner_classes.registration(CachedAutotuner)
    assert (found is not None) == (change == "none")


def test_flash_linear_attention_cache_mode_always_keeps_its_run(stand_in, monkeypatch):
    """With ``FLA_CACHE_MODE=always`` fla re-reads its config files on every call: the
    autotuner keeps its own run, and the launch underneath is the native hit."""
    cases = _fla_quiet_cases()
    from fla.ops.utils import cache

    monkeypatch.setattr(cache, "FLA_CACHE_MODE", cache.FlaCacheMode.ALWAYS)
    monkeypatch.setenv("FLA_CONFIG_DIR", "/nonexistent")  # no config file: Triton tunes
    hits = _hits_by_name(stand_in, cases["l2norm"]())
    assert hits == {"fla.modules.norm.l2norm.l2norm_fwd_kernel": 1}, hits


# conch-triton-kernels: vLLM-style activation, normalization and rotary-embedding ops.
CONCH_CASES = [
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "rms_norm",
    "fused_add_rms_norm",
    "gemma_rms_norm",
    "rotary_embedding",
    "paged_attention",
    "varlen_attention",
    "reshape_and_cache",
    "static_scaled_int8_quant",
    "scaled_gemm",
]


def _conch_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from conch.ops.activation.gelu_tanh_and_mul import gelu_tanh_and_mul
    from conch.ops.activation.silu_and_mul import silu_and_mul
    from conch.ops.attention.paged_attention import paged_attention
    from conch.ops.attention.varlen_attention import varlen_attention
    from conch.ops.embedding.rotary_embedding import rotary_embedding
    from conch.ops.normalization.gemma_rms_norm import gemma_rms_norm
    from conch.ops.normalization.rms_norm import fused_add_rms_norm, rms_norm
    from conch.ops.quantization.gemm import scaled_gemm
    from conch.ops.quantization.int8 import static_scaled_int8_quant
    from conch.ops.vllm.reshape_and_cache import reshape_and_cache

    # Two sequences of 50 and 33 tokens, in a cache of 8 blocks of 16 tokens (4 blocks each).
    def block_table():
        return torch.arange(8, dtype=torch.int32, device=DEVICE).reshape(2, 4)

    def seq_lens():
        return torch.tensor([50, 33], dtype=torch.int32, device=DEVICE)

    def cu_seqlens_q():  # a prefill of 3 query tokens per sequence
        return torch.tensor([0, 3, 6], dtype=torch.int32, device=DEVICE)

    def attention(op, num_tokens):  # fp16 queries (tokens, heads, head dim) and the KV cache
        q = _x(num_tokens, 8, 64, dtype=torch.float16)
        kc, vc = (_x(8, 16, 2, 64, dtype=torch.float16) for _ in range(2))
        return lambda: op(q, kc, vc)

    # These two ops write into tensors they are given and return None: the call returns what
    # they wrote, so that a GPU run can compare results.
    def write_kv_cache():  # 4 tokens' keys and values into cache slots
        k, v = _x(4, 2, 64), _x(4, 2, 64)
        kc, vc = _x(8, 16, 2, 64), _x(8, 16, 2, 64)
        slots = torch.tensor([0, 5, 17, 40], device=DEVICE)
        return lambda: (reshape_and_cache(k, v, kc, vc, slots), kc, vc)[1:]

    def int8_quant():  # into a preallocated int8 output, with a static scale
        out = torch.empty(8, 128, dtype=torch.int8, device=DEVICE)
        x, scale = _x(8, 128), torch.tensor([0.05], device=DEVICE)
        return lambda: (static_scaled_int8_quant(out, x, scale), out)[1:]

    def int8_gemm():  # int8 (16, 64) @ (64, 32), per-row and per-column scales, fp16 out
        a, b = _ints(10, 16, 64, dtype=torch.int8), _ints(10, 64, 32, dtype=torch.int8)
        scale_a, scale_b = _x(16, 1).abs(), _x(32, 1).abs()
        return lambda: scaled_gemm(a, b, scale_a, scale_b, torch.float16)

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
        # A decode step of vLLM-style paged attention, and a prefill over variable lengths.
        "paged_attention": lambda: attention(
            lambda q, kc, vc, bt=block_table(), lens=seq_lens(): paged_attention(
                q, kc, vc, bt, lens
            ),
            2,
        ),
        "varlen_attention": lambda: attention(
            lambda q, kc, vc, cu_q=cu_seqlens_q(), lens=seq_lens(), bt=block_table(): (
                varlen_attention(q, kc, vc, cu_q, 3, lens, 50, bt, causal=True)
            ),
            6,
        ),
        "reshape_and_cache": write_kv_cache,
        "static_scaled_int8_quant": int8_quant,
        "scaled_gemm": int8_gemm,
    }


@pytest.mark.parametrize("case", CONCH_CASES)
def test_conch_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    pytest.importorskip("conch", reason="conch-triton-kernels is a test dependency")
    run_case(stand_in, _conch_cases()[case]())


# FlagGems: the ops it registers for torch's aten ops, called as its own functions. Each kernel
# is wrapped in FlagGems' LibEntry, a launch cache: the first call of a specialization runs the
# kernel (JITFunction.run, or its autotuner's), later ones launch the CompiledKernel handle it
# kept (from Triton 3.7 with the runtime arguments only). Its generated pointwise ops run under
# Triton 3.5 and 3.6 only (FLAGGEMS_POINTWISE_CASES); its matmuls ask the device's properties.
FLAGGEMS_CASES = [
    "softmax",
    "log_softmax",
    "rms_norm",
    "layer_norm",
    "layer_norm wide",
    "skip_layer_norm",
    "fused_add_rms_norm",
    "sum",
    "sum_dim",
    "mean",
    "argmax",
    "cumsum",
    "var_mean",
    "vector_norm",
    "embedding",
    "topk",
    "index_select",
    "gather",
    "upsample_nearest2d",
    "upsample_nearest2d same",
    "apply_rotary_pos_emb",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "concat_and_cache_mla",
    "topk_softmax",
    "moe_sum",
    "apply_repetition_penalties",
    "grouped_topk",
    "add",
    "mul",
    "silu",
    "silu_and_mul",
    "gelu_and_mul",
]
#: The cases of FlagGems' generated pointwise kernels, which take its StridedBuffer views for
#: pointers (keyed natively as the tensors they view). They run under Triton 3.5 and 3.6 only:
#: FlagGems generates them with block pointers, which Triton 3.9 removed, and from Triton 3.7
#: its LibEntry launches their handles with the runtime arguments only, while these kernels
#: have constexprs between runtime parameters, so Triton's launcher reads past its arguments
#: (a crash; under the patch a TypeError naming the first one left out).
FLAGGEMS_POINTWISE_CASES = {"grouped_topk", "add", "mul", "silu", "silu_and_mul", "gelu_and_mul"}


@contextlib.contextmanager
def _put_back_after_import(
    changed: dict[str, object], environ_changed: dict[str, str] | None = None
):
    """Puts the environment variables and Triton's module attributes back as they were once the
    block (a library's import) ends, and fills ``changed`` with the attributes it replaced, as
    it left them, and ``environ_changed`` (when given) with the variables it set."""
    environ = dict(os.environ)
    triton_before = dict(vars(triton))
    try:
        yield
    finally:
        if environ_changed is not None:
            for name, value in os.environ.items():
                if environ.get(name) != value:
                    environ_changed[name] = value
        os.environ.clear()
        os.environ.update(environ)
        for name, value in vars(triton).items():
            if name in triton_before and triton_before[name] is not value:
                changed[name] = value
        for name in changed:
            setattr(triton, name, triton_before[name])


@pytest.fixture(scope="session")
def _flag_gems_import(tmp_path_factory):
    """flag_gems, imported with its vendor named (``GEMS_VENDOR``, instead of probing for
    vendors' tools), its tuning database and generated code in a temporary directory
    (``FLAGGEMS_DB_URL``, ``FLAGGEMS_CACHE_DIR``; the database's default name asks torch for
    the device's name) and, with no GPU, one CUDA device counted while it imports (its launch
    caches keep one table per device); and the environment variables as its import left them.
    Its import also sets variables for the process (``TRITON_CACHE_AUTOTUNING=1``, which makes
    every Triton autotuner after it load its tuning from disk instead of benchmarking): the
    environment is put back as it was, so that the tests after these see the Triton they
    expect."""
    if importlib.util.find_spec("flag_gems") is None:  # not imported yet: it needs the below
        pytest.skip("flag-gems is a test dependency")
    root = tmp_path_factory.mktemp("flag_gems")
    changed: dict[str, object] = {}
    environ_changed: dict[str, str] = {}
    with _put_back_after_import(changed, environ_changed):
        os.environ["GEMS_VENDOR"] = "nvidia"
        os.environ["FLAGGEMS_DB_URL"] = f"sqlite:///{root / 'tuned.db'}"
        os.environ["FLAGGEMS_CACHE_DIR"] = str(root / "code")
        with warnings.catch_warnings(), pytest.MonkeyPatch.context() as during_import:
            # Without a GPU it warns that the device has no properties; its autotuners pass
            # Triton's deprecated warmup and rep.
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            if torch.cuda.device_count() == 0:
                during_import.setattr(torch.cuda, "device_count", lambda: 1)
            import flag_gems
    return flag_gems, changed, environ_changed


@pytest.fixture
def flag_gems(_flag_gems_import, monkeypatch):
    """flag_gems, with the environment variables and Triton's module as its import left them
    while a test runs (as in a process that imported it)."""
    module, changed, environ_changed = _flag_gems_import
    for name, value in environ_changed.items():
        monkeypatch.setenv(name, value)
    return _as_its_import_left((module, changed), monkeypatch)


#: Triton's deprecation warnings on FlagGems' own kernel code (Triton 3.6 gives them while it
#: compiles its index_select, topk, var_mean and log_softmax kernels).
FLAGGEMS_TRITON_WARNINGS = (
    "Logical operators 'and' and 'or' are deprecated",
    "tl.where with a non-boolean condition is deprecated",
    "tl.make_block_ptr is deprecated",  # Triton 3.7 and 3.8, on its pointwise ops
)


def _without_triton_warnings(call: Callable[[], object]) -> Callable[[], object]:
    def run():
        with warnings.catch_warnings():
            for message in FLAGGEMS_TRITON_WARNINGS:
                warnings.filterwarnings("ignore", re.escape(message), UserWarning)
            return call()

    return run


def _flag_gems_cases(flag_gems) -> dict[str, Callable[[], Callable[[], object]]]:
    cases = _flag_gems_calls(flag_gems)
    if abi.TRITON_VERSION >= (3, 7):
        why = (
            "with block pointers, which Triton 3.9 removed"
            if abi.TRITON_VERSION >= (3, 9)
            else "with constexprs between runtime parameters, whose handles its LibEntry "
            "launches with the runtime arguments only from Triton 3.7 (Triton's launcher "
            "reads past them)"
        )
        for name in FLAGGEMS_POINTWISE_CASES:
            cases[name] = lambda name=name: pytest.skip(f"{name}: FlagGems generates it {why}")
    return {name: (lambda f=f: _without_triton_warnings(f())) for name, f in cases.items()}


def _flag_gems_calls(flag_gems) -> dict[str, Callable[[], Callable[[], object]]]:
    ops = flag_gems.ops
    return {
        "softmax": lambda: lambda x=_x(8, 128): ops.softmax(x, -1),
        "log_softmax": lambda: lambda x=_x(8, 128): ops.log_softmax(x, -1),
        "rms_norm": lambda: lambda x=_x(8, 128), w=_x(128): ops.rms_norm(x, [128], w, 1e-6),
        "layer_norm": lambda: (
            lambda x=_x(8, 128), w=_x(128), b=_x(128): ops.layer_norm(x, [128], w, b, 1e-5)
        ),
        "layer_norm wide": lambda: (
            lambda x=_x(8, 1024), w=_x(1024), b=_x(1024): ops.layer_norm(x, [1024], w, b, 1e-5)
        ),
        "skip_layer_norm": lambda: (
            lambda x=_x(8, 128), r=_x(8, 128), w=_x(128), b=_x(128): flag_gems.skip_layer_norm(
                x, r, [128], w, b, 1e-5
            )
        ),
        "fused_add_rms_norm": lambda: (
            lambda x=_x(8, 128), r=_x(8, 128), w=_x(128): flag_gems.fused_add_rms_norm(
                x, r, [128], w, 1e-5
            )
        ),
        "sum": lambda: lambda x=_x(8, 128): ops.sum(x),
        "sum_dim": lambda: lambda x=_x(8, 128): ops.sum_dim(x, [1]),
        "mean": lambda: lambda x=_x(8, 128): ops.mean(x),
        "argmax": lambda: lambda x=_x(8, 128): ops.argmax(x, 1),
        "cumsum": lambda: lambda x=_x(8, 128): ops.cumsum(x, 1),
        "var_mean": lambda: lambda x=_x(8, 128): ops.var_mean(x, [1]),
        "vector_norm": lambda: lambda x=_x(8, 128): ops.vector_norm(x),
        "embedding": lambda: lambda w=_x(64, 32), i=_ints(64, 16): ops.embedding(w, i),
        "topk": lambda: lambda x=_x(8, 128): ops.topk(x, 4),
        "index_select": lambda: lambda x=_x(64, 32), i=_ints(64, 16): ops.index_select(x, 0, i),
        "gather": lambda: lambda x=_x(8, 128), i=_ints(128, 8, 4): ops.gather(x, 1, i),
        "upsample_nearest2d": lambda: lambda x=_x(1, 2, 8, 8): ops.upsample_nearest2d(x, (16, 16)),
        "upsample_nearest2d same": lambda: (
            lambda x=_x(1, 2, 8, 8): ops.upsample_nearest2d(x, (8, 8))
        ),
        "apply_rotary_pos_emb": lambda: (
            lambda q=_x(4, 8, 64), k=_x(4, 2, 64), c=_x(32, 32), s=_x(32, 32), p=_ints(32, 4): (
                flag_gems.apply_rotary_pos_emb(q, k, c, s, p)
            )
        ),
        # The paged KV-cache writes of a decode step (one slot of -1: a padding token, skipped).
        "reshape_and_cache": lambda: (
            lambda k=_x(4, 2, 64), v=_x(4, 2, 64), kc=_x(8, 2, 8, 16, 8), vc=_x(8, 2, 64, 16): (
                flag_gems.reshape_and_cache(k, v, kc, vc, _slots(), "auto", _one(), _one()),
                kc,
                vc,
            )[1:]
        ),
        "reshape_and_cache_flash": lambda: (
            lambda k=_x(4, 2, 64), v=_x(4, 2, 64), kc=_x(8, 16, 2, 64), vc=_x(8, 16, 2, 64): (
                flag_gems.reshape_and_cache_flash(k, v, kc, vc, _slots(), "auto", _one(), _one()),
                kc,
                vc,
            )[1:]
        ),
        "concat_and_cache_mla": lambda: (
            lambda c=_x(4, 512), pe=_x(4, 64), cache=_x(8, 16, 576): (
                flag_gems.concat_and_cache_mla(c, pe, cache, _slots(), "auto", _one()),
                cache,
            )[1]
        ),
        # A MoE router's top-k (the index dtype is a constexpr: tl.int32) and the expert sum.
        "topk_softmax": lambda: (
            lambda w=_x(4, 2), i=_ints(8, 4, 2, dtype=torch.int32), g=_x(4, 8): (
                flag_gems.topk_softmax(w, i, torch.empty_like(i), g, True),
                w,
                i,
            )[1:]
        ),
        "moe_sum": lambda: (
            lambda x=_x(4, 2, 128), out=_x(4, 128): (flag_gems.moe_sum(x, out), out)[1]
        ),
        "apply_repetition_penalties": lambda: (
            lambda x=_x(2, 100), p=_ints(2, 2, 100), o=_ints(2, 2, 100), r=_x(2): (
                flag_gems.apply_repetition_penalties(x, p.bool(), o.bool(), r.abs() + 1),
                x,
            )[1]
        ),
        # Generated pointwise kernels (FLAGGEMS_POINTWISE_CASES; grouped_topk's tanh).
        "grouped_topk": lambda: (
            lambda x=_x(4, 64), b=_x(64): flag_gems.grouped_topk(x, 8, 4, 8, True, 2.5, b, 1)
        ),
        "add": lambda: lambda x=_x(8, 128), y=_x(8, 128): ops.add(x, y),
        "mul": lambda: lambda x=_x(8, 128), y=_x(8, 128): ops.mul(x, y),
        "silu": lambda: lambda x=_x(8, 128): ops.silu(x),
        "silu_and_mul": lambda: lambda x=_x(8, 128), y=_x(8, 128): flag_gems.silu_and_mul(x, y),
        "gelu_and_mul": lambda: (
            lambda x=_x(8, 128), y=_x(8, 128): flag_gems.gelu_and_mul(x, y, "tanh")
        ),
    }


@pytest.mark.parametrize("case", FLAGGEMS_CASES)
def test_flag_gems_ops_launch_as_triton_does_and_hit_natively(
    case, stand_in, flag_gems, monkeypatch
):
    _flag_gems_on_stand_in(monkeypatch)
    run_case(stand_in, _flag_gems_cases(flag_gems)[case]())


def _flag_gems_on_stand_in(monkeypatch) -> None:
    """FlagGems' host functions, made to run on the stand-in's CPU tensors."""
    # FlagGems enters torch.cuda.device(index) around each launch and keys its launch caches
    # by torch.cuda.current_device(): the one device the stand-in drives.
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    # Its upsampling asserts that the input is on its vendor's device type.
    upsampling = importlib.import_module("flag_gems.ops.upsample_nearest2d")
    monkeypatch.setattr(upsampling, "device", DEVICE)


@pytest.mark.parametrize("case", ["upsample_nearest2d", "upsample_nearest2d same"])
def test_flag_gems_autotune_over_heuristics_is_one_native_hit(
    case, stand_in, flag_gems, monkeypatch
):
    """FlagGems' nearest upsampling kernel, ``@triton.autotune`` over ``@triton.heuristics``
    without a LibEntry: one native hit of the autotuner's dispatch, whose record carries the
    tuned config and the heuristics' values (computed from the keyed sizes)."""
    _flag_gems_on_stand_in(monkeypatch)
    hits = _hits_by_name(stand_in, _flag_gems_cases(flag_gems)[case]())
    name = "flag_gems.ops.upsample_nearest2d.upsample_nearest2d_kernel [triton.autotune]"
    assert hits == {name: 1}, hits


# SGLang: the Triton kernels of its attention backend and of its layers, called through the host
# functions its model runner calls (the serving runtime itself is not started). On a machine
# without CUDA it takes its CPU platform's settings (block sizes, warps), the same for both runs.
def _as_its_import_left(imported: tuple, monkeypatch):
    """The module of ``imported`` (a module and the Triton attributes its import replaced), with
    those attributes as its import left them while a test runs."""
    module, changed = imported
    for name, value in changed.items():
        monkeypatch.setattr(triton, name, value)
    return module


SGLANG_CASES = [
    "decode_attention",
    "decode_attention grouped",
    "extend_attention",
    "dense_prefill_attention",
    "context_attention",
    "merge_state",
    "reshape_and_cache_flash",
    "gelu_and_mul",
    "fused_rmsnorm",
    "fused_dual_residual_rmsnorm",
    "mrope",
    "moe_fused_gate",
    "token_bitmask",
    "selective_state_update",
    # Its copy of flash-linear-attention (sglang/kernels/ops/attention/fla): the decode step of
    # Qwen3-Next's gated delta rule and of Kimi Linear's KDA.
    "fla fused_recurrent_gated_delta_rule_packed_decode",
    "fla fused_recurrent_kda_packed_decode",
]


@pytest.fixture(scope="session")
def _sglang_import():
    """sglang, imported without changing the process, and what its import changed in Triton's
    module. Its package imports its runtime's utilities, which warn that requests has no
    character-detection library (not used here), point Triton's, Inductor's and CUDA's caches
    into ~/.cache/sglang through environment variables, and replace ``triton.next_power_of_2``
    with a Python function of their own; all of it is put back, so that the tests after these
    see the Triton they expect."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is a test dependency")
    changed: dict[str, object] = {}
    with _put_back_after_import(changed), warnings.catch_warnings():
        warnings.simplefilter("ignore", Warning)
        import sglang
    return sglang, changed


@pytest.fixture
def sglang(_sglang_import, monkeypatch):
    """sglang, with Triton's module as its import left it while a test runs (as in an SGLang
    process, whose ``triton.next_power_of_2`` is SGLang's)."""
    return _as_its_import_left(_sglang_import, monkeypatch)


def _sglang_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from sglang.kernels.ops.activation.gelu_and_mul_triton import gelu_and_mul_triton
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import (
        dense_prefill_attention_fwd,
        extend_attention_fwd,
    )
    from sglang.kernels.ops.attention.merge_state import merge_state_triton
    from sglang.kernels.ops.attention.prefill_attention import context_attention_fwd
    from sglang.kernels.ops.attention.rotary_triton import triton_mrope_fused
    from sglang.kernels.ops.grammar.bitmask_ops import apply_token_bitmask_inplace_triton
    from sglang.kernels.ops.kvcache.cache_ops import launch_reshape_and_cache_flash
    from sglang.kernels.ops.layernorm.fused_rmsnorm import (
        fused_dual_residual_rmsnorm,
        fused_rmsnorm,
    )
    from sglang.kernels.ops.moe.moe_fused_gate import moe_fused_gate

    with warnings.catch_warnings():
        # Its import asks Triton for the active device's properties and, without a GPU, warns
        # that it rolls back to the CPU (sglang/kernels/ops/attention/fla/utils.py).
        warnings.simplefilter("ignore", UserWarning)
        from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    half = torch.float16

    def indptr(*lengths):  # int32 offsets of consecutive runs of these lengths
        return torch.tensor([0, *lengths], dtype=torch.int32, device=DEVICE).cumsum(0).int()

    # A decode step of two requests of 50 and 33 cached tokens: their slots in a KV buffer of
    # 96 token slots, 4 KV splits; MHA (8 query heads on 8 KV heads) or grouped (8 on 2).
    def decode(kv_heads):
        q, o = _x(2, 8, 64, dtype=half), _x(2, 8, 64, dtype=half)
        kb, vb = _x(96, kv_heads, 64, dtype=half), _x(96, kv_heads, 64, dtype=half)
        kv_indptr, kv_indices = indptr(50, 33), torch.randperm(96, device=DEVICE)[:83].int()
        logits, lse = _x(2, 8, 4, 64), _x(2, 8, 4)
        splits = torch.full((2,), 4, dtype=torch.int32, device=DEVICE)

        def call():
            decode_attention_fwd(
                q, kb, vb, o, kv_indptr, kv_indices, logits, lse, splits, 4, 0.125, 1.0, 1.0
            )
            return o

        return call

    # A prefill continuing two requests with 10 and 7 cached tokens by 3 and 5 new ones.
    def extend():
        q, k, v, o = (_x(8, 4, 64, dtype=half) for _ in range(4))
        kb, vb = _x(32, 4, 64, dtype=half), _x(32, 4, 64, dtype=half)
        qo_indptr, kv_indptr = indptr(3, 5), indptr(10, 7)
        kv_indices = torch.arange(17, dtype=torch.int32, device=DEVICE)

        def call():
            extend_attention_fwd(
                q, k, v, o, kb, vb, qo_indptr, kv_indptr, kv_indices, None, True, None, 5, 1.0, 1.0
            )
            return o

        return call

    # Dense prefill over materialized K/V: 3 and 5 queries over 13 and 12 keys.
    def dense_prefill():
        q, o = _x(8, 4, 64, dtype=half), _x(8, 4, 64, dtype=half)
        k, v = _x(25, 2, 64, dtype=half), _x(25, 2, 64, dtype=half)
        qo_indptr, kv_indptr = indptr(3, 5), indptr(13, 12)

        def call():
            dense_prefill_attention_fwd(q, k, v, o, qo_indptr, kv_indptr, 5)
            return o

        return call

    # The prefill kernel of SGLang's first attention backend: two sequences of 5 and 3 tokens,
    # 8 query heads on 2 KV heads.
    def context():
        q, o = _x(8, 8, 64, dtype=half), _x(8, 8, 64, dtype=half)
        k, v = _x(8, 2, 64, dtype=half), _x(8, 2, 64, dtype=half)
        start = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([5, 3], dtype=torch.int32, device=DEVICE)

        def call():
            context_attention_fwd(q, k, v, o, start, lens, 5)
            return o

        return call

    # 4 tokens' keys and values into a paged cache of 8 pages of 16 slots.
    def write_kv_cache():
        k, v = _x(4, 2, 64, dtype=half), _x(4, 2, 64, dtype=half)
        kc, vc = _x(8, 16, 2, 64, dtype=half), _x(8, 16, 2, 64, dtype=half)
        slots = torch.tensor([0, 5, 17, 40], device=DEVICE)
        return lambda: (launch_reshape_and_cache_flash(k, v, kc, vc, slots), kc, vc)[1:]

    # Grammar-constrained decoding: 2 rows of a 1000-token vocabulary masked in place.
    def token_bitmask():
        logits = _x(2, 1000)
        bitmask = _ints(1 << 30, 2, 32, dtype=torch.int32)
        return lambda: (apply_token_bitmask_inplace_triton(logits, bitmask), logits)[1]

    # A Mamba-2 decode step: the SSM state of 2 sequences, 4 heads of 16 channels and a state
    # of 16, updated in place. Eight stacked triton.heuristics over the kernel, one of them
    # calling triton.next_power_of_2, which SGLang's runtime replaced with its own function.
    def mamba_decode():
        state, x, dt, a, b, c, d, z, dt_bias, out = _mamba_decode_inputs()

        def call():
            selective_state_update(state, x, dt, a, b, c, d, z, dt_bias, True, out=out)
            return out, state

        return call

    # Qwen2-VL's multimodal rotary embedding, in place: 4 tokens, 8 query and 2 key heads of
    # 128, sections of 16, 24 and 24 rotary pairs over (time, height, width) positions.
    def mrope():
        q, k = _x(4, 8 * 128), _x(4, 2 * 128)
        cache, positions = _x(64, 128), _ints(64, 3, 4)
        axis_map = torch.tensor([0] * 16 + [1] * 24 + [2] * 24, dtype=torch.int32, device=DEVICE)

        def call():
            triton_mrope_fused(
                q, k, cache, positions, [16, 24, 24], 128, 128, False, False, True, axis_map
            )
            return q, k

        return call

    return {
        "decode_attention": lambda: decode(8),
        "decode_attention grouped": lambda: decode(2),
        "extend_attention": extend,
        "dense_prefill_attention": dense_prefill,
        "context_attention": context,
        # The outputs and log-sum-exps of attention over a prefix and a suffix, merged.
        "merge_state": lambda: (
            lambda p=_x(4, 8, 64), pl=_x(4, 8), q=_x(4, 8, 64), ql=_x(4, 8): merge_state_triton(
                p, pl, q, ql
            )
        ),
        "reshape_and_cache_flash": write_kv_cache,
        "gelu_and_mul": lambda: lambda x=_x(4, 512, dtype=half): gelu_and_mul_triton(x)[0],
        "fused_rmsnorm": lambda: lambda x=_x(4, 256), w=_x(256): fused_rmsnorm(x, w, 1e-6),
        "fused_dual_residual_rmsnorm": lambda: (
            lambda x=_x(4, 256), r=_x(4, 256), w1=_x(256), w2=_x(256): fused_dual_residual_rmsnorm(
                x, r, w1, w2, 1e-6
            )
        ),
        "mrope": mrope,
        # DeepSeek-V3's router: 64 experts in 8 groups, the top 2 groups, 6 experts per token.
        "moe_fused_gate": lambda: (
            lambda s=_x(4, 64), b=_x(64): moe_fused_gate(
                s, b, 6, "sigmoid", 0, True, 2.5, False, 0.0, 8, 2
            )
        ),
        "token_bitmask": token_bitmask,
        "selective_state_update": mamba_decode,
        **_sglang_fla_cases(),
    }


def _sglang_fla_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """The decode step of linear attention through SGLang's copy of flash-linear-attention, as
    its Triton GDN and KDA backends call it (sglang/srt/layers/attention/linear/kernels): 2
    sequences of one token, q, k and v packed in the projection's output (2 heads of 64
    each), their recurrent states in slots 2 and 0 of a pool of 3, updated in place, q and k
    L2-normalized inside the op. (Its chunked prefill kernels, the ones under
    triton.heuristics over triton.autotune, use block pointers, which Triton no longer compiles:
    it replaced them with tensor descriptors.)"""
    with warnings.catch_warnings():
        # As for its Mamba ops: its utilities find no GPU when imported and warn.
        warnings.simplefilter("ignore", UserWarning)
        from sglang.kernels.ops.attention.fla.fused_recurrent import (
            fused_recurrent_gated_delta_rule_packed_decode,
            fused_recurrent_kda_packed_decode,
        )

    half = torch.bfloat16

    # The gate's input a and its bias dt_bias, ``gates`` per head: one (the gated delta rule)
    # or one per key channel (KDA); the write strength's input b, one per head.
    def packed_decode(op, gates, **options):
        mixed_qkv, a, b = (_x(2, n, dtype=half) for n in (3 * 2 * 64, 2 * gates, 2))
        a_log, dt_bias = _x(2), _x(2 * gates)
        states, out = _x(3, 2, 64, 64), _x(2, 1, 2, 64, dtype=half)
        slots = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
        return lambda: op(
            mixed_qkv,
            a,
            b,
            a_log,
            dt_bias,
            64**-0.5,
            states,
            out,
            slots,
            use_qk_l2norm_in_kernel=True,
            **options,
        )

    return {
        "fla fused_recurrent_gated_delta_rule_packed_decode": lambda: packed_decode(
            fused_recurrent_gated_delta_rule_packed_decode, 1
        ),
        # Kimi Linear's, with its safe gate's lower bound.
        "fla fused_recurrent_kda_packed_decode": lambda: packed_decode(
            fused_recurrent_kda_packed_decode, 64, lower_bound=-5.0
        ),
    }


@pytest.mark.parametrize("case", SGLANG_CASES)
def test_sglang_ops_launch_as_triton_does_and_hit_natively(case, stand_in, sglang, monkeypatch):
    # Its Mamba wrapper enters the tensors' device module's device context, which torch.cpu
    # lacks: the one device the stand-in drives.
    monkeypatch.setattr(torch.cpu, "device", lambda index: contextlib.nullcontext(), raising=False)
    run_case(stand_in, _sglang_cases()[case]())


# vLLM: the Triton kernels of its V1 Triton attention backend, its KV cache writes, sampler, fused
# MoE and Mamba layers, the per-step kernels of its V1 GPU model runner (inputs, block tables,
# sampler, spec-decode verification) and its multi-LoRA kernels, called through the host
# functions its model runner calls (the engine itself is not started).
VLLM_CASES = [
    "decode_attention",
    "decode_attention grouped",
    "context_attention",
    "merge_attn_states",
    "reshape_and_cache_flash",
    "fused_experts",
    "rms_norm_gated",
    "selective_state_update",
    "causal_conv1d_update",
    "mrope",
    "top_k_top_p",
    "per_token_group_quant_fp8",
    # The attention of its V1 Triton backend: kernel_unified_attention has 77 parameters, 34 of
    # them constexpr, a key of about 100 words.
    "unified_attention prefill",
    "unified_attention decode",
    # The per-step kernels of its V1 GPU model runner.
    "prepare_prefill_inputs",
    "prepare_pos_seq_lens",
    "combine_sampled_and_draft_tokens",
    "expand_idx_mapping",
    "post_update",
    "block_tables",
    "bincount",
    "apply_penalties",
    "apply_temperature",
    "apply_min_p",
    "gumbel_sample",
    "compute_topk_scores",
    "rejection_sample",
    # Multi-LoRA.
    "lora_shrink",
    "lora_expand",
    # Batch-invariant ops, lightning attention, the logits' NaN count.
    "rms_norm_batch_invariant",
    "log_softmax batch-invariant",
    "mean_dim batch-invariant",
    "lightning attention decode",
    "get_num_nans",
    # Its copy of flash-linear-attention (vllm/third_party/flash_linear_attention): the prefill
    # of Qwen3-Next's gated delta rule and of KDA (its gate activated before the op or in it),
    # and the gated delta rule's decode step.
    "fla chunk_gated_delta_rule",
    "fla chunk_kda",
    "fla chunk_kda_with_fused_gate",
    "fla fused_recurrent_gated_delta_rule decode",
]

#: The modules of the host functions the vLLM cases call, imported with vllm (below).
VLLM_MODULES = (
    "vllm.v1.attention.ops.triton_unified_attention",
    "vllm.v1.attention.ops.triton_decode_attention",
    "vllm.v1.attention.ops.triton_prefill_attention",
    "vllm.v1.attention.ops.triton_merge_attn_states",
    "vllm.v1.attention.ops.triton_reshape_and_cache_flash",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.model_executor.layers.mamba.ops.layernorm_gated",
    "vllm.v1.sample.ops.topk_topp_triton",
    "vllm.model_executor.layers.quantization.utils.fp8_utils",
    "vllm.model_executor.layers.rotary_embedding.mrope",
    "vllm.v1.worker.gpu.input_batch",
    "vllm.v1.worker.gpu.block_table",
    "vllm.v1.worker.gpu.sample.gumbel",
    "vllm.v1.worker.gpu.sample.logprob",
    "vllm.v1.worker.gpu.sample.min_p",
    "vllm.v1.worker.gpu.sample.penalties",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
    "vllm.v1.worker.cpu.buffer_utils",
    "vllm.lora.ops.triton_ops",
    "vllm.model_executor.determinism.batch_invariant",
    "vllm.model_executor.layers.lightning_attn",
    "vllm.v1.worker.gpu.metrics.logits",
    "vllm.third_party.flash_linear_attention.ops",
    "vllm.third_party.flash_linear_attention.ops.kda",
)

#: Modules that, on vLLM's CPU platform, replace their Triton host functions with CPU ops when
#: they are imported.
VLLM_GPU_MODULES = (
    "vllm.model_executor.layers.mamba.ops.mamba_ssm",
    "vllm.model_executor.layers.mamba.ops.causal_conv1d",
)


@pytest.fixture(scope="session")
def _vllm_import():
    """vllm and the modules of its host functions, imported without changing the process, and
    what the import changed in Triton's module. Without a Triton driver active (no GPU) vLLM
    swaps in a placeholder Triton unless it takes the environment for a distributed worker's,
    whose ``CUDA_VISIBLE_DEVICES`` is empty; ``VLLM_TARGET_DEVICE=cpu`` has it take its CPU
    platform. Both are set while it imports only. Its import also sets Triton's, Inductor's and
    torch's settings through environment variables; all of it is put back, so that the tests
    after these see the process they expect."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is a test dependency")
    changed: dict[str, object] = {}
    with _put_back_after_import(changed):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Warning)
            import vllm

            for module in VLLM_MODULES:
                importlib.import_module(module)
            # VLLM_GPU_MODULES as on a GPU; what they import is imported before, as it is.
            importlib.import_module("vllm.model_executor.layers.mamba.ops.triton_helpers")
            with pytest.MonkeyPatch.context() as as_on_a_gpu:
                as_on_a_gpu.setattr(vllm.platforms.current_platform, "is_cpu", lambda: False)
                for module in VLLM_GPU_MODULES:
                    importlib.import_module(module)
    return vllm, changed


@pytest.fixture
def vllm(_vllm_import, monkeypatch):
    """vllm, with Triton's module as its import left it while a test runs."""
    return _as_its_import_left(_vllm_import, monkeypatch)


def _vllm_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts_impl
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update
    from vllm.model_executor.layers.quantization.utils.fp8_utils import per_token_group_quant_fp8
    from vllm.model_executor.layers.rotary_embedding.mrope import triton_mrope
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd
    from vllm.v1.attention.ops.triton_merge_attn_states import merge_attn_states
    from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        triton_reshape_and_cache_flash,
    )
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton

    half = torch.float16

    def int32(*values):
        return torch.tensor(values, dtype=torch.int32, device=DEVICE)

    # The Triton attention backend: a paged KV cache of 8 blocks of 16 tokens, 8 query heads on
    # 2 KV heads of 64, and the backend's split-KV scratch of 16 segments. A prefill of two
    # requests of 12 and 5 tokens (past 8 query tokens the 2D kernel), or a decode step of two
    # requests with 50 and 33 tokens cached (the 3D kernel over the segments, then their
    # reduction).
    def unified(query_lens, seq_lens):
        num_tokens = sum(query_lens)
        q, out = _x(num_tokens, 8, 64, dtype=half), _x(num_tokens, 8, 64, dtype=half)
        kc, vc = _x(8, 16, 2, 64, dtype=half), _x(8, 16, 2, 64, dtype=half)
        cu_seqlens_q = int32(0, *query_lens).cumsum(0).int()
        seqused_k = int32(*seq_lens)
        block_table = torch.arange(8, dtype=torch.int32, device=DEVICE).reshape(2, 4)
        split_kv = {
            "seq_threshold_3D": 128 // 2,  # the backend's: 128 programs over its KV heads
            "num_par_softmax_segments": 16,
            "softmax_segm_output": _x(num_tokens, 8, 16, 64),
            "softmax_segm_max": _x(num_tokens, 8, 16),
            "softmax_segm_expsum": _x(num_tokens, 8, 16),
        }
        # No sliding window, softcap or fp8 descales.
        args = (q, kc, vc, out, cu_seqlens_q, max(query_lens), seqused_k, max(seq_lens), 0.125)
        args += (True, (-1, -1), block_table, 0.0, None, None, None)

        def call():
            unified_attention(*args, **split_kv)
            return out

        return call

    # Split-KV decode attention (its Triton MLA backend's, whose one latent KV head takes the
    # grouped kernel): two requests with 50 and 33 cached tokens in pages of 16 slots, 4 KV
    # splits; MHA (8 query heads on 8 KV heads) or grouped (8 on 2).
    def decode(kv_heads):
        q, o = _x(2, 8, 64, dtype=half), _x(2, 8, 64, dtype=half)
        kb, vb = _x(8, 16, kv_heads, 64, dtype=half), _x(8, 16, kv_heads, 64, dtype=half)
        lse, logits = _x(2, 8), _x(2, 8, 4, 65)
        req_to_page = torch.arange(8, dtype=torch.int32, device=DEVICE).reshape(2, 4)
        seq_lens = int32(50, 33)

        def call():
            decode_attention_fwd(
                q, kb, vb, o, lse, req_to_page, seq_lens, logits, 4, 0.125, page_size=16
            )
            return o

        return call

    # Attention over the new tokens' own keys and values (the Triton backend's encoder
    # attention, vision encoders): two sequences of 5 and 3 tokens, 8 query heads on 2 KV heads.
    def context():
        q, o = _x(8, 8, 64, dtype=half), _x(8, 8, 64, dtype=half)
        k, v = _x(8, 2, 64, dtype=half), _x(8, 2, 64, dtype=half)

        def call():
            context_attention_fwd(q, k, v, o, int32(0, 5), int32(5, 3), 5)
            return o

        return call

    # Chunked prefill: the attention outputs and log-sum-exps over a prefix and over the new
    # tokens, merged (4 tokens, 8 heads of 64).
    def merge():
        out = _x(4, 8, 64, dtype=half)
        prefix, suffix = _x(4, 8, 64, dtype=half), _x(4, 8, 64, dtype=half)
        prefix_lse, suffix_lse = _x(8, 4), _x(8, 4)
        return lambda: (merge_attn_states(out, prefix, prefix_lse, suffix, suffix_lse), out)[1]

    # 4 tokens' keys and values into a paged cache of 8 blocks of 16 slots.
    def write_kv_cache():
        k, v = _x(4, 2, 64, dtype=half), _x(4, 2, 64, dtype=half)
        kc, vc = _x(8, 16, 2, 64, dtype=half), _x(8, 16, 2, 64, dtype=half)
        slots = torch.tensor([0, 5, 17, 40], device=DEVICE)
        scale = torch.ones(1, device=DEVICE)

        def call():
            triton_reshape_and_cache_flash(k, v, kc, vc, slots, "auto", scale, scale)
            return kc, vc

        return call

    # A MoE layer's experts: 2 tokens of hidden size 64, routed to 2 of 16 experts of
    # intermediate size 128 (SiLU-gated), each token's two outputs summed by their weights;
    # few tokens for so many experts, so each (token, expert) pair is a block of its own, with
    # no alignment pass. It is called as the fused_experts op runs it: the op itself would hide
    # what it allocates from the TorchDispatchMode that records the storages a call makes (a
    # mode's ops run with the mode off).
    def moe():
        x = _x(2, 64, dtype=half)
        w1, w2 = _x(16, 256, 64, dtype=half) / 8, _x(16, 64, 128, dtype=half) / 8
        weights = _x(2, 2).softmax(-1)
        ids = torch.randperm(16, device=DEVICE)[:4].reshape(2, 2).int()
        return lambda: fused_experts_impl(x, w1, w2, weights, ids)

    # A Mamba-2 decode step: the SSM state of 2 sequences, 4 heads of 16 channels and a state
    # of 16, updated in place.
    def mamba_decode():
        state, x, dt, a, b, c, d, z, dt_bias, out = _mamba_decode_inputs()

        def call():
            selective_state_update(state, x, dt, a, b, c, d, dt_bias, z, True, out=out)
            return out, state

        return call

    # Its short causal convolution before the SSM, a decode step: 2 sequences of 64 channels,
    # width 4, their conv states in cache lines 1 and 2 (line 0 is the null block), in place.
    def conv_decode():
        x, state = _x(2, 64), _x(3, 64, 3)
        weight, bias = _x(64, 4), _x(64)
        lines = int32(1, 2)

        def call():
            out = causal_conv1d_update(x, state, weight, bias, "silu", conv_state_indices=lines)
            return out, state

        return call

    # Qwen2-VL's multimodal rotary embedding, in place: 4 tokens, 8 query and 2 key heads of
    # 128, sections of 16, 24 and 24 rotary pairs over (time, height, width) positions.
    def mrope():
        q, k = _x(4, 8 * 128), _x(4, 2 * 128)
        cos, sin = _x(3, 4, 64), _x(3, 4, 64)
        return lambda: triton_mrope(q, k, cos, sin, [16, 24, 24], 128, 128, False, True)

    # The sampler: top-k then top-p masking of 4 rows of a 1000-token vocabulary, in place.
    def top_k_top_p():
        logits = _x(4, 1000)
        k = torch.tensor([5, 20, 50, 1000], device=DEVICE)
        p = torch.tensor([0.9, 0.5, 1.0, 0.8], device=DEVICE)
        return lambda: apply_top_k_top_p_triton(logits, k, p)

    return {
        "unified_attention prefill": lambda: unified((12, 5), (12, 5)),
        "unified_attention decode": lambda: unified((1, 1), (50, 33)),
        "decode_attention": lambda: decode(8),
        "decode_attention grouped": lambda: decode(2),
        "context_attention": context,
        "merge_attn_states": merge,
        "reshape_and_cache_flash": write_kv_cache,
        "fused_experts": moe,
        # Mamba-2's gated RMS norm: 4 tokens of 256 channels in groups of 64, gated by z.
        "rms_norm_gated": lambda: (
            lambda x=_x(4, 256), w=_x(256), z=_x(4, 256): rms_norm_gated(
                x, w, None, z=z, eps=1e-6, group_size=64, norm_before_gate=False
            )
        ),
        "selective_state_update": mamba_decode,
        "causal_conv1d_update": conv_decode,
        "mrope": mrope,
        "top_k_top_p": top_k_top_p,
        # Block-quantized fp8 (DeepSeek-V3's): activations quantized per group of 128.
        "per_token_group_quant_fp8": lambda: lambda x=_x(4, 256): per_token_group_quant_fp8(x, 128),
        **_vllm_model_runner_cases(),
        **_vllm_lora_cases(),
        **_vllm_layer_cases(),
        **_vllm_fla_cases(),
    }


def _vllm_layer_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """The batch-invariant ops its deterministic mode puts in place of torch's, the decode step
    of MiniMax's lightning attention, and the runner's NaN count over the logits."""
    from vllm.model_executor.determinism import batch_invariant
    from vllm.model_executor.layers.lightning_attn import linear_decode_forward_triton
    from vllm.v1.worker.gpu.metrics.logits import get_num_nans

    # Lightning attention's decode: 2 sequences, 4 heads of 64, each sequence's state in a
    # slot of the KV cache (the second sequence's slot 1 of 3).
    def lightning_decode():
        q, k, v = (_x(2, 4, 1, 64) for _ in range(3))
        kv_caches, slope_rate = _x(3, 4, 64, 64), _x(4).abs()
        slot_idx = torch.tensor([2, 1], dtype=torch.int64, device=DEVICE)
        return lambda: (
            linear_decode_forward_triton(q, k, v, kv_caches, slope_rate, slot_idx),
            kv_caches,
        )

    return {
        "rms_norm_batch_invariant": lambda: (
            lambda x=_x(4, 256), w=_x(256): batch_invariant.rms_norm_batch_invariant(x, w)
        ),
        "log_softmax batch-invariant": lambda: lambda x=_x(4, 1000): batch_invariant.log_softmax(x),
        "mean_dim batch-invariant": lambda: lambda x=_x(4, 64, 32): batch_invariant.mean_dim(x, 1),
        "lightning attention decode": lightning_decode,
        "get_num_nans": lambda: lambda logits=_x(3, 1000): get_num_nans(logits),
    }


def _vllm_fla_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """Linear attention through vLLM's copy of flash-linear-attention, the one its Qwen3-Next
    and Bailing layers call (vllm/third_party/flash_linear_attention): a prefill of two
    sequences of 80 and 48 tokens packed in one batch row from their recurrent states,
    returning their final states, or a decode step of two sequences of one token whose states
    sit in slots 2 and 0 of a pool of 3, updated in place; q, k and v of 2 heads of 64, q and
    k L2-normalized inside the op. Its chunked kernels stack triton.heuristics over
    triton.autotune, its recurrent one triton.heuristics over the kernel."""
    from vllm.third_party.flash_linear_attention.ops import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )
    from vllm.third_party.flash_linear_attention.ops.kda import chunk_kda, chunk_kda_with_fused_gate

    half = torch.bfloat16

    # The sequences' cumulative lengths (int32, the runner's query start locations), q, k, v.
    def packed(*seq_lens):
        q, k, v = (_x(1, sum(seq_lens), 2, 64, dtype=half) for _ in range(3))
        cu_seqlens = torch.tensor([0, *seq_lens], dtype=torch.int32, device=DEVICE).cumsum(0)
        return cu_seqlens.int(), q, k, v

    # The log-space decay, per head (the gated delta rule) or key channel (KDA), and the write
    # strength beta, per head.
    def gates(tokens, *channels):
        g = torch.nn.functional.logsigmoid(_x(1, tokens, 2, *channels))
        return g, _x(1, tokens, 2, dtype=half).sigmoid()

    def prefill(op, *channels):
        cu_seqlens, q, k, v = packed(80, 48)
        g, beta = gates(128, *channels)
        states = _x(2, 2, 64, 64)
        return lambda: op(
            q,
            k,
            v,
            g,
            beta,
            initial_state=states,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens,
        )

    # KDA from the gate's projection, raw: activated (under a safe gate's lower bound, with
    # the layer's A_log and dt_bias) and summed over each chunk in one kernel.
    def kda_with_fused_gate():
        cu_seqlens, q, k, v = packed(80, 48)
        raw_g, (_, beta) = _x(1, 128, 2, 64, dtype=half), gates(128)
        a_log, dt_bias, states = _x(2), _x(2 * 64), _x(2, 2, 64, 64)
        return lambda: chunk_kda_with_fused_gate(
            q,
            k,
            v,
            raw_g,
            beta,
            a_log,
            dt_bias,
            initial_state=states,
            output_final_state=True,
            lower_bound=-5.0,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens,
        )

    def decode():
        cu_seqlens, q, k, v = packed(1, 1)
        g, beta = gates(2)
        states, slots = _x(3, 2, 64, 64), torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
        return lambda: fused_recurrent_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            initial_state=states,
            inplace_final_state=True,
            cu_seqlens=cu_seqlens,
            ssm_state_indices=slots,
            use_qk_l2norm_in_kernel=True,
        )

    return {
        "fla chunk_gated_delta_rule": lambda: prefill(chunk_gated_delta_rule),
        "fla chunk_kda": lambda: prefill(chunk_kda, 64),
        "fla chunk_kda_with_fused_gate": kda_with_fused_gate,
        "fla fused_recurrent_gated_delta_rule decode": decode,
    }


def _vllm_model_runner_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """The small per-step kernels of vLLM's V1 GPU model runner (vllm/v1/worker/gpu): its
    input preparation, block tables, sampler and spec-decode rejection sampler, each launched
    once or a few times per step, so launch-bound."""
    from vllm.v1.worker.gpu import input_batch as step_inputs
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
    from vllm.v1.worker.gpu.sample.logprob import compute_topk_scores
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties, bincount
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    int32, int64 = torch.int32, torch.int64

    def ints(*values, dtype=int32):
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    def zeros(*shape, dtype=int32):
        return torch.zeros(shape, dtype=dtype, device=DEVICE)

    # A tensor of the runner's per-request state (8 request rows), zero but in the rows given.
    def rows(values: dict[int, float], dtype=int32):
        t = zeros(8, dtype=dtype)
        for row, value in values.items():
            t[row] = value
        return t

    # A mixed step: the requests in rows 2, 0 and 5 are scheduled 4, 1 and 3 tokens, with 6,
    # 20 and 0 tokens computed before it and prompts of 10, 20 and 12 tokens: the last chunk
    # of a prefill, a decode and the first chunk of a prefill.
    def idx_mapping():
        return ints(2, 0, 5, dtype=int64)

    def query_start_loc():
        return ints(0, 4, 5, 8)

    def num_computed():
        return rows({2: 6, 0: 20, 5: 0})

    def prompt_len():
        return rows({2: 10, 0: 20, 5: 12})

    def positions():
        return ints(6, 7, 8, 9, 20, 0, 1, 2, dtype=int64)

    def all_token_ids():  # each row's prompt and output tokens, a model length of 64
        return _ints(1000, 8, 64, dtype=int32)

    # A spec-decode step: the requests in rows 2 and 0 decode with 2 draft tokens each, 30 and
    # 20 tokens computed before it: 3 tokens each, each token's logits sampled.
    def spec_idx_mapping():
        return ints(2, 0, dtype=int64)

    def spec_query_start_loc():
        return ints(0, 3, 6)

    def cu_num_logits():
        return ints(0, 3, 6)

    def spec_positions():
        return ints(30, 31, 32, 20, 21, 22, dtype=int64)

    # Writing the prefill chunks' prompt tokens into the step's input ids (and each request's
    # next prompt token, for its speculator).
    def prefill_inputs():
        input_ids, next_prefill_tokens = zeros(16), zeros(1, 8)
        args = (idx_mapping(), query_start_loc(), all_token_ids(), prompt_len(), num_computed())

        def call():
            step_inputs.prepare_prefill_inputs(input_ids, next_prefill_tokens, *args)
            return input_ids, next_prefill_tokens

        return call

    # The step's token positions and sequence lengths (the rows past the batch zeroed).
    def pos_seq_lens():
        pos, seq_lens = zeros(16, dtype=int64), zeros(8)
        args = (idx_mapping(), query_start_loc(), num_computed())

        def call():
            step_inputs.prepare_pos_seq_lens(*args, pos, seq_lens)
            return pos, seq_lens

        return call

    # Each request's last sampled token and draft tokens into the input ids, and the indices
    # of the tokens to take logits at.
    def sampled_and_draft_tokens():
        input_ids = zeros(6)
        last_sampled, drafts = _ints(1000, 8, 1), _ints(1000, 8, 2)
        seq_lens = ints(33, 23)
        args = (spec_idx_mapping(), last_sampled, spec_query_start_loc(), seq_lens, prompt_len())

        def call():
            indices = step_inputs.combine_sampled_and_draft_tokens(
                input_ids, *args, drafts, cu_num_logits(), 6
            )
            return indices, input_ids

        return call

    # After sampling: the sampled tokens into the requests' token rows, their last sampled
    # token, lengths, computed tokens, the output-token counts the penalties read, and the
    # speculator's new drafts into the requests' draft rows. The first request's second draft
    # was rejected.
    def post_update():
        num_computed_tokens, total_len = rows({2: 30, 0: 20}), rows({2: 30, 0: 20})
        last_sampled, drafts_out = zeros(8, 1, dtype=int64), zeros(8, 2, dtype=int64)
        output_bin_counts, token_ids = zeros(8, 1000), all_token_ids()
        sampled, drafts = _ints(1000, 2, 3), _ints(1000, 2, 2)
        num_sampled, num_rejected = ints(2, 3), ints(1, 0)

        def call():
            step_inputs.post_update(
                spec_idx_mapping(),
                num_computed_tokens,
                last_sampled,
                output_bin_counts,
                sampled,
                num_sampled,
                num_rejected,
                spec_query_start_loc(),
                token_ids,
                total_len,
                drafts,
                drafts_out,
            )
            return num_computed_tokens, last_sampled, total_len, token_ids, drafts_out

        return call

    # One block table of pages of 16 tokens, 4 blocks a request. A call is two steps: the
    # three requests' blocks written (as when they are added), then a block appended to the
    # decoding one; each step applies the staged writes, gathers the batch's rows into the
    # forward pass's table and computes the tokens' KV cache slots. Its staging buffers are a
    # ring of two, one taken a step: with two steps a call, every call takes the same ones.
    def block_tables():
        tables = BlockTables([16], 8, 16, [4], torch.device(DEVICE))

        def step(new_blocks, overwrite):
            for row, block_ids in new_blocks.items():
                tables.append_block_ids(row, (block_ids,), overwrite)
            tables.apply_staged_writes()
            gathered = tables.gather_block_tables(idx_mapping(), 4)
            slots = tables.compute_slot_mappings(idx_mapping(), query_start_loc(), positions(), 8)
            return gathered[0].clone(), slots.clone()

        def call():
            first = step({2: [3], 0: [7, 1], 5: [4]}, True)
            return first, step({0: [6]}, False)

        return call

    # The penalties' statistics of the newly added requests in rows 2 and 5 (the prompt
    # tokens' bitmask, the output tokens' counts).
    def penalty_counts():
        prompt_bin_mask, output_bin_counts = zeros(8, 32), zeros(8, 1000)
        args = (ints(2, 5, dtype=int64), all_token_ids(), prompt_len(), rows({2: 12, 5: 12}))

        def call():
            bincount(*args, prompt_bin_mask, output_bin_counts, 12)
            return prompt_bin_mask, output_bin_counts

        return call

    # The repetition, frequency and presence penalties on the three requests' logits (a
    # vocabulary of 1000), in place.
    def penalties():
        logits, token_ids = _x(3, 1000), _ints(1000, 3, dtype=int32)
        penalty = (rows({2: 1.2, 0: 1.0, 5: 1.1}, torch.float32), _x(8).abs(), _x(8).abs())
        counts = (_ints(1 << 30, 8, 32, dtype=int32), _ints(3, 8, 1000, dtype=int32))

        def call():
            apply_penalties(logits, idx_mapping(), token_ids, zeros(3), *penalty, *counts)
            return logits

        return call

    # Temperature and min-p on the three requests' logits, in place.
    def temperature():
        logits, temperatures = _x(3, 1000), rows({2: 0.7, 0: 1.0, 5: 1.3}, torch.float32)
        return lambda: (apply_temperature(logits, idx_mapping(), temperatures), logits)[1]

    def min_p():
        logits, min_ps = _x(3, 1000), rows({2: 0.1, 0: 0.0, 5: 0.05}, torch.float32)
        return lambda: (apply_min_p(logits, idx_mapping(), min_ps), logits)[1]

    # Sampling one token per request with Gumbel noise seeded by (request seed, position):
    # each vocabulary block's noised argmax, then their combination.
    def gumbel():
        logits, temperatures = _x(3, 1000), rows({2: 0.7, 0: 1.0, 5: 1.3}, torch.float32)
        seeds = _ints(1 << 40, 8)
        pos = ints(9, 20, 2, dtype=int64)
        return lambda: gumbel_sample(logits, idx_mapping(), temperatures, seeds, pos, True, False)

    # The log-probabilities of each sampled token and the 5 most likely ones, and the sampled
    # tokens' ranks.
    def logprobs():
        logits, sampled = _x(3, 1000), _ints(1000, 3)
        return lambda: tuple(compute_topk_scores(logits, 5, sampled))[:3]

    # Verifying the spec-decode step's drafts (n-gram drafts: no draft logits): the target
    # logits' per-block statistics, the rejection walk, the resampling of each request's
    # rejected or bonus token and its insertion.
    def rejection():
        logits, drafts = _x(6, 1000), _ints(1000, 6, dtype=int32)
        local_pos = ints(0, 1, 2, 0, 1, 2)
        temperatures, seeds = rows({2: 0.7, 0: 1.0}, torch.float32), _ints(1 << 40, 8)
        expanded = ints(2, 2, 2, 0, 0, 0, dtype=int64)

        def call():
            return rejection_sample(
                logits,
                None,
                drafts,
                cu_num_logits(),
                spec_positions(),
                spec_idx_mapping(),
                expanded,
                local_pos,
                temperatures,
                seeds,
                2,
            )

        return call

    return {
        "prepare_prefill_inputs": prefill_inputs,
        "prepare_pos_seq_lens": pos_seq_lens,
        "combine_sampled_and_draft_tokens": sampled_and_draft_tokens,
        # Each logit's request row and position within its request, for the spec-decode step.
        "expand_idx_mapping": lambda: (
            lambda: step_inputs.expand_idx_mapping(spec_idx_mapping(), 6, cu_num_logits(), 3)
        ),
        "post_update": post_update,
        "block_tables": block_tables,
        "bincount": penalty_counts,
        "apply_penalties": penalties,
        "apply_temperature": temperature,
        "apply_min_p": min_p,
        "gumbel_sample": gumbel,
        "compute_topk_scores": logprobs,
        "rejection_sample": rejection,
    }


def _vllm_lora_cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """vLLM's multi-LoRA (punica) kernels, as its GPU punica wrapper calls them for a QKV
    projection: 4 tokens of hidden size 64 with adapters 0, 1, none and 0 of 2 loaded, rank
    16, 3 slices (q, k and v, 64 each)."""
    from vllm.lora.ops.triton_ops import LoRAKernelMeta, lora_expand, lora_shrink

    half = torch.float16

    def meta():
        m = LoRAKernelMeta.make(2, 4, DEVICE)
        m.prepare_tensors(torch.tensor([0, 1, -1, 0], dtype=torch.int32, device=DEVICE))
        return m.meta_args(4, True)

    # The input times each slice's A (down-projection), scaled, into the fp32 buffer.
    def shrink():
        x, buffer = _x(4, 64, dtype=half), _x(3, 4, 16)
        lora_a = [_x(2, 16, 64, dtype=half) for _ in range(3)]
        args = meta()
        return lambda: (lora_shrink(x, lora_a, buffer, *args, 0.5), buffer)[1]

    # The buffer times each slice's B (up-projection), added to the projection's output.
    def expand():
        buffer, y = _x(3, 4, 16), _x(4, 192, dtype=half)
        lora_b = [_x(2, 64, 16, dtype=half) for _ in range(3)]
        args = meta()

        def call():
            lora_expand(buffer, lora_b, y, *args, offset_start=0, add_inputs=True)
            return y

        return call

    return {"lora_shrink": shrink, "lora_expand": expand}


@pytest.mark.parametrize("case", VLLM_CASES)
def test_vllm_ops_launch_as_triton_does_and_hit_natively(case, stand_in, vllm, monkeypatch):
    from vllm import _custom_ops
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.v1.worker.cpu import buffer_utils as cpu_buffer_utils
    from vllm.v1.worker.gpu import buffer_utils

    from fastkernel import _C

    # Its KV cache write picks its tile size by the device's compute capability: the stand-in's.
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device=None: _C.device_capability(0)
    )
    # Between and after its two expert GEMMs the fused MoE calls vLLM's CUDA ops (SiLU-and-mul,
    # the sum over each token's experts), which its CPU build does not register: torch's.
    monkeypatch.setattr(fused_moe, "apply_moe_activation", _silu_and_mul)
    monkeypatch.setattr(_custom_ops, "moe_sum", lambda x, out: torch.sum(x, 1, out=out))
    # The model runner's staging buffers (its block tables') pin host memory and map it into
    # the GPU's address space, which needs a GPU: the host buffers vLLM's CPU worker swaps in
    # for them (vllm/v1/worker/cpu/shm.py).
    monkeypatch.setattr(buffer_utils, "UvaBuffer", cpu_buffer_utils.UvaBuffer)
    run_case(stand_in, _vllm_cases()[case]())


def _silu_and_mul(activation, output: torch.Tensor, x: torch.Tensor) -> None:
    gate, up = x.chunk(2, dim=-1)
    output.copy_(torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("case", list(LIGER_CASES))
def test_liger_kernel_ops_launch_as_triton_does_and_hit_natively(case, stand_in):
    run_case(stand_in, LIGER_CASES[case]())


def test_liger_kernel_tma_swiglu_calls_its_config_pre_hooks_and_hits_natively(
    stand_in, monkeypatch
):
    """Liger-Kernel's fused gate/up SwiGLU for inference (``liger_kernel/ops/mlp.py``,
    ``gemm_swiglu``) makes its host tensor descriptors with a placeholder block shape, which each
    autotune config's ``pre_hook`` sets. On an sm_90 stand-in (TMA descriptors), with two of its
    configs (tuning all 32 compiles 32 matmuls): a call is one native hit of the autotuner, which
    calls the hook, then one of the kernel under it, launching Triton's binary and bytes."""
    from liger_kernel.ops import mlp

    monkeypatch.setenv("FKSTUB_CAPABILITY", "90")
    tuned = mlp._swiglu_kernel_forward_inference
    assert all(config.pre_hook is not None for config in tuned.configs)
    monkeypatch.setattr(tuned, "configs", tuned.configs[:2])
    x, gate, up = _x(1, 4, 64), _x(128, 64), _x(128, 64)
    served, launches = run_case(
        stand_in,
        lambda: mlp.gemm_swiglu(x, gate, up, 1.0, store_preact=False),
        hits_per_launch=2,
    )
    assert (served, launches) == (2, 1)


def _launch(*addresses: int) -> Launch:
    return Launch(
        name="k",
        device=0,
        grid=(1, 1, 1),
        block=(32, 1, 1),
        shared_mem=0,
        stream=0,
        is_ex=False,
        attrs=[],
        params=[a.to_bytes(8, "little") for a in addresses],
        param_layout=[(8 * i, 8) for i in range(len(addresses))],
        raw=b"",
    )


def test_the_launch_comparison_tells_storages_apart():
    # Storage 2 reuses storage 0's block, freed after the first launch.
    made = [(0, 0x1000, 0x1100), (0, 0x2000, 0x2100), (1, 0x1000, 0x1080)]
    assert canonical_params(_launch(0x1010, 0x2000), 0, made) == [("made", 0, 16), ("made", 1, 0)]
    assert canonical_params(_launch(0x1010), 1, made) == [("made", 2, 16)]
    assert canonical_params(_launch(0x3000), 1, made) == [(0x3000).to_bytes(8, "little")]
    other = [(0, 0x7000, 0x7100), (0, 0x8000, 0x8100), (1, 0x9000, 0x9080)]
    # The same storages at other addresses are the same launches ...
    assert_same_launches(
        [_launch(0x1010), _launch(0x1010)], made, [_launch(0x7010), _launch(0x9010)], other
    )
    # ... but a pointer into another storage, at another offset, or outside every storage made
    # at another address is not.
    for ours, theirs in ((0x2000, 0x7000), (0x1020, 0x7010), (0x3000, 0x3008)):
        with pytest.raises(AssertionError):
            assert_same_launches([_launch(ours)], made, [_launch(theirs)], other)
    # A tensor map's global address is compared the same way; its other bytes as they are.
    assert canonical_params(_tensor_map_launch(0x1010), 0, made) == [
        (_tensor_map(0)[:16], ("made", 0, 16), _tensor_map(0)[24:])
    ]
    assert_same_launches([_tensor_map_launch(0x1010)], made, [_tensor_map_launch(0x7010)], other)
    for ours, theirs, box in ((0x2000, 0x7000, 32), (0x1010, 0x7010, 64)):
        with pytest.raises(AssertionError):
            assert_same_launches(
                [_tensor_map_launch(ours)], made, [_tensor_map_launch(theirs, box)], other
            )


def _tensor_map(address: int, box: int = 32) -> bytes:
    """128 bytes laid out as the stand-in encodes a tensor map: "FKTM", the global address at
    byte 16, a box size at byte 96."""
    raw = bytearray(128)
    raw[:4] = b"FKTM"
    raw[16:24] = address.to_bytes(8, "little")
    raw[96:100] = box.to_bytes(4, "little")
    return bytes(raw)


def _tensor_map_launch(address: int, box: int = 32) -> Launch:
    launch = _launch()
    launch.params.append(_tensor_map(address, box))
    launch.param_layout.append((0, 128))
    return launch


def test_a_patched_liger_kernel_keeps_its_kernels_as_jit_functions(stand_in):
    from liger_kernel.ops import rms_norm
    from triton.runtime.jit import JITFunction

    kernel = rms_norm._rms_norm_forward_kernel
    with TritonReference(stand_in, TEST_STREAM), fastkernel.patched():
        LIGER_CASES["rms_norm"]()()
        assert isinstance(kernel, JITFunction) and PATCH_ATTR in kernel.__dict__
    assert PATCH_ATTR not in kernel.__dict__
