"""@fastkernel is a triton JITFunction: Triton's decorators stack above it and keep launches
native; the wrong order gets an error saying what to write; Gluon kernels compile as Triton
compiles them; torch.compile captures it (GPU)."""

from __future__ import annotations

import contextlib
import struct

import kernels
import pytest
import torch
import triton
import triton.language as tl
from conftest import TEST_STREAM
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import JITFunction
from triton_reference import TritonReference, assert_same_launch

import fastkernel as fk
from fastkernel import FastKernel, fastkernel


def test_fastkernel_is_a_jit_function_sharing_the_wrapped_state():
    k = fastkernel(kernels.add_kernel)
    assert isinstance(k, JITFunction) and isinstance(k, FastKernel)
    assert k.jit_function is kernels.add_kernel
    assert k.cache_key == kernels.add_kernel.cache_key
    assert [p.name for p in k.params] == [p.name for p in kernels.add_kernel.params]


def test_heuristics_above_fastkernel_stays_native(stand_in):
    @triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
    @fastkernel
    @triton.jit
    def add_heuristic(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    x = torch.randn(100)
    for _ in range(3):
        add_heuristic[(1,)](x, x, x, 100)
    inner = add_heuristic.fn
    assert isinstance(inner, FastKernel)
    stats = inner.stats()
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    assert inner._compiled[0].src.constants[(4,)] == 128  # BLOCK from the heuristic
    assert len(stand_in.launches()) == 3


def test_single_config_autotune_above_fastkernel_stays_native(stand_in):
    @triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
    @fastkernel
    @triton.jit
    def add_tuned(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    x = torch.randn(256)
    for _ in range(3):
        add_tuned[lambda meta: (triton.cdiv(256, meta["BLOCK"]),)](x, x, x, 256)
    inner = add_tuned.fn
    assert inner.stats()["hits"] == 2 and inner.stats()["fallbacks"] == 0
    launches = stand_in.launches()
    assert [launch.grid for launch in launches] == [(4, 1, 1)] * 3
    assert launches[0].block == (64, 1, 1)  # the config's num_warps=2


@pytest.mark.parametrize(
    "decorator",
    [
        lambda f: triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])(f),
        lambda f: triton.heuristics({"BLOCK": lambda args: 64})(f),
    ],
    ids=["autotune", "heuristics"],
)
def test_fastkernel_above_triton_decorators_says_what_to_write(decorator):
    wrapped = decorator(kernels.add_kernel)
    with pytest.raises(TypeError, match=r"put @fastkernel directly above @triton.jit"):
        fastkernel(wrapped)


def test_fastkernel_as_a_constexpr_of_another_kernel(stand_in):
    helper = fastkernel(kernels.times_two)
    k = fastkernel(kernels.cast_kernel)
    src, out = torch.randn(64), torch.empty(64)
    k[(1,)](out, src, 64, OUT_DTYPE=tl.float32, FN=helper, BLOCK=64)
    k[(1,)](out, src, 64, OUT_DTYPE=tl.float32, FN=helper, BLOCK=64)
    assert k.stats()["hits"] == 1 and k.stats()["fallbacks"] == 0
    assert stand_in.launches()[0].params[:3] == [
        struct.pack("<Q", out.data_ptr()),
        struct.pack("<Q", src.data_ptr()),
        struct.pack("<i", 64),
    ]


