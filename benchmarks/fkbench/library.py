"""Library ops called through their own Python functions, unpatched and under fastkernel.patch().

Liger-Kernel's RMSNorm autograd function (batch 1, hidden 2048; its wrapper calls
``triton.next_power_of_2`` on every call), one decoder step of a small transformer layer
written with Liger-Kernel's ops (:func:`liger_decoder_step`), and flash-linear-attention's
token shift at decode (a heuristics over an autotuner, :func:`fla_token_shift`) and its
causal-conv1d decode update (a heuristics over fla's own ``CachedAutotuner``,
:func:`fla_causal_conv1d_update`) and its WALL attention decode (an autotuner over a
heuristics, :func:`fla_wall_attn_decode`), and Liger-Kernel's fused gate/up SwiGLU for
inference, whose autotune configs set its tensor descriptors' block shapes in a ``pre_hook``
(:func:`liger_swiglu_gate_up`). Host-side
(CPU tensors, launches to the recording stand-in) the times are the host cost of a call; on a
GPU they are wall time per call with the device synchronized before each clock read, and the
decoder step is also replayed as a CUDA graph (the launch-free reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import common


def liger_rms_norm(device: str) -> Callable[[], Any] | None:
    """Liger-Kernel's RMSNorm on a (1, 2048) fp32 row; None without Liger-Kernel."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    import torch

    x, w = torch.randn(1, 2048, device=device), torch.randn(2048, device=device)
    return lambda: LigerRMSNormFunction.apply(x, w, 1e-6)


def import_device_probing_libraries() -> None:
    """Imports the libraries whose import probes the device: flash-linear-attention reads
    Triton's active driver when imported and, finding a CUDA one, asks torch for the GPU's
    name. A host-side run calls this before it makes the stand-in Triton's active driver, so
    fla takes its settings for a machine without a GPU, as it does in the tests."""
    import warnings

    with warnings.catch_warnings():
        # Finding no Triton driver, fla warns that it takes CPU settings.
        warnings.simplefilter("ignore")
        try:
            import fla.modules.causal_conv1d  # noqa: F401
            import fla.modules.token_shift  # noqa: F401
            import fla.ops.wall_attn  # noqa: F401
        except ImportError:
            pass


def fla_token_shift(device: str) -> Callable[[], Any] | None:
    """flash-linear-attention's token shift forward at decode (batch 1, one token, hidden
    2048, fp32; ``fla.modules.token_shift.token_shift_fwd``): its kernel is a
    ``triton.heuristics`` over a ``triton.autotune``, launched with every argument by keyword.
    None without fla-core."""
    try:
        from fla.modules.token_shift import token_shift_fwd
    except ImportError:
        return None
    import torch

    x = torch.randn(1, 1, 2048, device=device)
    return lambda: token_shift_fwd(x)


def fla_causal_conv1d_update(device: str) -> Callable[[], Any] | None:
    """flash-linear-attention's short-convolution decode update (batch 1, hidden 2048, a window
    of 4, SiLU, fp32; ``fla.modules.causal_conv1d.causal_conv1d_update``): its kernel is a
    ``triton.heuristics`` over fla's ``CachedAutotuner`` (an ``Autotuner`` subclass with its
    own ``run``), launched with every argument by keyword. None without fla-core."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d_update
    except ImportError:
        return None
    import torch

    x, cache = torch.randn(1, 2048, device=device), torch.randn(1, 2048, 4, device=device)
    weight, bias = torch.randn(2048, 4, device=device), torch.randn(2048, device=device)
    return lambda: causal_conv1d_update(x, cache, None, weight, bias, "silu")


def fla_wall_attn_decode(device: str) -> Callable[[], Any] | None:
    """flash-linear-attention's WALL attention at decode (batch 1, one query, 4 heads of 64
    over a cache of 256 tokens in chunks of 64, fp32; ``fla.ops.wall_attn.
    parallel_wall_attn_decode``): its kernel is a ``triton.autotune`` over a
    ``triton.heuristics``, launched with every argument by keyword. None without fla-core."""
    try:
        from fla.ops.wall_attn import build_wall_kv_cache, parallel_wall_attn_decode
    except ImportError:
        return None
    import torch

    k, v = (torch.randn(1, 256, 4, 64, device=device) for _ in range(2))
    prefix = torch.nn.functional.logsigmoid(torch.randn(1, 256, 4, 64, device=device)).cumsum(1)
    k_tilde, r_cache = build_wall_kv_cache(k, prefix, 64)
    q, p_curr = torch.randn(1, 1, 4, 64, device=device), prefix[:, -1:].contiguous()
    return lambda: parallel_wall_attn_decode(q, v, p_curr, k_tilde, r_cache, None, 0.125, 64)


def liger_swiglu_gate_up(device: str) -> Callable[[], Any] | None:
    """Liger-Kernel's fused gate/up projection with SwiGLU, for inference, at decode (one token,
    256 -> 512, fp32; ``liger_kernel.ops.mlp.gemm_swiglu``): its kernel is a ``triton.autotune``
    whose every config has a ``pre_hook`` setting the host tensor descriptors' block shapes.
    Two of its 32 configs are kept (tuning them all compiles 32 matmuls). None without
    Liger-Kernel's descriptor kernels."""
    try:
        from liger_kernel.ops import mlp
    except ImportError:
        return None
    if getattr(mlp, "TensorDescriptor", None) is None:
        return None
    import torch

    tuned = mlp._swiglu_kernel_forward_inference
    tuned.configs = tuned.configs[:2]
    x = torch.randn(1, 1, 256, device=device)
    gate, up = torch.randn(512, 256, device=device), torch.randn(512, 256, device=device)
    return lambda: mlp.gemm_swiglu(x, gate, up, 1.0, store_preact=False)


def liger_decoder_step(device: str) -> Callable[[], Any] | None:
    """One decoder step of a small transformer layer at batch 1 written with Liger-Kernel's ops
    as a model built on it calls them (their autograd functions; their wrappers compute block
    sizes with triton.next_power_of_2 on every call): RMSNorm, q/k/v projections, RoPE on q and
    k, the output projection and residual, RMSNorm, SwiGLU's gate and up projections, Liger's
    SiLU-mul, the down projection and residual. Four Triton launches per step; the matmuls are
    torch's, with small dimensions (hidden 256, 4 heads of 64, intermediate 512) so that they
    do not drown the launches, and are in every mode alike. Attention itself is left out: it is
    not a Liger kernel. None without Liger-Kernel."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    import torch

    hidden, heads, head_dim, inter = 256, 4, 64, 512
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    x = randn(1, 1, hidden)
    norm1, norm2 = torch.ones(hidden, device=device), torch.ones(hidden, device=device)
    wq, wk, wv, wo = (randn(hidden, hidden, scale=0.02) for _ in range(4))
    w_gate, w_up = randn(hidden, inter, scale=0.02), randn(hidden, inter, scale=0.02)
    w_down = randn(inter, hidden, scale=0.02)
    cos, sin = randn(1, 1, head_dim), randn(1, 1, head_dim)

    def heads_of(t: Any) -> Any:
        return t.view(1, 1, heads, head_dim).transpose(1, 2)

    def step() -> Any:
        h = LigerRMSNormFunction.apply(x, norm1, 1e-6)
        q, k = LigerRopeFunction.apply(heads_of(h @ wq), heads_of(h @ wk), cos, sin)
        a = x + (h @ wv) @ wo
        h2 = LigerRMSNormFunction.apply(a, norm2, 1e-6)
        return a + LigerSiLUMulFunction.apply(h2 @ w_gate, h2 @ w_up) @ w_down

    return step


def _graph_replay(op: Callable[[], Any]) -> Callable[[], Any]:
    """``op`` captured once into a CUDA graph (after it ran outside the capture, so every kernel
    is compiled); the returned callable replays it. Captured unpatched: a replay launches
    nothing from the host, whoever recorded it."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs advises
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op()
    torch.cuda.synchronize()
    return graph.replay