def _gluon_copy(in_ptr, out_ptr, n, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    gl.store(out_ptr + offs, gl.load(in_ptr + offs, mask=mask), mask=mask)


@pytest.mark.parametrize("served_by", ["fastkernel.patch()", "@fastkernel"])
def test_a_gluon_kernel_compiles_and_launches_as_triton_does(
    served_by, stand_in, tmp_path, monkeypatch
):
    """Triton compiles a Gluon kernel (``gluon.jit``) from a ``GluonASTSource``, which gives the
    module the target, warp and CTA attributes its layouts need; the plain ``ASTSource`` fails on
    it. With Triton's own cache empty (both sources hash alike, so a binary Triton compiled
    would hide the difference), the native path compiles the binary Triton compiles and launches
    it as Triton does, then hits."""
    x, out = torch.randn(1024), torch.empty(1024)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache-native"))
    with fk.patched() if served_by == "fastkernel.patch()" else contextlib.nullcontext():
        kernel = gluon.jit(_gluon_copy)
        launched = fastkernel(kernel) if served_by == "@fastkernel" else kernel
        compiled = launched[(8,)](x, out, 1024, BLOCK=128)
        ours = stand_in.last_launch()
        launched[(8,)](x, out, 1024, BLOCK=128)
        stats = fk.stats()[f"{__name__}._gluon_copy"]
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 1, 0)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache-triton"))
    with TritonReference(stand_in, TEST_STREAM):
        tritons = gluon.jit(_gluon_copy)[(8,)](x, out, 1024, BLOCK=128)
        assert_same_launch(ours, stand_in.last_launch())
    assert type(compiled.src) is type(tritons.src)
    assert compiled.asm["cubin"] == tritons.asm["cubin"]


@pytest.mark.gpu
def test_torch_compile_fullgraph_captures_the_kernel():
    k = fastkernel(kernels.add_kernel)

    def f(x, y):
        out = torch.empty_like(x)
        k[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out

    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), x + y, rtol=0, atol=0)
    # Eager calls go through the native path; the compiled graph launches its own way.
    torch.testing.assert_close(f(x, y), x + y, rtol=0, atol=0)
    assert k.stats()["hits"] + k.stats()["misses"] >= 1


@pytest.mark.gpu
def test_wrap_triton_accepts_fastkernel():
    from torch.library import wrap_triton

    k = fastkernel(kernels.add_kernel)
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    wrap_triton(k)[(4,)](x, x, out, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, x + x)


@pytest.mark.gpu
def test_torch_compile_fullgraph_captures_an_autotuned_kernel():
    import fastkernel as fkmod

    k = fkmod.autotune(
        configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"]
    )(fastkernel(kernels.add_kernel))

    def f(x, y):
        out = torch.empty_like(x)
        k[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, out, x.numel())
        return out

    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), x + y, rtol=0, atol=0)
    torch.testing.assert_close(f(x, y), x + y, rtol=0, atol=0)  # eager: the native tuned path


class _StridedView:
    """An object Triton takes as a pointer argument for its ``data_ptr()`` method, as FlagGems'
    ``StridedBuffer`` (the strided view its generated pointwise kernels take): a tensor's storage
    from an element offset, with a torch dtype and device."""

    def __init__(self, base: torch.Tensor, offset: int = 0, dtype: object = None):
        self.base = base
        self.dtype = dtype if dtype is not None else base.dtype
        self.device = base.device
        self.reads = 0
        self._ptr = base.data_ptr() + offset * base.element_size()

    def data_ptr(self) -> int:
        self.reads += 1
        return self._ptr


@pytest.mark.parametrize("offset", [0, 1])  # 16-byte aligned, and not: two binaries
def test_an_object_with_data_ptr_launches_what_triton_launches_as_one_native_hit(stand_in, offset):
    k = fastkernel(kernels.add_kernel)
    tensors = [torch.randn(4097) for _ in range(3)]
    with TritonReference(stand_in, TEST_STREAM) as reference:
        for _ in range(2):  # new objects and addresses each time; the second call is a hit
            views = [_StridedView(t.clone(), offset) for t in tensors]
            theirs = reference.launch(kernels.add_kernel, (4,), *views, 4096, BLOCK=1024)
            k[(4,)](*views, 4096, BLOCK=1024)
            ours = stand_in.last_launch()
            assert ours.params[0] == struct.pack("<Q", views[0].data_ptr())
            assert_same_launch(ours, theirs)
    stats = k.stats()
    assert (stats["specializations"], stats["hits"], stats["fallbacks"]) == (1, 1, 0), stats


def test_an_object_with_data_ptr_shares_the_specialization_of_its_tensor(stand_in):
    """Triton specializes such an object as a tensor of its dtype and alignment
    (specialize.cc handle_tensor): the binary of the tensor call serves it, as a hit."""
    k = fastkernel(kernels.add_kernel)
    x, y, out = (torch.randn(4096) for _ in range(3))
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    k[(4,)](_StridedView(x), _StridedView(y), _StridedView(out), 4096, BLOCK=1024)
    first, second = stand_in.launches()
    assert first.image == second.image and first.params == second.params
    stats = k.stats()
    assert (stats["specializations"], stats["hits"], stats["fallbacks"]) == (1, 1, 0), stats


@pytest.mark.parametrize("what", ["a Triton dtype", "no device", "a data_ptr of -16"])
def test_an_object_the_native_key_cannot_read_goes_through_triton(stand_in, what):
    """An object whose dtype is not a torch.dtype (``triton.reinterpret``'s wrapper), with no
    device, or whose data_ptr() returns what Triton refuses: Triton's own path takes the call
    (and raises its own error for the last: it launches nothing), counted as a fallback naming
    the argument."""
    k = fastkernel(kernels.add_kernel)
    x, y, out = (torch.randn(4096) for _ in range(3))
    if what == "a Triton dtype":
        view: object = triton.reinterpret(x, tl.float32)
    elif what == "no device":
        view = _StridedView(x)
        del view.device
    else:
        view = _StridedView(x)
        view.data_ptr = lambda: -16  # type: ignore[method-assign]
    with TritonReference(stand_in, TEST_STREAM) as reference:
        if what == "a data_ptr of -16":
            with pytest.raises(OverflowError):
                reference.launch(kernels.add_kernel, (4,), view, y, out, 4096, BLOCK=1024)
            with pytest.raises(OverflowError):
                k[(4,)](view, y, out, 4096, BLOCK=1024)
            assert stand_in.launch_count() == 0 and k.stats()["hits"] == 0
            return
        theirs = reference.launch(kernels.add_kernel, (4,), view, y, out, 4096, BLOCK=1024)
        k[(4,)](view, y, out, 4096, BLOCK=1024)
        assert_same_launch(stand_in.last_launch(), theirs)
    stats = k.stats()
    assert stats["hits"] == 0 and stats["fallbacks"] == 1, stats
    (reason,) = stats["fallback_reasons"]
    assert "'x_ptr'" in reason, reason


def test_an_object_with_data_ptr_is_read_once_per_hit(stand_in):
    """Triton reads data_ptr() when it specializes and again when its launcher packs; the
    native hit reads it once (as it reads a tensor's), unless a launch hook runs between."""
    k = fastkernel(kernels.add_kernel)
    x, y, out = (torch.randn(4096) for _ in range(3))
    k[(4,)](x, y, out, 4096, BLOCK=1024)
    view = _StridedView(x)
    k[(4,)](view, y, out, 4096, BLOCK=1024)
    assert view.reads == 1 and k.stats()["hits"] == 1


@pytest.mark.parametrize("attribute", ["dtype", "data_ptr"])
def test_an_error_reading_an_object_with_data_ptr_propagates_once(stand_in, attribute):
    """What reading its dtype or calling its data_ptr() raises is the call's error, as from
    Triton, which reads both: raised where the native key reads them, not swallowed and read
    again by Triton's path (a KeyboardInterrupt must not be lost)."""

    class Raising(_StridedView):
        def __getattribute__(self, name):
            if name == attribute:
                type(self).raised += 1
                raise RuntimeError(f"reading {name}")
            return super().__getattribute__(name)

    Raising.raised = 0
    k = fastkernel(kernels.add_kernel)
    x, y, out = (torch.randn(4096) for _ in range(3))
    with pytest.raises(RuntimeError, match=f"reading {attribute}"):
        k[(4,)](Raising(x), y, out, 4096, BLOCK=1024)
    assert Raising.raised == 1 and stand_in.launch_count() == 0
    stats = k.stats()
    assert stats["hits"] == stats["fallbacks"] == 0, stats