def _time_modes(
    calls_of: dict[str, Callable[[], Any]],
    calls: int,
    repeats: int,
    sync: Callable[[], None],
    reset: Callable[[], None] | None,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """:func:`fkbench.common.time_systems` over the modes of one op (mode -> the call to time):
    each mode is switched to, and its call made 20 times, before each of its loops, outside
    the timing (a kernel patched anew makes one miss first). Returns the samples and the hits
    and fallbacks ``fastkernel.stats()`` reports for the live kernels at the end of the last
    ``patched`` loop."""
    import fastkernel
    from fastkernel import _autotuner_classes, _host_helpers
    from fastkernel.patch import patch, unpatch

    verified = dict(_autotuner_classes._KNOWN)

    def know_library_autotuners(known: bool) -> None:
        """Whether the patch serves the library autotuner classes it knows (while unpatched)."""
        _autotuner_classes._KNOWN.clear()
        _autotuner_classes._KNOWN.update(verified if known else {})
        _autotuner_classes._known_checked.clear()

    native: dict[str, int] = {}
    current = [""]  # the mode switched to last

    def leave_mode() -> None:
        if current[0] == "patched":  # its counters, read before unpatch() drops them
            every = fastkernel.stats().values()
            native.update({c: sum(k[c] for k in every) for c in ("hits", "fallbacks")})
        unpatch()

    def switch(mode: str, call: Callable[[], Any]) -> Callable[[], None]:
        def prepare() -> None:
            leave_mode()
            know_library_autotuners(mode != "patched_own_run")
            if mode.startswith("patched"):
                patch()
            if mode == "patched_without_helpers":
                _host_helpers.uninstall()
            current[0] = mode
            for _ in range(20):
                call()

        return prepare

    def loop(call: Callable[[], Any]) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                call()

        return run

    systems = {
        mode: common.Timed(loop(call), prepare=switch(mode, call))
        for mode, call in calls_of.items()
    }
    try:
        samples = common.time_systems(systems, calls, repeats, sync, before_repeat=reset)
    finally:
        leave_mode()
        know_library_autotuners(True)
    return samples, native


def time_library_calls(
    calls: int,
    repeats: int,
    device: str,
    sync: Callable[[], None],
    reset: Callable[[], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Microseconds per call of each library op: ``unpatched``, ``patched``
    (``fastkernel.patch()``), ``patched_without_helpers`` (the host helpers switched off), and
    on a GPU (``device == "cuda"``) the decoder step's ``cuda_graph`` replay; medians of
    ``repeats`` loops of ``calls`` calls, the modes interleaved per repeat, ``sync`` before
    each clock read, ``reset`` before each loop (the stand-in's record). Also the native hits
    and fallbacks of the patched calls (``patched_hits``, ``patched_fallbacks``: a fallback
    would mean a patched call left the native path). An op under fla's ``CachedAutotuner`` is
    also timed patched with that class's own ``run`` kept (``patched_own_run``: as the patch
    serves an ``Autotuner`` subclass it does not know)."""
    ops = {
        "Liger-Kernel RMSNorm": liger_rms_norm(device),
        "decoder step (Liger RMSNorm x2, RoPE, SwiGLU; torch matmuls)": liger_decoder_step(device),
        "flash-linear-attention token shift (decode)": fla_token_shift(device),
        "flash-linear-attention causal conv1d update (decode)": fla_causal_conv1d_update(device),
        "flash-linear-attention WALL attention (decode)": fla_wall_attn_decode(device),
        "Liger-Kernel fused gate/up SwiGLU (decode; config pre_hooks)": liger_swiglu_gate_up(
            device
        ),
    }
    out: dict[str, dict[str, float]] = {}
    for name, op in ops.items():
        if op is None:
            continue
        calls_of = {"unpatched": op, "patched": op, "patched_without_helpers": op}
        if "causal conv1d" in name:
            calls_of["patched_own_run"] = op
        if device == "cuda" and name.startswith("decoder step"):
            calls_of["cuda_graph"] = _graph_replay(op)
        samples, native = _time_modes(calls_of, calls, repeats, sync, reset)
        row: dict[str, float] = {mode: common.median(values) for mode, values in samples.items()}
        row["ratio"] = row["unpatched"] / row["patched"]
        row["patched_hits"] = native["hits"]
        row["patched_fallbacks"] = native["fallbacks"]
        out[name] = row
    return out


def print_library_calls(library: dict[str, dict[str, float]]) -> None:
    """One line per op: its modes in microseconds and unpatched / patched."""
    for name, row in library.items():
        graph = f"; CUDA graph replay {row['cuda_graph']:.2f} us" if "cuda_graph" in row else ""
        if "patched_own_run" in row:
            graph += f"; patched with CachedAutotuner.run kept {row['patched_own_run']:.2f} us"
        print(
            f"{name}, through its own Python function: unpatched {row['unpatched']:.2f} us, "
            f"patched {row['patched']:.2f} us per call ({row['ratio']:.2f}x); patched without "
            f"the host helpers {row['patched_without_helpers']:.2f} us{graph}"
        )
