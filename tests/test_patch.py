"""fastkernel.patch(): every Triton kernel's launches served natively, byte for byte what Triton's
own launcher sends (compared on the recording stand-in), and Triton exactly as it was after
unpatch()."""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import importlib
import importlib.util
import inspect
import logging
import math
import os
import pathlib
import re
import subprocess
import sys
import threading
import weakref

import corpus
import kernels
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import TEST_STREAM
from test_corpus import triton_allocator_for_scratch  # noqa: F401 - a fixture used below
from triton.compiler.compiler import CompiledKernel
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction, KernelInterface
from triton_reference import TritonReference, assert_same_launch

import fastkernel
from fastkernel import _C
from fastkernel import _triton_abi as abi
from fastkernel import fastkernel as fk
from fastkernel.kernel import (
    COMPILED_GETITEM,
    COMPILED_KEYWORDS_REASON,
    COMPILED_LAUNCH_REASON,
    PATCH_ATTR,
    CompiledLaunch,
    NativeDispatch,
    WarmupHandle,
    tritons_own_launches,
)

patch_module = importlib.import_module("fastkernel.patch")  # fastkernel.patch is the function

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
N = 4096


def _triton_attributes():
    """Every attribute the patch touches, by identity."""
    cf = getattr(triton.runtime.jit, "ConstexprFunction", None)
    return {
        "JITFunction": dict(JITFunction.__dict__),
        "KernelInterface.__getitem__": KernelInterface.__dict__["__getitem__"],
        "Autotuner": dict(Autotuner.__dict__),
        "Heuristics": dict(Heuristics.__dict__),
        "CompiledKernel": dict(CompiledKernel.__dict__),
        "ConstexprFunction.__call__": cf.__dict__["__call__"] if cf else None,
    }


def _same_objects(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return a is b


@pytest.fixture
def patch_on():
    assert not fastkernel.is_patched()
    assert fastkernel.patch()
    yield
    fastkernel.unpatch()


def _tensors():
    return torch.randn(N), torch.randn(N), torch.empty(N)


@contextlib.contextmanager
def _triton_on_stand_in(stand_in, patched: bool):
    """Triton's own launcher on the stand-in, with the patch on or not."""
    with (
        fastkernel.patched() if patched else contextlib.nullcontext(),
        TritonReference(stand_in, TEST_STREAM),
    ):
        yield


def _stats_of(jit_fn):
    return jit_fn.__dict__[PATCH_ATTR].stats()


def test_unpatch_leaves_every_triton_object_as_it_was(stand_in):
    before = _triton_attributes()
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        # Triton fills a kernel's lazy attributes (its hash, the globals it read) on a launch.
        reference.launch(kernels.add_kernel, (4,), x, y, out, N, BLOCK=1024)
    kernel_dict = dict(kernels.add_kernel.__dict__)
    assert fastkernel.patch() and fastkernel.patch()  # idempotent
    assert _C.patch_slot_is_native(JITFunction)  # no Python frame between kernel[grid] and C
    kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert PATCH_ATTR in kernels.add_kernel.__dict__
    fastkernel.unpatch()
    fastkernel.unpatch()  # idempotent
    after = _triton_attributes()
    for name in before:
        assert _same_objects(before[name], after[name]), name
    assert not _C.patch_slot_is_native(JITFunction)
    assert kernels.add_kernel.__dict__.keys() == kernel_dict.keys()
    assert all(
        kernels.add_kernel.__dict__[k] is v or kernels.add_kernel.__dict__[k] == v
        for k, v in kernel_dict.items()
    )
    assert isinstance(kernels.add_kernel, JITFunction)


def test_kernels_made_before_and_after_the_patch_launch_natively(stand_in, patch_on):
    hits_before = fastkernel.stats().get("kernels.add_kernel", {"hits": 0})["hits"]
    made_after = JITFunction(kernels.add_kernel.fn)  # a new kernel, created under the patch
    table = {"add": kernels.add_kernel}  # a kernel held in a dict, as libraries do
    x, y, out = _tensors()
    for kernel in (kernels.add_kernel, made_after, table["add"]):
        for _ in range(3):
            kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert _stats_of(kernels.add_kernel) == {
        **_stats_of(kernels.add_kernel),
        "misses": 1,
        "hits": 5,
        "fallbacks": 0,
    }
    assert _stats_of(made_after)["hits"] == 2 and _stats_of(made_after)["fallbacks"] == 0
    assert len(stand_in.launches()) == 9
    names = fastkernel.stats()
    # Both objects, under module.qualname (other live kernels of that name are summed in too).
    assert names["kernels.add_kernel"]["hits"] - hits_before == 7


@pytest.mark.parametrize("style", ["tuple", "callable", "keywords", "num_warps", "run"])
def test_patched_launches_equal_triton_launches(style, stand_in):
    x, y, out = _tensors()
    grid = (4,) if style != "callable" else (lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),))
    extra = {"num_warps": 2} if style == "num_warps" else {}

    def call(kernel):
        if style == "keywords":
            return kernel[grid](x_ptr=x, y_ptr=y, out_ptr=out, n=N, BLOCK=1024)
        if style == "run":
            return kernel.run(x, y, out, N, BLOCK=1024, grid=grid, warmup=False)
        return kernel[grid](x, y, out, N, BLOCK=1024, **extra)

    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(kernels.add_kernel, (4,), x, y, out, N, BLOCK=1024, **extra)
    stand_in.reset()
    with fastkernel.patched():
        call(kernels.add_kernel)
        call(kernels.add_kernel)
        stats = _stats_of(kernels.add_kernel)
    ours = stand_in.launches()
    assert len(ours) == 2
    for launch in ours:
        assert_same_launch(launch, theirs)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 1, 0)


@pytest.mark.parametrize("name", list(corpus.CASES))
def test_every_corpus_case_launches_the_same_bytes_under_the_patch(
    name, stand_in, triton_allocator_for_scratch
):
    case = corpus.CASES[name]
    calls: list = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((self.kernel, grid, args, kwargs))
                reference.launch(self.kernel, grid, *args, **kwargs)

            return launch

    with TritonReference(stand_in, TEST_STREAM) as reference:
        case.run(corpus.wrap(case.kernel, Recorder), "cpu")
    theirs = stand_in.launches()
    stand_in.reset()
    with fastkernel.patched():
        for kernel, grid, args, kwargs in calls:  # the plain Triton kernels, as a library calls
            kernel[grid](*args, **kwargs)
        plain = case.kernel if isinstance(case.kernel, tuple) else (case.kernel,)
        stats = [_stats_of(k) for k in plain]
    ours = stand_in.launches()
    assert len(ours) == len(theirs) == len(calls)
    for mine, reference_launch in zip(ours, theirs):
        assert_same_launch(mine, reference_launch)
    for s in stats:
        assert s["fallbacks"] == 0 and s["misses"] >= 1, (name, s)


def test_triton_heuristics_launch_natively(stand_in, patch_on):
    heuristic = triton.heuristics({"BLOCK": lambda args: 512})(kernels.add_kernel)
    x, y, out = _tensors()
    for _ in range(3):
        heuristic[(8,)](x, y, out, N)
    stats = _stats_of(heuristic)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    launches = stand_in.launches()
    assert [(launch.block, launch.grid) for launch in launches] == [((128, 1, 1), (8, 1, 1))] * 3


def _timer(timings):
    """A ``do_bench`` for Triton's Autotuner: runs the benchmarked call once and reports the
    next of ``timings`` (ms), so which config Triton picks is known in advance."""
    it = iter(timings)

    def do_bench(kernel_call, quantiles=None, **_):
        kernel_call()
        t = next(it)
        return [t] * len(quantiles) if quantiles else t

    return do_bench


CONFIGS = [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=2)]


def _autotuned(timings, key=("n",), configs=CONFIGS, **kwargs):
    """Triton's own autotuner over a fresh JITFunction of add_kernel."""
    return triton.autotune(configs=configs, key=list(key), do_bench=_timer(timings), **kwargs)(
        _fresh_add_kernel()
    )


# Kernels made by a test live as long as the module's kernels do: a Triton CompiledKernel freed
# after the test needs an active Triton driver to unload its module, and the stand-in's is
# active only inside TritonReference.
_KEPT: list = []


def _fresh_add_kernel() -> JITFunction:
    jit_fn = JITFunction(kernels.add_kernel.fn)
    _KEPT.append(jit_fn)
    return jit_fn


def _triton_key(n, *tensors):
    """Triton's autotune key of an add_kernel call (runtime/autotuner.py, Autotuner.run)."""
    return (n, *(str(t.dtype) for t in tensors))


def test_a_tuned_call_of_triton_autotune_is_one_native_hit(stand_in):
    tuned = _autotuned([3.0, 1.0, 0.5, 2.0])  # n=N picks CONFIGS[1], n=N//2 picks CONFIGS[0]
    x, y, out = _tensors()
    grid = lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    best = []
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        assert _C.patch_slot_is_native(Autotuner)
        for n in (N, N, N, N // 2, N // 2, N, N // 2):
            tuned[grid](x, y, out, n)
            best.append(tuned.best_config)
        dispatch = tuned.__dict__[PATCH_ATTR]
        stats = dispatch.stats()
        names = fastkernel.stats()
    # Triton tuned each key once and chose what its timer said; every later call was a hit,
    # and best_config is, after every call, the config Triton's run would have set.
    assert tuned.cache == {
        _triton_key(N, x, y, out): CONFIGS[1],
        _triton_key(N // 2, x, y, out): CONFIGS[0],
    }
    assert best == [CONFIGS[i] for i in (1, 1, 1, 0, 0, 1, 0)]
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 5, 0)
    assert names["kernels.add_kernel [triton.autotune]"]["hits"] == 5
    launches = stand_in.launches()
    # One launch per call, and one per config benchmarked for each of the two keys.
    assert len(launches) == 7 + 2 * 2
    hit_n, hit_half = launches[4], launches[-1]
    assert (hit_n.block, hit_n.grid) == ((64, 1, 1), (N // 256, 1, 1))
    assert (hit_half.block, hit_half.grid) == ((128, 1, 1), (N // 2 // 1024, 1, 1))
    stand_in.reset()
    # Unpatched, Triton's Autotuner finds both keys in its cache and launches them itself.
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs_n = reference.launch(tuned, grid, x, y, out, N)
        theirs_half = reference.launch(tuned, grid, x, y, out, N // 2)
    assert_same_launch(hit_n, theirs_n)
    assert_same_launch(hit_half, theirs_half)


def test_triton_autotune_retunes_a_new_dtype_as_triton_does(stand_in):
    tuned = _autotuned([1.0, 2.0, 2.0, 1.0])
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x.double(), y.double(), out.double(), N)
        tuned[(4,)](x.double(), y.double(), out.double(), N)
        stats = tuned.__dict__[PATCH_ATTR].stats()
    x64 = x.double()
    assert tuned.cache == {
        _triton_key(N, x, y, out): CONFIGS[0],
        _triton_key(N, x64, x64, x64): CONFIGS[1],
    }
    assert tuned.best_config == CONFIGS[1]
    assert (stats["misses"], stats["hits"]) == (2, 1)


def test_a_call_triton_keys_otherwise_stays_on_triton_autotune(stand_in, caplog):
    # A tensor in the key (Triton keys it by identity): every call goes through Triton's run,
    # which re-tunes for each new tensor; the launches underneath are still native.
    tuned = _autotuned([1.0, 2.0] * 3, key=("x_ptr",))
    x, y, out = _tensors()
    with (
        fastkernel.patched(),
        TritonReference(stand_in, TEST_STREAM),
        caplog.at_level("WARNING", logger="fastkernel"),
    ):
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x.clone(), y, out, N)
        stats = tuned.__dict__[PATCH_ATTR].stats()
    assert len(tuned.cache) == 2  # x and its clone: two keys, as Triton keys them
    assert (stats["hits"], stats["fallbacks"]) == (0, 3)
    reason = "autotune key 'x_ptr' holds a tensor, which Triton keys by identity"
    assert stats["fallback_reasons"] == {reason: 3}
    assert reason in caplog.text and "add_kernel" in caplog.text


def test_a_kernel_the_native_path_cannot_take_keeps_tritons_path_and_says_why(
    stand_in, tmp_path, caplog
):
    """A kernel with more parameters than the native path takes: its dispatch cannot be built,
    so under the patch every launch takes Triton's own path (no error), is counted as a fallback
    with the reason in fastkernel.stats(), and the reason is logged once."""
    names = ", ".join(f"a{i}" for i in range(128))
    path = tmp_path / "fk_wide_kernel.py"
    path.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def wide_kernel(out_ptr, {names}, BLOCK: tl.constexpr):\n"
        "    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32) + a2)\n"
    )
    spec = importlib.util.spec_from_file_location("fk_wide_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = torch.empty(16)
    args = [out, *range(128)]
    with (
        fastkernel.patched(),
        TritonReference(stand_in, TEST_STREAM),
        caplog.at_level("WARNING", logger="fastkernel"),
    ):
        for _ in range(3):
            module.wide_kernel[(1,)](*args, BLOCK=16)
        stats = fastkernel.stats()["fk_wide_kernel.wide_kernel"]
    assert len(stand_in.launches()) == 3
    assert (stats["hits"], stats["fallbacks"]) == (0, 3)
    ((reason, count),) = stats["fallback_reasons"].items()
    assert count == 3 and "more than 128 parameters" in reason
    assert caplog.text.count("wide_kernel goes through Triton's own launcher") == 1
    assert "fk_wide_kernel.wide_kernel" not in fastkernel.stats()  # unpatched: record dropped


@triton.jit
def varargs_kernel(out_ptr, *vals, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(len(vals)):
        acc += vals[i]
    tl.store(out_ptr + tl.arange(0, BLOCK), acc)


@triton.jit
def keyword_only_kernel(out_ptr, a, *, b, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32) + a - b)


def _outcomes(stand_in, calls) -> list:
    """Each call's launch bytes, or the type of what it raised."""
    seen = []
    for call in calls:
        try:
            call()
            seen.append(bytes(stand_in.launches()[-1].raw))
        except Exception as exc:  # noqa: BLE001 - the type is the outcome compared
            seen.append(type(exc))
    return seen


def test_kernels_with_varargs_or_keyword_only_parameters_keep_tritons_path(stand_in):
    """The native binder binds parameters by position or by name; a ``*args`` or keyword-only
    parameter binds otherwise. Such a kernel launches through Triton under the patch (the same
    launches and the same errors as unpatched) and is refused by ``@fastkernel``."""
    out = torch.empty(16)
    calls = [
        lambda: varargs_kernel[(1,)](out, 5, BLOCK=16),
        lambda: varargs_kernel[(1,)](out, 1, 2, 3, BLOCK=16),
        lambda: varargs_kernel[(1,)](out, BLOCK=16),
        lambda: keyword_only_kernel[(1,)](out, 3, b=5, BLOCK=16),
        lambda: keyword_only_kernel[(1,)](out, 3, 5, 16),
        lambda: keyword_only_kernel[(1,)](out, 3, b=5, BLOCK=16),
    ]
    with TritonReference(stand_in, TEST_STREAM):
        unpatched = _outcomes(stand_in, calls)
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        patched = _outcomes(stand_in, calls)
    assert patched == unpatched
    # Triton 3.9 launches both kernels and refuses b by position; up to 3.8 it compiles
    # neither (CompilationError), and the patch then raises the same.
    if tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 9):
        kinds = [o if isinstance(o, type) else bytes for o in unpatched]
        assert kinds == [bytes, bytes, bytes, bytes, TypeError, bytes]
    for kernel, what in (
        (varargs_kernel, "*args parameter 'vals'"),
        (keyword_only_kernel, "keyword-only parameter 'b'"),
    ):
        with pytest.raises(TypeError, match=re.escape(what)):
            fastkernel.fastkernel(kernel)


def _noted(mapping: dict | None) -> list | None:
    """A mapping's items in order, a tensor by identity and data pointer."""
    if mapping is None:
        return None
    return [
        (k, (id(v), v.data_ptr()) if isinstance(v, torch.Tensor) else v) for k, v in mapping.items()
    ]


def _noting_pre_hook(seen: list, tag: int, autotuner: list):
    """A config ``pre_hook`` noting each dict it is called with, and the ``nargs`` of the
    autotuner in ``autotuner`` (when one is there) as the hook sees it."""

    def pre_hook(nargs):
        seen.append((tag, _noted(nargs)))
        if autotuner:
            seen.append(("nargs", _noted(autotuner[0].nargs)))

    return pre_hook


def _hooked_configs(seen: list, autotuner: list | None = None) -> list:
    autotuner = [] if autotuner is None else autotuner
    return [
        triton.Config({"BLOCK": 1024}, num_warps=4, pre_hook=_noting_pre_hook(seen, 0, autotuner)),
        triton.Config({"BLOCK": 256}, num_warps=2, pre_hook=_noting_pre_hook(seen, 1, autotuner)),
    ]


def test_a_config_pre_hook_is_called_as_tritons_run_calls_it_and_the_call_is_one_native_hit(
    stand_in,
):
    x, y, out = _tensors()
    grid = lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    calls = [
        lambda t: t[grid](x, y, out, N),
        lambda t: t[grid](x, y, out, N),
        lambda t: t[grid](x, y, out, n=N // 2),
        lambda t: t[(4,)](x, y, out_ptr=out, n=N // 2),
        lambda t: t[grid](x, y, out, N),
    ]
    runs = {}
    for patched in (False, True):
        seen: list = []
        holder: list = []
        configs = _hooked_configs(seen, holder)
        tuned = _autotuned([3.0, 1.0, 0.5, 2.0], configs=configs)
        holder.append(tuned)
        _KEPT.append(tuned)
        stand_in.reset()
        best = []
        with _triton_on_stand_in(stand_in, patched):
            for call in calls:
                call(tuned)
                best.append(configs.index(tuned.best_config))
            if patched:
                stats = _stats_of(tuned)
        runs[patched] = (seen, best, stand_in.launches())
    (seen, best, theirs), (our_seen, our_best, ours) = runs[False], runs[True]
    # Tuning called each config's hook once per benchmark (two keys, two configs); every call
    # then called its config's hook with the same dict, keys in Triton's order.
    assert [tag for tag, _ in seen if tag != "nargs"] == [0, 1, 1, 1, 0, 1, 0, 0, 1]
    # The autotuner's nargs, as each hook saw it, is the positional arguments by name.
    assert seen[-1] == ("nargs", _noted({"x_ptr": x, "y_ptr": y, "out_ptr": out, "n": N}))
    assert our_seen == seen
    assert tuned.nargs is None
    assert our_best == best == [1, 1, 0, 0, 1]
    assert len(ours) == len(theirs) == 5 + 2 * 2
    for mine, triton_launch in zip(ours, theirs):
        assert_same_launch(mine, triton_launch)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)


def test_a_config_pre_hook_removed_after_its_key_is_served_is_no_longer_called(stand_in):
    x, y, out = _tensors()
    runs = {}
    for patched in (False, True):
        seen: list = []
        configs = _hooked_configs(seen)[:1]
        tuned = _autotuned([], configs=configs)
        _KEPT.append(tuned)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched):
            tuned[(4,)](x, y, out, N)
            tuned[(4,)](x, y, out, N)
            configs[0].pre_hook = None  # Triton's run checks it on every call
            tuned[(4,)](x, y, out, N)
        runs[patched] = ([tag for tag, _ in seen], stand_in.launches())
    assert runs[True][0] == runs[False][0] == [0, 0]
    for mine, triton_launch in zip(runs[True][1], runs[False][1], strict=True):
        assert_same_launch(mine, triton_launch)


def test_a_config_pre_hook_key_puts_nothing_in_the_warm_index(stand_in):
    """The launch under a hooked key specializes on the arguments as the hook left them (here
    an fp16 output swapped in), which that key, taken before the hook, does not imply. Nothing
    of it may reach the warm index, where another autotuner of the kernel with the same values
    (in this or another process) would find it for an fp32 output."""
    x, y = torch.randn(N), torch.randn(N)

    def to_half(nargs):
        nargs["out_ptr"].data = torch.empty(N, dtype=torch.float16)

    hooked = _autotuned([], configs=[triton.Config({"BLOCK": 1024}, pre_hook=to_half)])
    plain = _autotuned([], configs=[triton.Config({"BLOCK": 1024})])
    _KEPT.extend((hooked, plain))
    out = torch.empty(N)
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for _ in range(2):
            hooked[(4,)](x, y, torch.empty(N), N)
        for _ in range(2):
            plain[(4,)](x, y, out, N)
        ours = stand_in.launches()[-2:]
        assert _stats_of(plain)["hits"] == 1
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(plain.fn, (4,), x, y, out, N, BLOCK=1024)
    for mine in ours:
        assert_same_launch(mine, theirs)


def test_a_config_pre_hook_that_changes_the_specialization_launches_tritons_binary(stand_in):
    """A hook that moves some outputs to an unaligned offset: Triton specializes the launch
    after the hook, so one key launches either binary, as the hook leaves the arguments."""
    x, y = torch.randn(N), torch.randn(N)
    outs = [torch.empty(N) for _ in range(3)]

    def unalign(nargs):
        out = nargs["out_ptr"]
        if out is not outs[1]:
            out.set_(out.untyped_storage(), 1, (N - 1,), (1,))

    configs = [triton.Config({"BLOCK": 1024}, num_warps=4, pre_hook=unalign)]
    runs = {}
    for patched in (False, True):
        tuned = _autotuned([], configs=configs)
        _KEPT.append(tuned)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched):
            for out in outs:
                out.set_(out.untyped_storage(), 0, (N,), (1,))  # aligned when called
                tuned[(4,)](x, y, out, N - 1)
            if patched:
                stats = _stats_of(tuned)
        runs[patched] = stand_in.launches()
    theirs, ours = runs[False], runs[True]
    assert len(ours) == len(theirs) == 3
    for mine, triton_launch in zip(ours, theirs):
        assert_same_launch(mine, triton_launch)
    assert (stats["misses"], stats["hits"]) == (1, 2)
    assert theirs[0].image == theirs[2].image != theirs[1].image


def test_passing_a_tuned_parameter_raises_what_triton_raises(stand_in):
    tuned = _autotuned([1.0, 2.0])
    x, y, out = _tensors()
    errors = []
    for on in (False, True):
        with _triton_on_stand_in(stand_in, patched=on):
            with pytest.raises(Exception) as info:
                tuned[(4,)](x, y, out, N, BLOCK=128)
            errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_an_autotuner_subclass_with_its_own_run_keeps_it(stand_in):
    seen = []

    class CachedAutotuner(Autotuner):
        def run(self, *args, **kwargs):
            seen.append(kwargs["grid"])
            return super().run(*args, **kwargs)

    jit_fn = _fresh_add_kernel()
    tuned = CachedAutotuner(
        jit_fn,
        jit_fn.arg_names,
        configs=CONFIGS[:1],
        key=["n"],
        reset_to_zero=None,
        restore_value=None,
    )
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for _ in range(3):
            tuned[(4,)](x, y, out, N)
        inner = _stats_of(jit_fn)
    assert seen == [(4,)] * 3 and tuned.__dict__.get(PATCH_ATTR) is None
    assert (inner["misses"], inner["hits"]) == (1, 2)  # the launch underneath is native


def _autotuner_with_own_run(seen: list):
    """A fresh ``Autotuner`` subclass whose ``run`` notes each call's grid, then calls Triton's
    (flash-linear-attention's ``CachedAutotuner`` has this shape: a lookup, then
    ``super().run``)."""

    class OwnRunAutotuner(Autotuner):
        def run(self, *args, **kwargs):
            seen.append(kwargs["grid"])
            return super().run(*args, **kwargs)

    return OwnRunAutotuner


def _own_run_autotuned(cls, timings):
    jit_fn = _fresh_add_kernel()
    tuned = cls(
        jit_fn,
        jit_fn.arg_names,
        configs=CONFIGS,
        key=["n"],
        reset_to_zero=None,
        restore_value=None,
        do_bench=_timer(timings),
    )
    _KEPT.append(tuned)
    return tuned


def test_a_registered_autotuner_subclass_is_one_native_hit(stand_in):
    """A subclass registered with ``fastkernel.register_autotuner`` runs its own ``run`` on the
    first call of each autotune key (which tunes through Triton's, under ``super().run``) and
    is one native hit after: the same launches, cache and ``best_config`` after every call as
    without the patch."""
    x, y, out = _tensors()
    ns = [N, N, N // 2, N, N // 2, N // 2, N]
    runs = {}
    for on in (False, True):
        seen: list = []
        cls = _autotuner_with_own_run(seen)
        fastkernel.register_autotuner(cls)
        tuned = _own_run_autotuned(cls, [3.0, 1.0, 0.5, 2.0])
        stand_in.reset()
        best = []
        with _triton_on_stand_in(stand_in, patched=on):
            for n in ns:
                tuned[(4,)](x, y, out, n)
                best.append(tuned.best_config)
            if on:
                stats = _stats_of(tuned)
        runs[on] = (stand_in.launches(), best, dict(tuned.cache), seen)
    (mine, my_best, my_cache, my_seen), (theirs, their_best, their_cache, their_seen) = (
        runs[True],
        runs[False],
    )
    assert len(mine) == len(theirs) == len(ns) + 2 * 2
    for ours, reference_launch in zip(mine, theirs):
        assert_same_launch(ours, reference_launch)
    assert my_best == their_best == [CONFIGS[i] for i in (1, 1, 0, 1, 0, 0, 1)]
    assert my_cache == their_cache and len(my_cache) == 2
    assert len(their_seen) == len(ns) and my_seen == [(4,)] * 2  # its run: the misses only
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 5, 0)


def test_a_registered_autotuner_subclass_called_by_its_run_runs_it_once_a_call(stand_in):
    """``autotuner.run(..., grid=, warmup=False)`` calls the class's own ``run``, whose
    ``super().run`` is the native dispatch: a miss there runs Triton's ``Autotuner.run``, not
    the class's again."""
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    fastkernel.register_autotuner(cls)
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        for _ in range(3):
            tuned.run(x, y, out, N, grid=(4,), warmup=False)
        stats = _stats_of(tuned)
    assert seen == [(4,)] * 3
    assert (stats["misses"], stats["hits"]) == (1, 2)


def _heuristics_over_own_run(cls, timings):
    """flash-linear-attention's stack over an autotuner of class ``cls``: Triton's heuristics
    (``HAS_Y`` from whether y is None) over it (``CONFIGS``, picked by ``timings``) over a fresh
    JITFunction of optional_add_kernel. Returns the autotuner and the heuristics."""
    jit_fn = JITFunction(kernels.optional_add_kernel.fn)
    tuned = cls(
        jit_fn, jit_fn.arg_names, CONFIGS, ["n", "HAS_Y"], None, None, do_bench=_timer(timings)
    )
    top = triton.heuristics({"HAS_Y": lambda args: args["y_ptr"] is not None})(tuned)
    _KEPT.extend((jit_fn, tuned, top))
    return tuned, top


def test_a_heuristics_over_a_registered_autotuner_subclass_is_one_native_hit(stand_in):
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    fastkernel.register_autotuner(cls)
    tuned, top = _heuristics_over_own_run(cls, [1.0] * 4)
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        for b in (y, None, y, None, y):
            top[_grid_by_block](x, b, out, N)
        stats = _stats_of(top)
    assert seen == [_grid_by_block] * 2 and PATCH_ATTR not in vars(tuned)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)


def _assign_run_on(cls):
    """Assigns a ``run`` on ``cls`` that calls the one there; returns the names it saw and how
    to take it away."""
    saved = cls.__dict__["run"]
    function = saved.function if hasattr(saved, "function") else saved
    calls: list = []

    def run(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return function(self, *args, **kwargs)

    type.__setattr__(cls, "run", run)
    return calls, lambda: type.__setattr__(cls, "run", saved)


@pytest.mark.parametrize("case", ["when says no", "run replaced", "Autotuner.run replaced"])
def test_a_registered_autotuner_subclass_keeps_its_run_where_it_may_not_serve(stand_in, case):
    """Its ``run`` runs on every call while its predicate says no for the object, while another
    ``run`` is on the class, or while another library's ``run`` is on Triton's ``Autotuner``
    (which its ``super().run`` reaches; once that is gone, the calls are native hits again)."""
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    fastkernel.register_autotuner(cls, when=lambda autotuner: case != "when says no")
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        if case == "when says no":
            assert vars(tuned)[PATCH_ATTR] is False
            assert len(seen) == 2
            return
        assert len(seen) == 1 and _stats_of(tuned)["hits"] == 1
        calls, restore = _assign_run_on(cls if case == "run replaced" else Autotuner)
        try:
            for _ in range(2):
                tuned[(4,)](x, y, out, N)
        finally:
            restore()
        tuned[(4,)](x, y, out, N)
        hits = _stats_of(tuned)["hits"]
    # Each call under the assigned run reached the class's own (both wrappers call what they
    # replaced), whose super().run went native; once it is gone, the class's run is skipped.
    assert calls == [cls.__name__] * 2 and len(seen) == 3
    assert hits == 4


def test_an_autotuner_subclass_registered_after_its_first_launch_is_served(stand_in):
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        tuned[(4,)](x, y, out, N)  # the patch refuses its class: not registered
        fastkernel.register_autotuner(cls)
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        stats = _stats_of(tuned)
    assert len(seen) == 2 and (stats["misses"], stats["hits"]) == (1, 1)


def _assign_wrapper_over_own_run(tuned, wrapped: list) -> None:
    """Assigns on ``tuned`` a ``run`` that notes each call's grid in ``wrapped``, then calls the
    ``run`` the object had (as a launch recorder wraps one)."""
    own = tuned.run

    def wrapper(*args, **kwargs):
        wrapped.append(kwargs["grid"])
        return own(*args, **kwargs)

    tuned.run = wrapper


def test_a_run_assigned_on_an_object_of_a_registered_subclass_is_called(stand_in):
    """``tuned.run = wrapper`` on an object of a registered class (whose own ``run`` Python
    finds before Triton's) drops its dispatch, as on Triton's classes: Triton's ``[grid]`` calls
    the wrapper until it is deleted, and the calls are native hits again after. ``unpatch()``
    leaves the class's own ``run`` function in place."""
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    fastkernel.register_autotuner(cls)
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    x, y, out = _tensors()
    wrapped: list = []
    run = cls.__dict__["run"]
    with _triton_on_stand_in(stand_in, patched=True):
        tuned[(4,)](x, y, out, N)
        _assign_wrapper_over_own_run(tuned, wrapped)
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        del tuned.run
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        stats = _stats_of(tuned)
    assert wrapped == [(4,)] * 2 and len(seen) == 3
    # Under the wrapper the object keeps Triton's path (its class's run, then Triton's, the
    # launch under it native); after it, its dispatch serves the key it registered first.
    assert (stats["misses"], stats["hits"]) == (1, 2)
    assert cls.__dict__["run"] is run


def test_registering_while_the_factory_refuses_the_class_serves_it(stand_in, monkeypatch):
    """A registration made while another thread's patch factory is refusing the class (it read
    the class unregistered) wins: the refusal is not remembered."""
    patch_module = importlib.import_module("fastkernel.patch")

    seen: list = []
    cls = _autotuner_with_own_run(seen)
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    served_for_now = patch_module._served_for_now

    def registered_meanwhile(of):
        answer = served_for_now(of)  # unregistered: the factory refuses the class
        if of is cls:
            fastkernel.register_autotuner(cls)  # another thread, before the refusal is noted
        return answer

    monkeypatch.setattr(patch_module, "_served_for_now", registered_meanwhile)
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        tuned[(4,)](x, y, out, N)
        monkeypatch.setattr(patch_module, "_served_for_now", served_for_now)
        for _ in range(3):
            tuned[(4,)](x, y, out, N)
        stats = _stats_of(tuned)
    # The first call: its class's run, whose super().run found the class registered (a miss).
    assert len(seen) == 1 and (stats["misses"], stats["hits"]) == (1, 3)


def test_a_heuristics_over_a_subclass_launched_before_its_registration_is_served(stand_in):
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    tuned, top = _heuristics_over_own_run(cls, [1.0] * 2)
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=True):
        top[_grid_by_block](x, y, out, N)  # its class's run, the launch under it native
        fastkernel.register_autotuner(cls)
        for _ in range(3):
            top[_grid_by_block](x, y, out, N)
        stats = _stats_of(top)
    assert len(seen) == 2 and (stats["misses"], stats["hits"]) == (1, 2)


def test_register_autotuner_checks_its_arguments():
    class NoRun(Autotuner):
        pass

    class OwnRun(Autotuner):
        def run(self, *args, **kwargs):
            return super().run(*args, **kwargs)

    class RunNone(Autotuner):
        run = None

    for cls in (JITFunction, 3):
        with pytest.raises(TypeError, match="argument 'cls' must be a subclass of Triton's"):
            fastkernel.register_autotuner(cls)
    with pytest.raises(TypeError, match="argument 'when' must be callable or None, not int"):
        fastkernel.register_autotuner(OwnRun, when=1)
    with pytest.raises(TypeError, match="argument 'cls'"):  # kind before value
        fastkernel.register_autotuner(3, when=1)
    with pytest.raises(TypeError, match="argument 'when'"):
        fastkernel.register_autotuner(NoRun, when=1)
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        fastkernel.register_autotuner(OwnRun, lambda autotuner: True)  # `when` is keyword-only
    with pytest.raises(ValueError, match="argument 'cls' is Triton's Autotuner itself"):
        fastkernel.register_autotuner(Autotuner)
    with pytest.raises(ValueError, match=r"argument 'cls' \(.*NoRun\) defines no run of its own"):
        fastkernel.register_autotuner(NoRun)
    with pytest.raises(ValueError, match=r"\(.*RunNone\) has a run that is not a function"):
        fastkernel.register_autotuner(RunNone)


def test_a_known_library_autotuner_is_served_only_with_its_modules_own_code():
    """flash-linear-attention's ``CachedAutotuner`` is known by name only while its ``run`` and
    ``should_check_fla_cache`` are the functions its module's source defines: a class of that
    name with code from elsewhere keeps its own run (tests/test_libraries.py checks the source
    digest on fla's own class)."""
    from fastkernel import _autotuner_classes

    class CachedAutotuner(Autotuner):
        def run(self, *args, **kwargs):
            return super().run(*args, **kwargs)

        def should_check_fla_cache(self, key):
            return True

    CachedAutotuner.__module__ = "fla.ops.utils.cache"
    CachedAutotuner.__qualname__ = "CachedAutotuner"
    assert _autotuner_classes.registration(CachedAutotuner) is None


@pytest.mark.parametrize("registered", [False, True], ids=["unregistered", "registered"])
def test_super_run_from_a_subclass_run_is_tritons_under_an_instance_run(stand_in, registered):
    """``super().run`` in a subclass's own ``run`` reads no instance attribute, with the patch's
    ``run`` attribute on ``Autotuner`` as without it: a wrapper assigned on the object that calls
    the object's own ``run`` does not recurse into itself."""
    seen: list = []
    cls = _autotuner_with_own_run(seen)
    if registered:
        fastkernel.register_autotuner(cls)
    tuned = _own_run_autotuned(cls, [1.0, 2.0])
    x, y, out = _tensors()
    wrapped: list = []
    with _triton_on_stand_in(stand_in, patched=True):
        tuned[(4,)](x, y, out, N)
        _assign_wrapper_over_own_run(tuned, wrapped)
        tuned[(4,)](x, y, out, N)
        tuned.run(x, y, out, N, grid=(2,), warmup=False)
    assert wrapped == [(4,), (2,)] and seen == [(4,), (4,), (2,)]
    assert len(stand_in.launches()) == 3 + 2  # and the first call's two configs timed


def test_autotune_over_heuristics_is_one_native_hit(stand_in):
    jit_fn = _fresh_add_kernel()
    tuned = triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n"])(
        triton.heuristics({"BLOCK": lambda args: 512})(jit_fn)
    )
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM) as reference:
        for _ in range(3):
            tuned[(8,)](x, y, out, N)
        stats = _stats_of(tuned)
        inner = _stats_of(jit_fn)  # Triton's Autotuner.run launched it on the miss
    launches = stand_in.launches()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(jit_fn, (8,), x, y, out, N, BLOCK=512, num_warps=4)
    assert len(launches) == 3
    for launch in launches:
        assert_same_launch(launch, theirs)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)
    assert (inner["misses"], inner["hits"]) == (1, 0)


def test_a_subclass_with_its_own_run_keeps_it(stand_in, patch_on):
    seen = []

    class Traced(JITFunction):
        def run(self, *args, grid, warmup, **kwargs):
            seen.append(grid)
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)

    traced = Traced(kernels.add_kernel.fn)
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        traced[(4,)](x, y, out, N, BLOCK=1024)
        traced.run(x, y, out, N, BLOCK=1024, grid=(4,), warmup=False)
    assert seen == [(4,), (4,)] and PATCH_ATTR not in traced.__dict__
    assert len(stand_in.launches()) == 2


def test_fastkernel_kernels_are_not_wrapped_twice(stand_in, patch_on):
    kernel = fk(kernels.add_kernel)
    x, y, out = _tensors()
    kernel[(4,)](x, y, out, N, BLOCK=1024)
    kernel[(4,)](x, y, out, N, BLOCK=1024)
    assert kernel.stats()["hits"] == 1 and PATCH_ATTR not in kernel.__dict__
    assert PATCH_ATTR not in kernels.add_kernel.__dict__  # its jit_function was not launched


def test_warmup_compiles_without_launching(stand_in, patch_on):
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
    assert compiled is not None and hasattr(compiled, "metadata")
    assert stand_in.launches() == []


def _tritons_runner(compiled, grid):
    """Triton's own runner of ``compiled`` (``CompiledKernel.__getitem__``), launching through
    Triton's own launcher object even under the patch, whose ``run`` is otherwise native."""

    def runner(*args, **kwargs):
        with tritons_own_launches():
            return COMPILED_GETITEM(compiled, grid)(*args, **kwargs)

    return runner


def _handle_stats(jit_fn) -> dict:
    return fastkernel.stats().get(
        f"{jit_fn.fn.__module__}.{jit_fn.fn.__qualname__} [compiled handle]"
    )


def _assert_two_native_handle_launches(stand_in, theirs) -> None:
    """add_kernel's handle launched twice after Triton's runner launched ``theirs``: a miss,
    then a hit, no fallback, both launches Triton's byte for byte."""
    stats = _handle_stats(kernels.add_kernel)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 1, 0)
    launches = stand_in.launches()
    assert len(launches) == 3
    for launch in launches[1:]:
        assert_same_launch(launch, theirs)


def test_a_launch_of_the_handle_warmup_returns_is_native(stand_in, patch_on):
    """Triton's fused-softmax tutorial launches ``kernel.warmup(...)[(n, 1, 1)](...)``, every
    argument passed, constexprs included: the binary the handle holds, launched natively, byte
    for byte as Triton's runner launches it; a repeat is a native hit."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        _tritons_runner(compiled, (4, 1, 1))(*args)  # Triton's own runner
        theirs = stand_in.last_launch()
        assert compiled[(4, 1, 1)](*args) is None  # as Triton's runner returns
        compiled[(4, 1, 1)](*args)
    _assert_two_native_handle_launches(stand_in, theirs)


def test_a_handle_launches_its_own_binary_whatever_the_arguments_specialization(stand_in, patch_on):
    """Triton's runner launches the handle's binary (here compiled for 16-byte aligned pointers
    and BLOCK=1024) with whatever arguments it is given, constexprs ignored; so does the native
    launch, where the kernel's own launch would pick another binary."""
    x, y, out = (torch.zeros(N + 4) for _ in range(3))
    aligned = (x[:N], y[:N], out[:N])
    shifted = (x[1 : N + 1], y[1 : N + 1], out[1 : N + 1])  # 4 bytes off: not 16-byte aligned
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(*aligned, N, BLOCK=1024, grid=(4,))
        theirs = []
        for tensors, block in ((aligned, 1024), (shifted, 1024), (shifted, 64)):
            _tritons_runner(compiled, (4, 1, 1))(*tensors, N, block)
            theirs.append(stand_in.last_launch())
            compiled[(4, 1, 1)](*tensors, N, block)
            assert_same_launch(stand_in.last_launch(), theirs[-1])
    assert theirs[1].params[0] != theirs[0].params[0]  # the shifted pointer, same binary
    assert len({launch.name for launch in theirs}) == 1
    stats = _handle_stats(kernels.add_kernel)
    assert stats["fallbacks"] == 0 and stats["specializations"] == 3  # three keys, one binary


def test_handle_launches_native_launch_does_not_take_go_to_tritons_runner_counted(
    stand_in, patch_on, caplog
):
    """A grid of four dims (Triton's runner reads the first three), ``stream=``, a launch hook:
    Triton's runner, counted as a fallback with the reason logged; a grid Triton's runner
    rejects raises its error, and a call with an argument missing raises TypeError, none of
    them counted. A list of three dims is native, as a tuple is."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    with (
        TritonReference(stand_in, TEST_STREAM),
        caplog.at_level("INFO", logger="fastkernel"),
    ):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        _tritons_runner(compiled, (4, 1, 1))(*args)
        theirs = stand_in.last_launch()
        compiled[[4, 1, 1]](*args)
        assert_same_launch(stand_in.last_launch(), theirs)
        assert _handle_stats(kernels.add_kernel)["fallbacks"] == 0
        compiled[(4, 1, 1, 1)](*args)
        assert_same_launch(stand_in.last_launch(), theirs)
        compiled[(4, 1, 1)](*args, stream=TEST_STREAM)
        assert_same_launch(stand_in.last_launch(), theirs)
        seen = []
        saved_hook = triton.knobs.runtime.launch_enter_hook
        triton.knobs.runtime.launch_enter_hook = lambda metadata: seen.append(metadata)
        try:
            compiled[(4, 1, 1)](*args)
        finally:
            triton.knobs.runtime.launch_enter_hook = saved_hook
        assert len(seen) == 1
        assert_same_launch(stand_in.last_launch(), theirs)
        launches = stand_in.launch_count()
        with pytest.raises(IndexError):
            compiled[(4, 1)](*args)  # Triton's runner reads grid[1] and grid[2]
        with pytest.raises(TypeError):
            compiled[(4, 1, 1)](x, y, out)  # a runtime argument missing
        assert stand_in.launch_count() == launches
    stats = _handle_stats(kernels.add_kernel)
    assert _stats_of(kernels.add_kernel)["fallbacks"] == 0  # counted as the handle's
    assert stats["fallback_reasons"] == {COMPILED_LAUNCH_REASON: 2, COMPILED_KEYWORDS_REASON: 1}
    assert COMPILED_KEYWORDS_REASON in caplog.text and COMPILED_LAUNCH_REASON in caplog.text


def test_a_handle_launch_may_stop_before_the_trailing_constexprs_as_tritons_runner_takes(
    stand_in, patch_on
):
    """From Triton 3.7 its launcher steps over a constexpr's position without reading an
    argument there, so a handle's launch may stop before the trailing constexprs (FlagGems'
    ``LibEntry`` launches its handles with the runtime arguments only): native, byte for byte
    Triton's runner's launch, a miss then hits, through ``compiled[grid]`` and through the
    handle's ``run``. Triton 3.5 and 3.6 parse every argument: both raise TypeError. A runtime argument left out is a TypeError naming it (Triton's launcher
    would read past its arguments), nothing launched."""
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        launches = stand_in.launch_count()
        with pytest.raises(TypeError, match="add_kernel missing required argument 'n'"):
            compiled[(4, 1, 1)](x, y, out)
        if abi.TRITON_VERSION < (3, 7):
            with pytest.raises(TypeError):
                _tritons_runner(compiled, (4, 1, 1))(x, y, out, N)
            with pytest.raises(TypeError, match="missing required argument 'BLOCK'"):
                compiled[(4, 1, 1)](x, y, out, N)
            assert stand_in.launch_count() == launches
            return
        assert stand_in.launch_count() == launches
        _tritons_runner(compiled, (4, 1, 1))(x, y, out, N)
        theirs = stand_in.last_launch()
        for _ in range(2):
            assert compiled[(4, 1, 1)](x, y, out, N) is None
            assert_same_launch(stand_in.last_launch(), theirs)
        run = compiled.run  # the launcher object launch caches keep (vLLM's CachedKernel)
        assert type(run) is _C.RunLauncher
        assert run(*_run_args(compiled), x, y, out, N) is None
        assert_same_launch(stand_in.last_launch(), theirs)
    stats = _handle_stats(kernels.add_kernel)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats


def test_a_handle_launch_through_tritons_runner_that_stops_before_a_runtime_argument_raises(
    stand_in, patch_on
):
    """A handle's launch whose arguments the native key does not cover goes to Triton's runner;
    one that also stops before a runtime parameter raises the TypeError naming it, as the native
    launch does, and launches nothing: Triton 3.7's launcher would read past the arguments
    (driver.c ``extractArgs`` does not count them), Triton 3.5 and 3.6's raises its own."""
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        launches = stand_in.launch_count()
        wrapped = triton.reinterpret(x, tl.float32)  # keyed by Triton's path only
        message = (
            "add_kernel missing required argument 'n'" if abi.TRITON_VERSION >= (3, 7) else None
        )
        with pytest.raises(TypeError, match=message):
            compiled[(4, 1, 1)](wrapped, y, out)
        assert stand_in.launch_count() == launches
        assert _handle_stats(kernels.add_kernel)["fallbacks"] == 0  # refused, not a fallback
        # n = 1 is specialized away: the binary's launcher reads nothing there from 3.7, so a
        # call through Triton's runner may stop before it, as Triton's own does.
        compiled = kernels.add_kernel.warmup(x, y, out, 1, BLOCK=1024, grid=(4,))
        if abi.TRITON_VERSION >= (3, 7):
            _tritons_runner(compiled, (4, 1, 1))(wrapped, y, out)
            theirs = stand_in.last_launch()
            compiled[(4, 1, 1)](wrapped, y, out)
            assert_same_launch(stand_in.last_launch(), theirs)


def test_a_handle_launch_may_stop_before_a_parameter_specialized_away_as_tritons_runner_takes(
    stand_in, patch_on
):
    """From Triton 3.7 a handle whose binary specialized its last runtime parameter away (an
    int of 1 becomes ``constexpr`` in ``src.signature``) launches natively from a call that
    stops before it, as Triton's runner does (its launcher reads nothing there), through
    ``compiled[grid]`` and the handle's ``run``: byte for byte Triton's launch, a miss then
    hits, no fallback. Triton 3.5 and 3.6 parse every argument:
    a TypeError naming it, nothing launched."""
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.add_kernel.warmup(x, y, out, 1, BLOCK=1024, grid=(4,))
        assert compiled.src.signature["n"] == "constexpr"
        launches = stand_in.launch_count()
        if abi.TRITON_VERSION < (3, 7):
            with pytest.raises(TypeError, match="missing required argument 'n'"):
                compiled[(4, 1, 1)](x, y, out)
            assert stand_in.launch_count() == launches
            return
        _tritons_runner(compiled, (4, 1, 1))(x, y, out)
        theirs = stand_in.last_launch()
        for _ in range(2):
            assert compiled[(4, 1, 1)](x, y, out) is None
            assert_same_launch(stand_in.last_launch(), theirs)
        assert compiled.run(*_run_args(compiled), x, y, out) is None
        assert_same_launch(stand_in.last_launch(), theirs)
        launches = stand_in.launch_count()
        with pytest.raises(TypeError, match="add_kernel missing required argument 'out_ptr'"):
            compiled[(4, 1, 1)](x, y)
        assert stand_in.launch_count() == launches
    stats = _handle_stats(kernels.add_kernel)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats


def test_a_handle_launch_with_a_tuple_longer_than_its_binarys_launches_as_tritons_runner(
    stand_in, patch_on
):
    """A handle launch whose tuple argument has more elements than the binary's tuple type:
    Triton's launcher reads each element by its position and steps over the extra one, while
    the native plan takes the flattened leaves in order (the extra one would land in the next
    tuple's slots: wrong bytes). It launches through Triton's runner, byte for byte Triton's
    launch, counted as a fallback naming the argument; a matching call stays native. Triton 3.5
    and 3.6's launcher parses each tuple to its exact length: both raise TypeError there."""
    out = torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.two_pairs_kernel.warmup(
            out, 2, (1.0, 2.0), (3.0, 4.0), BLOCK=64, grid=(1,)
        )
        if abi.TRITON_VERSION < (3, 7):
            launches = stand_in.launch_count()
            with pytest.raises(TypeError):
                _tritons_runner(compiled, (1, 1, 1))(out, 2, (1.0, 2.0, 9.0), (3.0, 4.0), 64)
            with pytest.raises(TypeError):
                compiled[(1, 1, 1)](out, 2, (1.0, 2.0, 9.0), (3.0, 4.0), 64)
            assert stand_in.launch_count() == launches
            return
        for args in [(out, 2, (1.0, 2.0, 9.0), (3.0, 4.0)), (out, 2, (1.0, 2.0), (3.0, 4.0, 9.0))]:
            _tritons_runner(compiled, (1, 1, 1))(*args)
            theirs = stand_in.last_launch()
            for _ in range(2):
                assert compiled[(1, 1, 1)](*args) is None
                assert_same_launch(stand_in.last_launch(), theirs)
        for _ in range(2):
            compiled[(1, 1, 1)](out, 2, (1.0, 2.0), (3.0, 4.0))
    stats = _handle_stats(kernels.two_pairs_kernel)
    # Each mismatched call misses (its key has no record) and falls back.
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (5, 1, 4), stats
    reasons = stats["fallback_reasons"]
    assert list(reasons) == [
        "a launch of a CompiledKernel whose argument 'a' has 3 elements where the binary's "
        "tuple type has 2: it launches through Triton's own launcher",
        "a launch of a CompiledKernel whose argument 'b' has 3 elements where the binary's "
        "tuple type has 2: it launches through Triton's own launcher",
    ], reasons


def test_a_handle_launch_with_a_tuple_where_its_binary_has_a_constexpr_launches_as_tritons_runner(
    stand_in, patch_on
):
    """A tuple passed where the binary's signature has ``constexpr`` (an int of 1 specialized
    away, as a parameter or a tuple element): Triton's launcher steps over that position, while
    the native key would give the tuple's elements leaf slots and shift every later tuple's
    leaves (wrong bytes). It launches through Triton's runner, byte for byte Triton's launch, as
    does a tuple that leaves out its trailing constexpr elements (Triton 3.7 and later, whose
    launcher reads nothing there; 3.5 and 3.6 parse each tuple to its exact length)."""
    out = torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        top = kernels.two_pairs_kernel.warmup(out, 1, (1.5, 2.0), (3.0, 4.0), BLOCK=64, grid=(1,))
        inner = kernels.two_pairs_kernel.warmup(out, 2, (1.5, 1), (3.0, 4.0), BLOCK=64, grid=(1,))
        assert top.src.signature["s"] == "constexpr"
        assert inner.src.signature["a"] == ("fp32", "constexpr")
        cases = [
            (top, (out, (7.0, 8.0), (1.5, 2.0), (3.0, 4.0), 64), "s"),
            (inner, (out, 2, (1.5, (5.0, 6.0)), (3.0, 4.0), 64), "a[1]"),
        ]
        if abi.TRITON_VERSION >= (3, 7):
            cases.append((inner, (out, 2, (1.5,), (3.0, 4.0)), "a"))
        for compiled, args, _ in cases:
            _tritons_runner(compiled, (1, 1, 1))(*args)
            theirs = stand_in.last_launch()
            for _ in range(2):
                assert compiled[(1, 1, 1)](*args) is None
                assert_same_launch(stand_in.last_launch(), theirs)
    stats = _handle_stats(kernels.two_pairs_kernel)
    assert (stats["hits"], stats["fallbacks"]) == (0, 2 * len(cases)), stats
    named = [re.search("argument '([^']*)'", reason)[1] for reason in stats["fallback_reasons"]]
    assert sorted(named) == sorted(name for *_, name in cases), stats


@pytest.mark.parametrize("keywords", [{}, {"stream": TEST_STREAM}], ids=["native", "runner"])
def test_a_handle_launch_with_a_tuple_its_launcher_would_read_past_raises(
    stand_in, patch_on, keywords
):
    """A tuple argument with fewer elements than the binary's tuple type, nested or not, or a
    tuple where the binary takes a scalar: TypeError naming the argument, nothing launched, on
    the native launch and where the call takes Triton's runner (``stream=``), whose launcher
    from Triton 3.7 reads past the tuple (``extractArgs`` does not count its elements)."""
    x, y, out = torch.randn(64), torch.randn(64), torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.tuple_kernel.warmup(
            out, (x, 2.0), 64, (1.5, (0.5, y)), BLOCK=64, grid=(1,)
        )
        launches = stand_in.launch_count()
        cases = [
            (
                (out, (x,), 64, (1.5, (0.5, y)), 64),
                "'pair': expected a tuple of 2 elements .*got 1",
            ),
            (
                (out, (x, 2.0), 64, (1.5, (0.5,)), 64),
                r"'nested\[1\]': expected a tuple of 2 .*got 1",
            ),
            ((out, (x, 2.0), 64, (1.5, 0.5), 64), r"'nested\[1\]': expected a tuple .*got float"),
            ((out, (x, 2.0), (64,), (1.5, (0.5, y)), 64), "'n': expected type i32 .*got a tuple"),
        ]
        for args, message in cases:
            with pytest.raises(TypeError, match=f"tuple_kernel: argument {message}"):
                compiled[(1, 1, 1)](*args, **keywords)
        assert stand_in.launch_count() == launches
        good = (out, (x, 2.0), 64, (1.5, (0.5, y)), 64)  # BLOCK too: Triton 3.5 and 3.6 parse it
        _tritons_runner(compiled, (1, 1, 1))(*good)
        theirs = stand_in.last_launch()
        compiled[(1, 1, 1)](*good, **keywords)
        assert_same_launch(stand_in.last_launch(), theirs)
    stats = _handle_stats(kernels.tuple_kernel)  # the refused calls are not fallbacks
    assert stats["fallbacks"] == (1 if keywords else 0), stats


@pytest.mark.parametrize("keywords", [{}, {"stream": TEST_STREAM}], ids=["native", "runner"])
def test_a_handle_launch_of_a_binary_with_descriptors_passes_what_triton_rebuilds(
    stand_in, patch_on, keywords, monkeypatch
):
    """Where the binary's signature holds a tensor descriptor, Triton rebuilds the arguments
    before its launcher (``make_tensordesc_args``, triton/backends/driver.py) and asserts that
    the argument list and each tuple on a descriptor's path have the signature's lengths (a
    mismatch aborts the process). A handle launch that stops early, passes more, gives a
    descriptor of another rank or a tuple of another length on a descriptor's path raises
    TypeError naming it: natively, through Triton's runner (``stream=``) and while a launch
    hook is set; nothing launched. The whole call launches as Triton's runner does."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setenv("FKSTUB_CAPABILITY", "90")
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    in_d = TensorDescriptor.from_tensor(src, [16, 32])
    out_d = TensorDescriptor.from_tensor(dst, [16, 32])
    rank_1 = TensorDescriptor.from_tensor(torch.randn(64), [16])
    newer = abi.TRITON_VERSION >= (3, 7)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.descriptor_copy_kernel.warmup(
            in_d, out_d, 2.0, BLOCK_M=16, BLOCK_N=32, grid=(1,)
        )
        cases = [
            ((in_d, out_d, 2.0), "descriptor_copy_kernel missing required argument 'BLOCK_M'"),
            ((in_d, out_d, 2.0, 16, 32, 7), "takes 5 arguments but 6 were given"),
            ((rank_1, out_d, 2.0, 16, 32), "'in_desc': expected a tensor descriptor of rank 2"),
        ]
        launches = stand_in.launch_count()
        saved_hook = triton.knobs.runtime.launch_enter_hook
        for hook in (None, lambda metadata: None):
            triton.knobs.runtime.launch_enter_hook = hook
            try:
                for args, message in cases:
                    exact = newer or "rank" in message  # else Triton 3.5/3.6 raise their own
                    with pytest.raises(TypeError, match=message if exact else None):
                        compiled[(1, 1, 1)](*args, **keywords)
            finally:
                triton.knobs.runtime.launch_enter_hook = saved_hook
        assert stand_in.launch_count() == launches
        _tritons_runner(compiled, (1, 1, 1))(in_d, out_d, 2.0, 16, 32)
        theirs = stand_in.last_launch()
        compiled[(1, 1, 1)](in_d, out_d, 2.0, 16, 32, **keywords)
        assert_same_launch(stand_in.last_launch(), theirs)
        if abi.TRITON_VERSION > (3, 7):  # descriptors inside tuples
            pair = (TensorDescriptor.from_tensor(src, [16, 16]), 32)
            compiled = kernels.descriptor_tuple_kernel.warmup(pair, dst, BLOCK=16, grid=(1,))
            launches = stand_in.launch_count()
            with pytest.raises(TypeError, match="'pair': expected a tuple of 2 .*got 3 elements"):
                compiled[(1, 1, 1)]((*pair, 7), dst, 16, **keywords)
            assert stand_in.launch_count() == launches


@pytest.mark.parametrize("keywords", [{}, {"stream": TEST_STREAM}], ids=["native", "runner"])
def test_a_handle_launch_takes_only_tuples_or_lists_for_a_tuple_and_reports_kinds_first(
    stand_in, patch_on, keywords
):
    """For a tuple type, Triton's launcher takes anything but a tuple or list through a
    temporary list it frees before reading the items (``PySequence_Fast``): a ``range`` there
    launches freed memory. A handle launch refuses it with TypeError naming the argument; and
    a call with a kind error (a float for a tuple) and an earlier value error (a short tuple)
    names the kind error first, as Python's order goes. Nothing launched."""
    out = torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.two_pairs_kernel.warmup(
            out, 2, (1000.0, 2000.0), (3.0, 4.0), BLOCK=64, grid=(1,)
        )
        launches = stand_in.launch_count()
        cases = [
            ((out, 2, range(100000, 100002), (3.0, 4.0), 64), "'a': expected .*got range"),
            ((out, 2, (1.0,), 5.0, 64), "'b': expected a tuple of 2 elements .*got float"),
        ]
        for args, message in cases:
            with pytest.raises(TypeError, match=f"two_pairs_kernel: argument {message}"):
                compiled[(1, 1, 1)](*args, **keywords)
        assert stand_in.launch_count() == launches


def test_a_handle_launch_takes_any_host_descriptor_class_and_a_list_on_a_descriptors_path(
    stand_in, patch_on, monkeypatch
):
    """A descriptor of a class other than Triton's own (a subclass here; Gluon's has its own)
    where the binary takes one, and a list for a tuple on a descriptor's path (Triton 3.8 and
    later): Triton rebuilds them as it does its own; the handle launch is Triton's runner's,
    byte for byte."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    class Descriptor(TensorDescriptor):
        pass

    monkeypatch.setenv("FKSTUB_CAPABILITY", "90")
    src, dst = torch.randn(64, 64), torch.empty(64, 64)
    in_d = Descriptor(**vars(TensorDescriptor.from_tensor(src, [16, 32])))
    out_d = TensorDescriptor.from_tensor(dst, [16, 32])
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.descriptor_copy_kernel.warmup(
            out_d, out_d, 2.0, BLOCK_M=16, BLOCK_N=32, grid=(1,)
        )
        calls = [(compiled, (in_d, out_d, 2.0, 16, 32))]
        if abi.TRITON_VERSION > (3, 7):  # descriptors inside tuples
            desc = TensorDescriptor.from_tensor(src, [16, 16])
            pair = kernels.descriptor_tuple_kernel.warmup((desc, 32), dst, BLOCK=16, grid=(1,))
            calls.append((pair, ([desc, 32], dst, 16)))
        for handle, args in calls:
            _tritons_runner(handle, (1, 1, 1))(*args)
            theirs = stand_in.last_launch()
            handle[(1, 1, 1)](*args)
            assert_same_launch(stand_in.last_launch(), theirs)


@pytest.mark.skipif(
    abi.TRITON_VERSION < (3, 7), reason="Triton 3.5 and 3.6 parse every argument themselves"
)
def test_every_handle_path_to_tritons_launcher_checks_what_it_would_read_past(stand_in, patch_on):
    """A kernel with a parameter named ``stream`` (whose handle launches always take Triton's
    runner), and ``run`` given its leading arguments as keywords (Triton's launcher takes
    them so, and then no kernel argument): the call that stops before a runtime parameter
    raises TypeError naming it, where Triton's launcher would read past its arguments."""
    x = torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        named = kernels.stream_named_kernel.warmup(x, 3, BLOCK=64, grid=(1,))
        compiled = kernels.add_kernel.warmup(x, x, x, N, BLOCK=64, grid=(1,))
        with tritons_own_launches():
            triton_run = compiled.run
        leading = list(inspect.signature(triton_run).parameters)[:9]
        launches = stand_in.launch_count()
        with pytest.raises(
            TypeError, match="stream_named_kernel missing required argument 'stream'"
        ):
            named[(1, 1, 1)](x)
        with pytest.raises(
            TypeError, match="stream_named_kernel missing required argument 'stream'"
        ):
            named.run(*_run_args(named), x)
        with pytest.raises(TypeError, match="add_kernel missing required argument 'x_ptr'"):
            compiled.run(**dict(zip(leading, _run_args(compiled, stream=TEST_STREAM + 16))))
        assert stand_in.launch_count() == launches
        named[(1, 1, 1)](x, 3)
        assert stand_in.launch_count() == launches + 1


def test_a_handle_launch_may_leave_out_only_what_follows_the_last_parameter_the_binary_reads():
    """omissible_from: the position after the last parameter the binary's signature reads (not
    ``constexpr``) from Triton 3.7; the parameter count (none left out) before, when the last
    parameter is a runtime one, or when the signature holds a tensor descriptor (Triton
    rebuilds the arguments to the signature's length)."""
    from fastkernel._handle_args import omissible_from

    newer = abi.TRITON_VERSION >= (3, 7)
    c = "constexpr"
    assert omissible_from(["*fp32", "i32", c, c]) == (2 if newer else 4)
    assert omissible_from(["*fp32", c, "i32"]) == 3  # a constexpr between: none
    assert omissible_from([c, c]) == (0 if newer else 2)
    assert omissible_from(["*fp32", ("*fp32", c), c]) == (2 if newer else 3)
    assert omissible_from(["*fp32", ("tensordesc<fp16[64, 64]>", "i32"), c]) == 3
    assert omissible_from([]) == 0


@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
def test_a_fastkernel_warmup_handle_launches_natively(stand_in, patched):
    """@fastkernel's warmup() handle, with or without the patch: the binary it holds, launched
    natively as Triton's runner launches it, counted once (as the handle's, not the kernel's)."""
    k = fk(kernels.add_kernel)
    x, y, out = _tensors()
    with (
        TritonReference(stand_in, TEST_STREAM),
        fastkernel.patched() if patched else contextlib.nullcontext(),
    ):
        handle = k.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        assert isinstance(handle, WarmupHandle) and isinstance(handle.compiled, CompiledKernel)
        assert handle.metadata is handle.compiled.metadata  # the CompiledKernel's attributes
        _tritons_runner(handle.compiled, (4, 1, 1))(x, y, out, N, 1024)
        theirs = stand_in.last_launch()
        handle[(4, 1, 1)](x, y, out, N, 1024)
        handle[(4, 1, 1)](x, y, out, N, 1024)
        plain = kernels.add_kernel.__dict__.get(PATCH_ATTR)
    stats = k.stats()
    assert stats["fallbacks"] == stats["hits"] == stats["misses"] == 0
    assert not plain or plain.stats()["fallbacks"] == 0
    _assert_two_native_handle_launches(stand_in, theirs)


def _python_handle_launches(monkeypatch) -> list:
    """The grids of the handle launches that take the Python path
    (``NativeDispatch._handle_launch``) from here on, in a list that grows as they happen."""
    calls: list = []
    handle_launch = NativeDispatch._handle_launch

    def counted(self, compiled, grid):
        calls.append(grid)
        return handle_launch(self, compiled, grid)

    monkeypatch.setattr(NativeDispatch, "_handle_launch", counted)
    return calls


def test_a_handles_later_launches_run_no_python(stand_in, monkeypatch):
    """After a handle's first native launch its launcher is remembered natively: the later
    launches of a @fastkernel WarmupHandle, and of its CompiledKernel under the patch, go from
    the handle's native subscript to the launcher without NativeDispatch._handle_launch (the
    Python path), with Triton's bytes. unpatch() forgets the launchers."""
    calls = _python_handle_launches(monkeypatch)
    k = fk(kernels.add_kernel)
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    with TritonReference(stand_in, TEST_STREAM):
        handle = k.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        _tritons_runner(handle.compiled, (4, 1, 1))(*args)
        theirs = stand_in.last_launch()
        for _ in range(3):
            handle[(4, 1, 1)](*args)
            assert_same_launch(stand_in.last_launch(), theirs)
        assert len(calls) == 1
        with fastkernel.patched():
            for grid in ((4, 1, 1), [4, 1, 1]):
                handle.compiled[grid](*args)
                assert_same_launch(stand_in.last_launch(), theirs)
        assert len(calls) == 1 and _C.handle_launcher(handle.compiled) is None
        handle[(4, 1, 1)](*args)  # forgotten at unpatch: the Python path makes another
        assert_same_launch(stand_in.last_launch(), theirs)
    assert len(calls) == 2 and isinstance(_C.handle_launcher(handle.compiled), CompiledLaunch)
    assert stand_in.launch_count() == 7


def test_every_dispatch_of_a_kernel_shares_a_handles_launcher(stand_in):
    """Two @fastkernel wrappers of one kernel get the same CompiledKernel from Triton's cache;
    its binary is loaded once, by the launcher the first launch made."""
    k1, k2 = fk(kernels.add_kernel), fk(kernels.add_kernel)
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    with TritonReference(stand_in, TEST_STREAM):
        h1 = k1.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        h2 = k2.warmup(x, y, out, N, BLOCK=1024, grid=(4,))
        assert h1.compiled is h2.compiled
        h1[(4, 1, 1)](*args)
        h2[(4, 1, 1)](*args)
    launcher = _C.handle_launcher(h1.compiled)
    assert isinstance(launcher, CompiledLaunch)
    assert (launcher.stats()["misses"], launcher.stats()["hits"]) == (1, 1)


def test_a_freed_handle_forgets_its_launcher(stand_in):
    """The native handle table holds a handle weakly: freeing the handle drops its entry and
    releases the launcher. A launcher that is not a Kernel, or a handle that cannot be weakly
    referenced, is refused with TypeError."""

    class Handle:
        pass

    k = fk(kernels.add_kernel)
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        compiled = k.warmup(x, y, out, N, BLOCK=1024, grid=(4,)).compiled
    launcher = CompiledLaunch.of(compiled, k)
    handle = Handle()
    before = _C.num_handle_launches()
    _C.remember_handle_launch(handle, launcher)
    assert _C.handle_launcher(handle) is launcher
    assert _C.num_handle_launches() == before + 1
    released = weakref.ref(launcher)
    del launcher, handle
    gc.collect()
    assert _C.num_handle_launches() == before and released() is None
    with pytest.raises(TypeError, match="must be a Kernel"):
        _C.remember_handle_launch(Handle(), object())
    with pytest.raises(TypeError, match="weak"):
        _C.remember_handle_launch(1, CompiledLaunch.of(compiled, k))
    assert _C.num_handle_launches() == before


@pytest.mark.parametrize("variable", ["TRITON_INTERPRET", "FASTKERNEL_DISABLE", "ROCm torch"])
def test_patch_is_a_logged_no_op_when_disabled(variable, monkeypatch, caplog):
    """Triton's interpreter, ``FASTKERNEL_DISABLE=1`` and a ROCm build of torch (whose "cuda"
    tensors Triton's HIP driver launches, where the native path has only the CUDA driver)
    leave Triton as it is."""
    before = _triton_attributes()
    if variable == "ROCm torch":
        monkeypatch.setattr(torch.version, "hip", "7.1.0", raising=False)
    else:
        monkeypatch.setenv(variable, "1")
    with caplog.at_level("INFO", logger="fastkernel"):
        assert fastkernel.patch() is False
    assert not fastkernel.is_patched()
    assert (variable if variable != "ROCm torch" else "ROCm build (HIP 7.1.0)") in caplog.text
    after = _triton_attributes()
    assert all(_same_objects(before[k], after[k]) for k in before)


@pytest.mark.parametrize("through", ["kernel", "handle"])
def test_unpatch_while_other_threads_launch(stand_in, through):
    """Threads launch the kernel (``kernel[grid]``) or its kept CompiledKernel handle
    (``compiled[grid]``, whose launchers unpatch() forgets) while the main thread patches and
    unpatches: every launch completes, none fails."""
    x, y, out = _tensors()
    stop = threading.Event()
    errors: list = []
    counts = [0] * 4
    compiled = None

    def launcher(i):
        try:
            while not stop.is_set():
                if through == "kernel":
                    kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
                else:
                    compiled[(4, 1, 1)](x, y, out, N, 1024)
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with TritonReference(stand_in, TEST_STREAM):
        # Compiled by Triton beforehand.
        compiled = kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
        threads = [threading.Thread(target=launcher, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for _ in range(50):
            fastkernel.patch()
            fastkernel.unpatch()
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert stand_in.launch_count() == 1 + sum(counts)  # launches() keeps the first 4096
    assert not fastkernel.is_patched() and PATCH_ATTR not in kernels.add_kernel.__dict__


def test_fallbacks_name_the_kernel_argument_type_and_reason(stand_in, patch_on, caplog):
    x, y, out = _tensors()

    class Opaque:
        pass

    with caplog.at_level("WARNING", logger="fastkernel"), TritonReference(stand_in, TEST_STREAM):
        kernels.constexpr_kernel[(1,)](out, SCALE=2.0, MODE=Opaque, BLOCK=64)
    reasons = fastkernel.stats()["kernels.constexpr_kernel"]["fallback_reasons"]
    (reason,) = reasons
    assert reason.startswith("argument 'MODE' of type type: a constexpr value")
    assert "constexpr_kernel" in caplog.text and "argument 'MODE'" in caplog.text


def _run_python(*args, env=None, cwd=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=600
    )


def test_fastkernel_patch_variable_patches_at_import():
    result = _run_python(
        "-c", "import fastkernel; print(fastkernel.is_patched())", env={"FASTKERNEL_PATCH": "1"}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_run_passes_argv_main_and_exit_status(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys, fastkernel\n"
        "print(__name__, sys.argv, fastkernel.is_patched())\n"
        "sys.exit(int(sys.argv[-1]))\n"
    )
    result = _run_python("-m", "fastkernel", "run", str(script), "-h", "--x", "7")
    assert result.returncode == 7, result.stderr
    assert result.stdout.strip() == f"__main__ ['{script}', '-h', '--x', '7'] True"
    (tmp_path / "progmod.py").write_text(script.read_text())
    result = _run_python(
        "-m",
        "fastkernel",
        "run",
        "-m",
        "progmod",
        "0",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("__main__ [") and result.stdout.strip().endswith("'0'] True")


#: A program that launches add_kernel three times on the stand-in, reporting whether it was
#: patched (tests/ on its path for the kernels and the stand-in's settings).
_LAUNCHING_PROGRAM = (
    "import sys\n"
    f"sys.path.insert(0, {str(HERE)!r})\n"
    "import conftest, torch\n"
    "import kernels\n"
    "from fastkernel import _C\n"
    "import fastkernel\n"
    "_C._testing.set_host_testing(True, 0, conftest.TEST_STREAM)\n"
    "x = torch.randn(4096)\n"
    "for _ in range(3):\n"
    "    kernels.add_kernel[(4,)](x, x, x, 4096, BLOCK=1024)\n"
    # One write of the whole line: torchrun's workers share one stdout, and with PYTHONUNBUFFERED
    # set print writes its items one by one, which can interleave with another worker's.
    "sys.stdout.write(f'child patched {fastkernel.is_patched()}\\n')\n"
    "sys.stdout.flush()\n"
)


def _run_with_stats(tmp_path, source: str):
    """``python -m fastkernel run --stats prog.py`` of a program with ``source``."""
    script = tmp_path / "prog.py"
    script.write_text(source)
    return _run_python("-m", "fastkernel", "run", "--stats", str(script))


@pytest.mark.stand_in
def test_run_stats_lists_every_kernel_that_launched(tmp_path):
    result = _run_with_stats(tmp_path, _LAUNCHING_PROGRAM)
    assert result.returncode == 0, result.stderr
    line = next(l for l in result.stderr.splitlines() if l.startswith("kernels.add_kernel"))
    assert line.split()[1:] == ["2", "1", "0"]  # hits, misses, fallbacks


def test_run_stats_table_is_one_write_with_its_newline(stand_in, monkeypatch):
    """Processes sharing one stderr (torchrun's workers) print their tables at exit together:
    each table reaches the stream in one write, its last newline included, so no table starts
    on another's last line (print writes the newline separately)."""
    from fastkernel import _run

    class Recorder:
        closed = False

        def __init__(self):
            self.writes: list[str] = []

        def write(self, text):
            self.writes.append(text)
            return len(text)

        def flush(self):
            pass

    x, y, out = _tensors()
    with fastkernel.patched():
        kernels.add_kernel[(4,)](x, y, out, N, BLOCK=1024)
    recorder = Recorder()
    monkeypatch.setattr(sys, "__stderr__", recorder)
    _run._print_stats(child=True)
    (table,) = recorder.writes
    assert table.startswith(f"fastkernel: process {os.getpid()} ") and table.endswith("\n")
    assert "kernels.add_kernel" in table


@pytest.mark.stand_in
def test_run_patches_the_python_processes_its_program_starts(tmp_path):
    """A subprocess running Python and a multiprocessing spawned child (torchrun's workers are
    the first kind) patch Triton when they import it, and with --stats print their own tables;
    a child that never imports Triton imports none of fastkernel, torch or Triton. Without the
    startup hook on their PYTHONPATH such children ran Triton unpatched."""
    child = tmp_path / "child.py"
    child.write_text(_LAUNCHING_PROGRAM)
    result = _run_with_stats(
        tmp_path,
        "import multiprocessing, subprocess, sys\n"
        "def spawned(queue):\n"
        "    import triton, fastkernel\n"
        "    queue.put(fastkernel.is_patched())\n"
        "if __name__ == '__main__':\n"
        f"    subprocess.run([sys.executable, {str(child)!r}], check=True)\n"
        "    light = ('triton', 'torch', 'fastkernel')\n"
        "    code = f'import sys; print(\"light\", [m in sys.modules for m in {light!r}])'\n"
        "    subprocess.run([sys.executable, '-c', code], check=True)\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        "    queue = ctx.Queue()\n"
        "    p = ctx.Process(target=spawned, args=(queue,))\n"
        "    p.start()\n"
        "    print('spawned patched', queue.get(), flush=True)\n"
        "    p.join()\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "child patched True",
        "light [False, False, False]",
        "spawned patched True",
    ]
    # The child's own table, under its header; the spawned child launched nothing and prints
    # none; the program's own table comes last and says it launched nothing.
    lines = result.stderr.splitlines()
    headers = [i for i, l in enumerate(lines) if l.startswith("fastkernel: process ")]
    assert len(headers) == 1, result.stderr
    assert lines[headers[0]].endswith("(child.py)")
    assert lines[headers[0] + 2].split() == ["kernels.add_kernel", "2", "1", "0"]
    assert lines[-1] == "fastkernel: no Triton kernel launched"


@pytest.mark.stand_in
def test_run_stats_of_multiprocessing_fork_and_forkserver_children(tmp_path):
    """multiprocessing's fork and forkserver children end with os._exit, which runs no exit
    handler: each that launched a kernel still prints its own --stats table (from
    multiprocessing's exit finalizers), counting only its own launches. A child forked after
    the program launched (a DataLoader worker) inherits its counters and launched nothing
    itself: it prints none."""
    result = _run_with_stats(
        tmp_path,
        "import sys, multiprocessing\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import conftest, torch, kernels\n"
        "from fastkernel import _C\n"
        "_C._testing.set_host_testing(True, 0, conftest.TEST_STREAM)\n"
        "def launch(times):\n"
        "    x = torch.randn(4096)\n"
        "    for _ in range(times):\n"
        "        kernels.add_kernel[(4,)](x, x, x, 4096, BLOCK=1024)\n"
        "def child(method, times):\n"
        "    p = multiprocessing.get_context(method).Process(target=launch, args=(times,))\n"
        "    p.start()\n"
        "    p.join()\n"
        "    print(method, times, p.exitcode, flush=True)\n"
        "if __name__ == '__main__':\n"
        "    child('fork', 2)\n"
        "    launch(3)\n"
        "    child('fork', 0)\n"
        "    child('forkserver', 5)\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["fork 2 0", "fork 0 0", "forkserver 5 0"]
    lines = result.stderr.splitlines()
    headers = [i for i, l in enumerate(lines) if l.startswith("fastkernel: process ")]
    assert [lines[i + 2].split() for i in headers] == [
        ["kernels.add_kernel", "1", "1", "0"],
        ["kernels.add_kernel", "4", "1", "0"],
    ], result.stderr
    assert lines[-1].split() == ["kernels.add_kernel", "2", "1", "0"], result.stderr


@triton.jit
def _fill_kernel(out_ptr, n: tl.int32, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32) + n)


def test_stats_since_counts_only_the_launches_after_its_snapshot(stand_in):
    """What a forked child's --stats table counts (kernel.stats_since): each kernel's launch
    counters and fallback reasons less those of the snapshot; a kernel made after it counts
    from zero; what kernels hold (specializations) is not a launch count."""
    from fastkernel.kernel import counters_now, stats_since

    out = torch.empty(16)
    k = fk(_fill_kernel)
    with TritonReference(stand_in, TEST_STREAM):  # the fallbacks launch through Triton
        k[(1,)](out, 3, BLOCK=16)
        k[(1,)](out, torch.tensor(3), BLOCK=16)  # a one-element tensor: a fallback
        before, k_before = counters_now(), k.stats()
        k[(1,)](out, 3, BLOCK=16)
        k[(1,)](out, torch.tensor(3), BLOCK=16)
        late = fk(_fill_kernel)  # the same name: merged
        late[(1,)](out, 3, BLOCK=16)
    name = k._stats_name()
    total, since = fastkernel.stats()[name], stats_since(before)[name]
    ((reason, count),) = total["fallback_reasons"].items()
    assert "one-element tensor" in reason and count == 2
    assert (total["hits"], total["fallbacks"], total["specializations"]) == (1, 2, 2)
    assert k_before["fallbacks"] == 1 and k_before["hits"] == 0
    for counter in ("hits", "misses", "fallbacks", "evictions"):
        assert since[counter] == total[counter] - k_before[counter], counter
    assert since["specializations"] == total["specializations"]
    assert since["fallback_reasons"] == {reason: 1}
    del before
    assert stats_since(counters_now())[name]["fallback_reasons"] == {}


@pytest.mark.stand_in
def test_run_patches_torchrun_workers(tmp_path):
    """`python -m fastkernel run -m torch.distributed.run --nproc_per_node 2 worker.py`: each
    worker torchrun starts is patched and prints its own --stats table."""
    worker = tmp_path / "worker.py"
    worker.write_text(_LAUNCHING_PROGRAM)
    result = _run_python(
        "-m",
        "fastkernel",
        "run",
        "--stats",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "0",
        str(worker),
        env={"OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["child patched True"] * 2
    lines = result.stderr.splitlines()
    headers = [i for i, l in enumerate(lines) if l.startswith("fastkernel: process ")]
    assert len(headers) == 2 and all(lines[i].endswith("(worker.py)") for i in headers)
    assert [lines[i + 2].split() for i in headers] == [["kernels.add_kernel", "2", "1", "0"]] * 2


def test_the_startup_hook_waits_for_torch_when_torch_imports_triton():
    """torch may import Triton while it initializes: the hook patches only once torch has
    finished too (fastkernel imports torch), and once."""
    hook = ROOT / "python" / "fastkernel" / "_startup" / "sitecustomize.py"
    code = (
        "import importlib.util, sys, types\n"
        "import torch, triton, fastkernel\n"
        f"spec = importlib.util.spec_from_file_location('fk_hook', {str(hook)!r})\n"
        "hook = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(hook)\n"
        "finder = hook._PatchWhenTritonIsImported()\n"
        "torch.__spec__._initializing = True\n"
        "finder.module_finished('triton')\n"
        "print(fastkernel.is_patched())\n"
        "finder.module_finished('torch')\n"
        "print(fastkernel.is_patched())\n"
        "fastkernel.unpatch()\n"
        "finder.module_finished('torch')\n"
        "print(fastkernel.is_patched())\n"
    )
    result = _run_python("-c", code, env={"FASTKERNEL_PATCH": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "False"]


def _startup_env(*extra_path: pathlib.Path, stats: bool = False) -> dict[str, str]:
    """The environment the runner gives the processes its program starts."""
    hook = pathlib.Path(fastkernel.__file__).parent / "_startup"
    env = {
        "PYTHONPATH": os.pathsep.join(str(p) for p in (hook, *extra_path)),
        "FASTKERNEL_PATCH": "1",
    }
    if stats:
        env["FASTKERNEL_RUN_STATS"] = "1"
    return env


_PATCHED_AFTER_IMPORT = (
    "import sys, triton, fastkernel\n"
    "finders = [f for f in sys.meta_path if getattr(f, 'fastkernel_startup_hook', False)]\n"
    "print(fastkernel.is_patched(), len(finders))\n"
)


def test_the_startup_hook_installs_once_and_runs_no_other_startup_hook(tmp_path):
    """Two startup hooks on PYTHONPATH (a nested runner, another fastkernel, one directory under
    two spellings), or a hook imported again after a user sitecustomize raised: one finder, no
    hook running another as the sitecustomize it shadows. Each case raised RecursionError."""
    hook = pathlib.Path(fastkernel.__file__).parent / "_startup"
    other = tmp_path / "other" / "fastkernel" / "_startup"
    other.mkdir(parents=True)
    (other / "sitecustomize.py").write_text((hook / "sitecustomize.py").read_text())
    alias = tmp_path / "alias"
    alias.symlink_to(hook)
    for extra in (other, alias):
        result = _run_python("-c", _PATCHED_AFTER_IMPORT, env=_startup_env(extra))
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "0"]  # patched; the finder left when done
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('user sitecustomize failed')\n")
    code = "import sys\ntry:\n    import sitecustomize\nexcept RuntimeError:\n    pass\n"
    result = _run_python("-c", code + _PATCHED_AFTER_IMPORT, env=_startup_env(user))
    assert result.returncode == 0, result.stderr
    assert "user sitecustomize failed" in result.stderr  # reported by site, as without the hook
    assert result.stdout.split() == ["True", "0"]


def test_the_startup_hook_leaves_triton_and_torch_loaders_whole():
    """find_spec before the import (torch asks it of Triton) returns the loader's wrapper; it
    keeps the loader's other methods (pkgutil.get_data read nothing through it), and the
    imported module has its own loader."""
    code = (
        "import importlib.util, pkgutil, sys\n"
        "spec = importlib.util.find_spec('torch')\n"
        "print(len(pkgutil.get_data('torch', 'version.py')) > 0, spec.loader.is_package('torch'))\n"
        "import torch, triton\n"
        "print(type(torch.__loader__).__name__, type(triton.__spec__.loader).__name__)\n"
    )
    result = _run_python("-c", code, env=_startup_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "SourceFileLoader", "SourceFileLoader"]


def test_the_startup_hook_patches_when_triton_was_imported_before_it():
    """Triton imported before the hook is installed (a .pth file, another sitecustomize) and
    torch not yet: patched at once. It was never patched."""
    hook = pathlib.Path(fastkernel.__file__).parent / "_startup" / "sitecustomize.py"
    code = (
        "import importlib.util, sys\n"
        "import triton\n"
        "assert 'torch' not in sys.modules\n"
        f"spec = importlib.util.spec_from_file_location('fk_hook', {str(hook)!r})\n"
        "hook = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(hook)\n"
        "patched = 'fastkernel' in sys.modules and sys.modules['fastkernel'].is_patched()\n"
        "print(patched)\n"
    )
    result = _run_python("-c", code, env={"FASTKERNEL_PATCH": "1", "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]


def test_run_keeps_the_sitecustomize_its_startup_hook_shadows(tmp_path):
    """The startup hook goes first on the children's PYTHONPATH; a sitecustomize the user's
    PYTHONPATH already had still runs in them, as the interpreter would have run it."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("MARK = 'user sitecustomize ran'\n")
    script = tmp_path / "prog.py"
    script.write_text(
        "import subprocess, sys\n"
        "code = 'import sitecustomize; print(sitecustomize.MARK)'\n"
        "subprocess.run([sys.executable, '-c', code], check=True)\n"
    )
    result = _run_python("-m", "fastkernel", "run", str(script), env={"PYTHONPATH": str(user)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "user sitecustomize ran"


# -- host helpers: triton.cdiv, triton.next_power_of_2 and other constexpr functions ------------


@triton.constexpr_function
def _scaled(x, scale=2):
    return x * scale


def _outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared, type and message
        return ("raised", type(exc), str(exc))


HELPER_CALLS = [
    (triton.cdiv, (4096, 1024), {}),
    (triton.cdiv, (4097, 1024), {}),
    (triton.cdiv, (-7, 2), {}),
    (triton.cdiv, (7, -2), {}),
    (triton.cdiv, (0, 5), {}),
    (triton.cdiv, (1, 0), {}),
    (triton.cdiv, (2**70, 3), {}),
    (triton.cdiv, (True, 1), {}),
    (triton.cdiv, (7.0, 2), {}),
    (triton.cdiv, (tl.constexpr(4096), 1024), {}),
    (triton.cdiv, (), {"x": 10, "y": 3}),
    (triton.cdiv, ("a", 2), {}),
    (triton.cdiv, (1,), {}),
    (triton.cdiv, (1, 2, 3), {}),
    (triton.next_power_of_2, (1000,), {}),
    (triton.next_power_of_2, (1,), {}),
    (triton.next_power_of_2, (0,), {}),
    (triton.next_power_of_2, (-5,), {}),
    (triton.next_power_of_2, (2**62,), {}),
    (triton.next_power_of_2, (2**62 + 1,), {}),
    (triton.next_power_of_2, (tl.constexpr(33),), {}),
    (triton.next_power_of_2, (3.5,), {}),
    (triton.next_power_of_2, (), {"n": 17}),
    (_scaled, (3,), {}),
    (_scaled, (3,), {"scale": 5}),
    (_scaled, (tl.constexpr(3),), {"scale": tl.constexpr(4)}),
]


def test_host_helpers_return_and_raise_what_triton_does():
    expected = [_outcome(fn, *a, **kw) for fn, a, kw in HELPER_CALLS]
    assert fastkernel.patch_host_helpers()
    try:
        got = [_outcome(fn, *a, **kw) for fn, a, kw in HELPER_CALLS]
        for v in range(-300, 300):
            for d in (1, 2, 3, 7, 16, 1024, -1, -5):
                assert triton.cdiv(v, d) == triton.cdiv.fn(v, d)
            if v > 0:
                assert triton.next_power_of_2(v) == triton.next_power_of_2.fn(v)
    finally:
        fastkernel.unpatch_host_helpers()
    for call, e, g in zip(HELPER_CALLS, expected, got):
        assert e == g and type(e[-1]) is type(g[-1]), call


def test_host_helpers_keep_the_code_generators_constexpr():
    cf = triton.runtime.jit.ConstexprFunction
    original = cf.__dict__["__call__"]
    with fastkernel.patched():
        assert cf.__dict__["__call__"] is not original
        # With _semantic (Triton's code generator), Triton's own __call__ runs: a constexpr.
        result = triton.cdiv(tl.constexpr(10), 4, _semantic=object())
        assert isinstance(result, tl.constexpr) and result.value == 3
    assert cf.__dict__["__call__"] is original


@pytest.mark.parametrize(
    "version, ok",
    [
        ("3.5.1", True),
        ("3.9.0", True),
        ("3.6.0+git1", True),
        ("3.4.0", False),
        ("3.10.0", False),
        ("4.0.0", False),
        ("nightly", False),
    ],
)
def test_an_unsupported_triton_is_named_at_import(version, ok):
    if ok:
        fastkernel._check_triton_version(version)
    else:
        expected = (
            "cannot read Triton's version"
            if version == "nightly"
            else rf"supports Triton 3\.5 to 3\.9, but Triton {re.escape(version)} is installed"
        )
        with pytest.raises(ImportError, match=expected):
            fastkernel._check_triton_version(version)


class _Size(enum.IntEnum):
    N = N
    COLS = 64


class _Mode(str, enum.Enum):
    SINGLE = "single"


# Values Triton accepts that are not plain int / float / bool, each as (kernel, grid, args,
# kwargs): Triton specializes an IntEnum as the int it is and a float subclass as fp32, and
# compiles a numpy scalar or enum constexpr as the object itself.
_VALUE_CASES = {
    "intenum_runtime": (kernels.add_kernel, (4,), lambda: (*_tensors(), _Size.N), {"BLOCK": 1024}),
    "numpy_float64_runtime": (
        kernels.fused_add_rmsnorm_kernel,
        (2,),
        lambda: (
            torch.randn(128),
            torch.randn(128),
            torch.randn(64),
            torch.empty(128),
            _Size.COLS,
            np.float64(1e-6),
        ),
        {"BLOCK": 64},
    ),
    "numpy_int_constexpr": (
        kernels.flag_kernel,
        (1,),
        lambda: (torch.empty(16),),
        {"FLAG": np.int64(3), "BLOCK": 16},
    ),
    "numpy_float_constexpr": (
        kernels.flag_kernel,
        (1,),
        lambda: (torch.empty(16),),
        {"FLAG": np.float32(1.5), "BLOCK": 16},
    ),
    "float_subclass_constexpr": (
        kernels.constexpr_kernel,
        (1,),
        lambda: (torch.empty(16),),
        {"SCALE": np.float64(1.5), "MODE": "double", "BLOCK": 16},
    ),
    "intenum_constexpr": (
        kernels.constexpr_kernel,
        (1,),
        lambda: (torch.empty(64),),
        {"SCALE": 2, "MODE": "single", "BLOCK": _Size.COLS},
    ),
}


@pytest.mark.parametrize("case", list(_VALUE_CASES))
def test_every_value_triton_accepts_stays_native(case, stand_in):
    kernel, grid, make_args, kwargs = _VALUE_CASES[case]
    args = make_args()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(kernel, grid, *args, **kwargs)
    stand_in.reset()
    with fastkernel.patched():
        kernel[grid](*args, **kwargs)
        kernel[grid](*args, **kwargs)
        stats = _stats_of(kernel)
    for launch in stand_in.launches():
        assert_same_launch(launch, theirs)
    assert (stats["hits"], stats["fallbacks"]) == (1, 0) and stats["misses"] >= 1


def test_typed_constexprs_key_apart_from_plain_numbers(stand_in):
    out = torch.empty(16)
    with fastkernel.patched():
        for flag in (3, np.int64(3), np.int32(3), 3.0, np.float64(3.0), np.float32(3.0)):
            kernels.flag_kernel[(1,)](out, FLAG=flag, BLOCK=16)
            kernels.flag_kernel[(1,)](out, FLAG=flag, BLOCK=16)
        stats = _stats_of(kernels.flag_kernel)
        assert (stats["specializations"], stats["hits"], stats["fallbacks"]) == (6, 6, 0)


def test_a_value_triton_rejects_gets_tritons_error_and_is_no_fallback(stand_in):
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM):
        with pytest.raises(Exception) as theirs:
            kernels.add_kernel[(4,)](x, y, out, np.int64(N), BLOCK=1024)
        with fastkernel.patched():
            with pytest.raises(type(theirs.value), match=re.escape(str(theirs.value))):
                kernels.add_kernel[(4,)](x, y, out, np.int64(N), BLOCK=1024)
            stats = _stats_of(kernels.add_kernel)
    assert stats["fallbacks"] == 0 and stats["fallback_reasons"] == {}


_KNOB_METHODS = """
from triton import knobs
def knob_methods():
    return [(c.__dict__.get("__setattr__"), c.__dict__.get("__delattr__"))
            for c in (type(knobs.runtime), type(knobs.compilation))]
"""


def test_importing_fastkernel_leaves_triton_as_it_was_and_unpatch_restores_it():
    # In a fresh process: the knob classes' methods change only at patch() or the first kernel,
    # and unpatch() gives back the same objects when no kernel outside the patch needs them.
    code = _KNOB_METHODS + (
        "from triton.runtime.jit import JITFunction\n"
        "before, jit_before = knob_methods(), dict(JITFunction.__dict__)\n"
        "import fastkernel\n"
        "assert knob_methods() == before, 'import changed them'\n"
        "fastkernel.patch()\n"
        "assert knob_methods() != before, 'patch() did not install the notifications'\n"
        "assert 'debug' in JITFunction.__dict__, 'patch() did not install the debug watch'\n"
        "fastkernel.unpatch()\n"
        "after = knob_methods()\n"
        "assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(after, before)), after\n"
        "jit_after = dict(JITFunction.__dict__)\n"
        "assert jit_after.keys() == jit_before.keys(), jit_after.keys() ^ jit_before.keys()\n"
        "assert all(jit_after[k] is jit_before[k] for k in jit_after)\n"
        "print('ok')\n"
    )
    result = _run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_decorated_kernel_keeps_the_knob_notifications_past_unpatch(tmp_path):
    # A @fastkernel kernel outlives the patch: knob assignments must still reach its keys.
    module = tmp_path / "kernels_mod.py"
    module.write_text("import triton\n\n@triton.jit\ndef k(x):\n    pass\n")
    code = _KNOB_METHODS + (
        "import fastkernel, kernels_mod\n"
        "before = knob_methods()\n"
        "fastkernel.patch()\n"
        "fastkernel.fastkernel(kernels_mod.k)\n"
        "fastkernel.unpatch()\n"
        "assert knob_methods() != before\n"
        "print('ok')\n"
    )
    result = _run_python("-c", code, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _grid_by_block(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _launches_by_n(stand_in, heuristic) -> tuple[list, dict]:
    """``heuristic`` over the add kernel called with n = N, N/2, N, N/2, N under the patch, each
    launch checked against Triton's for its n; the launches and the dispatch's counters."""
    _KEPT.append(heuristic)
    x, y, out = _tensors()
    calls = (N, N // 2, N, N // 2, N)
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = {n: reference.launch(heuristic, _grid_by_block, x, y, out, n) for n in (N, N // 2)}
    stand_in.reset()
    with fastkernel.patched():
        for n in calls:
            heuristic[_grid_by_block](x, y, out, n)
        stats = _stats_of(heuristic)
    ours = stand_in.launches()
    assert len(ours) == len(calls)
    for n, launch in zip(calls, ours):
        assert_same_launch(launch, theirs[n])
    return ours, stats


def test_a_call_of_triton_heuristics_is_one_native_hit(stand_in):
    # BLOCK follows n, so n joins the key by value; each launch is the one Triton makes.
    heuristic = triton.heuristics({"BLOCK": lambda args: 256 if args["n"] <= 2048 else 1024})(
        _fresh_add_kernel()
    )
    ours, stats = _launches_by_n(stand_in, heuristic)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)
    assert [launch.block[0] for launch in ours] == [128, 128, 128, 128, 128]  # num_warps 4
    assert [launch.grid[0] for launch in ours] == [4, 8, 4, 8, 4]


@pytest.mark.parametrize(
    "values, call_kwargs, reason",
    [
        (
            {"BLOCK": lambda args: 1024 if args["x_ptr"].shape[0] > 8 else 256},
            {},
            "a heuristic reads argument 'x_ptr' of type Tensor; only scalars are keyed",
        ),
        (
            {"BLOCK": lambda args: 1024 if len(args) > 3 else 256},
            {},
            "a heuristic reads its arguments as a whole",
        ),
        (
            {"BLOCK": lambda args: 1024 if args != {} else 256},
            {},
            "a heuristic reads its arguments as a whole",
        ),
        (
            {"BLOCK": lambda args: 1024 if args["nn"[1:]] > 8 else 256},  # spells "nn"
            {},
            "a heuristic reads 'n', which its code does not name",
        ),
        (
            {"BLOCK": lambda args: 1024},
            {"BLOCK": 256},
            "argument 'BLOCK' is computed by the heuristics",
        ),
    ],
    ids=["tensor", "whole", "compared", "unnamed", "passed"],
)
def test_heuristics_the_key_cannot_follow_run_through_triton(
    values, call_kwargs, reason, stand_in, caplog
):
    heuristic = triton.heuristics(values)(_fresh_add_kernel())
    _KEPT.append(heuristic)
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(heuristic, _grid_by_block, x, y, out, N, **call_kwargs)
    stand_in.reset()
    with fastkernel.patched(), caplog.at_level(logging.INFO, logger="fastkernel"):
        for _ in range(2):
            heuristic[_grid_by_block](x, y, out, N, **call_kwargs)
        stats = _stats_of(heuristic)
    for launch in stand_in.launches():
        assert_same_launch(launch, theirs)
    assert stats["fallbacks"] == 2 and stats["hits"] == 0
    (counted,) = stats["fallback_reasons"]
    assert counted.startswith(reason), counted


def test_a_heuristic_testing_an_argument_for_none_is_one_native_hit(stand_in):
    # flash-linear-attention's most common heuristic: which arguments are None is in the key,
    # so a tensor read only by `is not None` keeps the call native.
    heuristic = triton.heuristics({"HAS_Y": lambda args: args["y_ptr"] is not None})(
        JITFunction(kernels.optional_add_kernel.fn)
    )
    _KEPT.append(heuristic)
    x, y, out = _tensors()
    calls = (y, None, y, None, y)
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = {
            b is None: reference.launch(heuristic, (4,), x, b, out, N, BLOCK=1024)
            for b in (y, None)
        }
    stand_in.reset()
    with fastkernel.patched():
        for b in calls:
            heuristic[(4,)](x, b, out, N, BLOCK=1024)
        stats = _stats_of(heuristic)
    ours = stand_in.launches()
    assert len(ours) == len(calls)
    for b, launch in zip(calls, ours):
        assert_same_launch(launch, theirs[b is None])
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)


def test_a_stack_of_heuristics_is_one_native_hit(stand_in):
    # @triton.heuristics over @triton.heuristics (SGLang's Mamba kernels stack eight): the outer
    # level's value is computed first and the inner level's function sees it.
    inner = triton.heuristics({"BLOCK": lambda args: 1024 if args["HAS_Y"] else 256})(
        JITFunction(kernels.optional_add_kernel.fn)
    )
    stack = triton.heuristics({"HAS_Y": lambda args: args["y_ptr"] is not None})(inner)
    _KEPT.append(stack)
    x, y, out = _tensors()
    calls = (y, None, y, None, y)
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = {
            b is None: reference.launch(stack, _grid_by_block, x, b, out, N) for b in (y, None)
        }
    stand_in.reset()
    with fastkernel.patched():
        for b in calls:
            stack[_grid_by_block](x, b, out, N)
        stats = _stats_of(stack)
        inner_stats = fastkernel.stats()
    ours = stand_in.launches()
    assert [launch.grid[0] for launch in ours] == [4, 16, 4, 16, 4]
    for b, launch in zip(calls, ours):
        assert_same_launch(launch, theirs[b is None])
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)
    # Served as one dispatch: the kernel under the stack was never launched through Triton's run.
    assert PATCH_ATTR not in vars(inner) and PATCH_ATTR not in vars(inner.fn), inner_stats


def test_a_name_computed_at_two_levels_of_a_stack_keeps_tritons_path(stand_in):
    # Triton computes both: the outer value is what the inner function sees, the inner one is
    # launched. One dispatch cannot hold two values of one name in order, so Triton runs the
    # stack; the launch underneath is still native.
    inner = triton.heuristics({"BLOCK": lambda args: args["BLOCK"] * 4})(_fresh_add_kernel())
    stack = triton.heuristics({"BLOCK": lambda args: 256})(inner)
    _KEPT.append(stack)
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(stack, _grid_by_block, x, y, out, N)
    stand_in.reset()
    with fastkernel.patched():
        for _ in range(3):
            stack[_grid_by_block](x, y, out, N)
        kernel_stats = _stats_of(inner.fn)
    ours = stand_in.launches()
    assert [launch.grid[0] for launch in ours] == [4, 4, 4]
    for launch in ours:
        assert_same_launch(launch, theirs)
    assert PATCH_ATTR not in vars(stack)
    assert (kernel_stats["misses"], kernel_stats["hits"]) == (1, 2)


def _heuristics_over_autotune(timings, key=("n", "HAS_Y"), heuristic=None, configs=CONFIGS):
    """flash-linear-attention's usual stack: Triton's heuristics (``HAS_Y`` from whether y is
    None, by default) over Triton's autotuner (``configs``, picked by ``timings``) over a fresh
    JITFunction of optional_add_kernel."""
    tuned = triton.autotune(configs=configs, key=list(key), do_bench=_timer(timings))(
        JITFunction(kernels.optional_add_kernel.fn)
    )
    top = triton.heuristics({"HAS_Y": heuristic or (lambda args: args["y_ptr"] is not None)})(tuned)
    _KEPT.extend((tuned.fn, tuned, top))
    return top


def _autotune_over_heuristics(timings, key=("n",), heuristic=None, configs=CONFIGS) -> Autotuner:
    """FlagGems' upsampling stack: Triton's autotuner (``configs``, picked by ``timings``) over
    Triton's heuristics (``HAS_Y`` from whether y is None, by default) over a fresh JITFunction
    of optional_add_kernel."""
    jit_fn = JITFunction(kernels.optional_add_kernel.fn)
    stack = triton.heuristics({"HAS_Y": heuristic or (lambda args: args["y_ptr"] is not None)})(
        jit_fn
    )
    tuned = triton.autotune(configs=configs, key=list(key), do_bench=_timer(timings))(stack)
    _KEPT.extend((jit_fn, stack, tuned))
    return tuned


@pytest.mark.parametrize(
    "stack, heuristic",
    [
        ("heuristics over autotuner", None),
        ("autotuner over heuristics", None),
        (
            "autotuner over heuristics",
            lambda args: args["y_ptr"] is not None and args["BLOCK"] >= 1024,
        ),
        (
            "autotuner over heuristics",
            lambda args: args["y_ptr"] is not None and args["num_warps"] > 2,
        ),
    ],
    ids=[
        "heuristics over autotuner",
        "autotuner over heuristics",
        "autotuner over heuristics reading the config's value",
        "autotuner over heuristics reading the config's option",
    ],
)
def test_a_stack_of_triton_autotune_and_heuristics_is_one_native_hit(stand_in, stack, heuristic):
    """A call of ``@triton.heuristics`` over ``@triton.autotune`` (flash-linear-attention's most
    common stack), or of ``@triton.autotune`` over ``@triton.heuristics`` (FlagGems'
    upsampling, fla's WALL attention), is one native hit: the same launches, tuning, autotune
    cache and ``best_config`` after every call as Triton's. Over the autotuner a computed value
    is in the autotune key; under it the heuristics see the tuned config's values and compile
    options (Triton's ``Autotuner.run`` passes them), which they may read."""
    x, y, out = _tensors()
    calls = [(y, N), (None, N), (y, N), (y, N // 2), (None, N), (y, N // 2), (y, N)]
    runs = {}
    for on in (False, True):
        # Three autotune keys, two configs timed for each: BLOCK 256, 1024, 256 picked.
        timings = [3.0, 1.0, 0.5, 2.0, 1.0, 2.0]
        if stack == "heuristics over autotuner":
            top = _heuristics_over_autotune(timings)
            tuned = top.fn
        else:
            top = tuned = _autotune_over_heuristics(timings, heuristic=heuristic)
        stand_in.reset()
        best = []
        with _triton_on_stand_in(stand_in, patched=on):
            for b, n in calls:
                top[_grid_by_block](x, b, out, n)
                best.append(tuned.best_config)
            if on:
                stats = _stats_of(top)
                dispatch = vars(top)[PATCH_ATTR]
                # One dispatch: the level under it was never launched as a dispatch of its
                # own (Triton's run, which a miss runs, launches the kernel natively).
                under_served = PATCH_ATTR in vars(top.fn)
        runs[on] = (stand_in.launches(), best, dict(tuned.cache))
    (mine, my_best, my_cache), (theirs, their_best, their_cache) = runs[True], runs[False]
    assert len(mine) == len(theirs) == len(calls) + 3 * 2
    for ours, reference_launch in zip(mine, theirs):
        assert_same_launch(ours, reference_launch)
    assert my_best == their_best and my_cache == their_cache and len(my_cache) == 3
    assert my_best[:3] == [CONFIGS[1], CONFIGS[0], CONFIGS[1]]
    assert len({launch.image for launch in mine}) > 1  # binaries told apart by HAS_Y, BLOCK
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (3, 4, 0)
    expected = (
        "PatchedHeuristics"
        if stack == "heuristics over autotuner"
        else "PatchedAutotunerOverHeuristics"
    )
    assert type(dispatch).__name__ == expected
    assert not under_served


@pytest.mark.parametrize("stack", ["heuristics over autotuner", "autotuner over heuristics"])
def test_config_pre_hooks_in_a_stack_of_autotune_and_heuristics_run_as_triton_runs_them(
    stand_in, stack
):
    """A key whose config has a ``pre_hook`` is one native hit that calls the hook with what
    Triton's run gives it: under heuristics over the autotuner, the values they computed among
    the keywords; over heuristics, the call's (the heuristics run under the hook)."""
    x, y, out = _tensors()
    calls = [(y, N), (None, N), (y, N), (None, N), (y, N // 2), (y, N // 2)]
    runs = {}
    for on in (False, True):
        seen: list = []
        timings = [3.0, 1.0, 0.5, 2.0, 1.0, 2.0]
        configs = _hooked_configs(seen)
        if stack == "heuristics over autotuner":
            top = _heuristics_over_autotune(timings, key=("n",), configs=configs)
        else:
            top = _autotune_over_heuristics(timings, configs=configs)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            for b, n in calls:
                top[_grid_by_block](x, b, out, n)
            if on:
                stats = _stats_of(top)
        runs[on] = (seen, stand_in.launches())
    (my_seen, mine), (their_seen, theirs) = runs[True], runs[False]
    # Three autotune keys (y None leaves its dtype out), two configs timed for each.
    assert my_seen == their_seen and len(their_seen) == len(calls) + 3 * 2
    assert len(mine) == len(theirs) == len(calls) + 3 * 2
    for ours, reference_launch in zip(mine, theirs):
        assert_same_launch(ours, reference_launch)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (3, 3, 0)
    if stack == "heuristics over autotuner":  # the computed HAS_Y among the hook's keywords
        assert [dict(items)["HAS_Y"] for _, items in their_seen[-2:]] == [True, True]


@pytest.mark.parametrize("levels", [1, 2])
def test_a_pre_hook_sees_the_values_of_heuristics_over_its_autotuner_in_tritons_order(
    stand_in, levels
):
    """Heuristics computing MODE, then SCALE (in one ``values`` dict, or one level each,
    outermost first) over an autotuner whose configs have a ``pre_hook``: a hit gives the hook
    the computed values among the keywords in the order Triton's ``Heuristics.run`` adds them,
    which is not their names' order."""
    out = torch.empty(1024)
    values = {"MODE": lambda args: "double", "SCALE": lambda args: 1.5}
    runs = {}
    for on in (False, True):
        seen: list = []
        tuned = triton.autotune(configs=_hooked_configs(seen), key=[], do_bench=_timer([1.0, 2.0]))(
            JITFunction(kernels.constexpr_kernel.fn)
        )
        if levels == 1:
            top = triton.heuristics(values)(tuned)
            _KEPT.extend((tuned.fn, tuned, top))
        else:
            lower = triton.heuristics({"SCALE": values["SCALE"]})(tuned)
            top = triton.heuristics({"MODE": values["MODE"]})(lower)
            _KEPT.extend((tuned.fn, tuned, lower, top))
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            for _ in range(3):
                top[(1,)](out)
            if on:
                stats = _stats_of(top)
        runs[on] = (seen, stand_in.launches())
    (my_seen, mine), (their_seen, theirs) = runs[True], runs[False]
    names = [name for name, _ in their_seen[-1][1]]
    assert names.index("MODE") < names.index("SCALE") < names.index("BLOCK")
    assert my_seen == their_seen
    for ours, reference_launch in zip(mine, theirs, strict=True):
        assert_same_launch(ours, reference_launch)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0)


@pytest.mark.parametrize("stack", ["heuristics over autotuner", "autotuner over heuristics"])
@pytest.mark.parametrize(
    "key, heuristic, reason",
    [
        (
            ("x_ptr",),
            None,
            "autotune key 'x_ptr' holds a tensor, which Triton keys by identity",
        ),
        (
            ("n",),
            lambda args: args["y_ptr"].shape[0] > 8,
            "a heuristic reads argument 'y_ptr' of type Tensor; only scalars are keyed",
        ),
        (
            ("n",),
            lambda args: args["grid"] is not None,
            "a heuristic reads 'grid', which its code does not name",
        ),
    ],
    ids=["autotune key", "heuristic", "grid"],
)
def test_a_stack_of_autotune_and_heuristics_the_key_cannot_follow_keeps_tritons_path(
    stand_in, stack, key, heuristic, reason
):
    """A call of Triton's heuristics over Triton's autotuner, or the other way round, whose
    autotune key or heuristic the native key cannot imply runs as Triton runs it (the same
    launches and tuning), counted as a fallback with the reason."""
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        if stack == "heuristics over autotuner":
            top = _heuristics_over_autotune([1.0, 2.0] * 2, key=key, heuristic=heuristic)
            tuned = top.fn
        else:
            top = tuned = _autotune_over_heuristics([1.0, 2.0] * 2, key=key, heuristic=heuristic)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            for _ in range(3):
                top[_grid_by_block](x, y, out, N)
            if on:
                stats = _stats_of(top)
        runs[on] = (stand_in.launches(), dict(tuned.cache))
    assert len(runs[True][0]) == len(runs[False][0])
    for ours, reference_launch in zip(*(runs[on][0] for on in (True, False))):
        assert_same_launch(ours, reference_launch)
    assert runs[True][1] == runs[False][1]
    assert stats["hits"] == 0 and stats["fallbacks"] == 3
    (counted,) = stats["fallback_reasons"]
    assert counted.startswith(reason), counted


#: What the heuristic of :func:`_block_from_a_global` returns (a test sets it).
_BLOCK_SETTING = 512


def _block_from_a_global(args):
    return _BLOCK_SETTING


@pytest.mark.parametrize(
    "heuristic, calls, grids, reason",
    [
        (
            _block_from_a_global,
            [(512, {}), (1024, {}), (512, {})],
            [(8, 1, 1), (4, 1, 1), (8, 1, 1)],
            "the heuristic for 'BLOCK' reads '_BLOCK_SETTING', which the key does not hold",
        ),
        (
            lambda args: 512,
            [(None, {"BLOCK": 128}), (None, {"BLOCK": 256}), (None, {"BLOCK": 128})],
            [(8, 1, 1)] * 3,
            "argument 'BLOCK' is computed by the heuristics",
        ),
    ],
    ids=["a global", "a computed name passed"],
)
def test_a_triton_autotune_over_heuristics_call_the_key_cannot_follow_keeps_tritons_path(
    stand_in, monkeypatch, heuristic, calls, grids, reason
):
    """A heuristic reading a global (which the key cannot hold), and a call passing the name
    the heuristics compute (Triton's ``Heuristics.run`` replaces it): every call runs Triton's
    ``Autotuner.run``, launching what Triton launches (the grid reads ``BLOCK``, the value
    launched), counted as a fallback with the reason."""
    configs = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=2)]
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        tuned = triton.autotune(configs=configs, key=["n"], do_bench=_timer([1.0, 2.0]))(
            triton.heuristics({"BLOCK": heuristic})(_fresh_add_kernel())
        )
        _KEPT.append(tuned)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            for setting, kwargs in calls:
                if setting is not None:
                    monkeypatch.setattr(sys.modules[__name__], "_BLOCK_SETTING", setting)
                tuned[_grid_by_block](x, y, out, N, **kwargs)
            if on:
                stats = _stats_of(tuned)
        runs[on] = stand_in.launches()
    assert len(runs[True]) == len(runs[False]) == len(calls) + 2
    for ours, reference_launch in zip(runs[True], runs[False]):
        assert_same_launch(ours, reference_launch)
    assert [launch.grid for launch in runs[True][2:]] == grids
    assert stats["hits"] == 0 and stats["fallbacks"] == len(calls)
    assert stats["fallback_reasons"] == {reason: len(calls)}


def _stack_over_optional_add(stack: str, timings) -> tuple[KernelInterface, JITFunction]:
    """A fresh ``stack`` of Triton's autotuner (``CONFIGS``, or configs setting HAS_Y too) and
    heuristics (HAS_Y from whether y is None; BLOCK too alone) over optional_add_kernel: the
    top object and the kernel."""
    if stack == "heuristics over autotuner":
        top = _heuristics_over_autotune(timings, key=("n",))
        return top, top.fn.fn
    if stack == "autotuner over heuristics":
        top = _autotune_over_heuristics(timings)
        return top, top.fn.fn
    jit_fn = JITFunction(kernels.optional_add_kernel.fn)
    if stack == "autotune":
        configs = [triton.Config({**c.kwargs, "HAS_Y": True}) for c in CONFIGS]
        top = triton.autotune(configs=configs, key=["n"], do_bench=_timer(timings))(jit_fn)
    else:
        has_y = {"HAS_Y": lambda args: args["y_ptr"] is not None}
        top = triton.heuristics({**has_y, "BLOCK": lambda args: 1024})(jit_fn)
    _KEPT.extend((jit_fn, top))
    return top, jit_fn


@pytest.mark.parametrize("early", [True, False], ids=["from the start", "after two calls"])
@pytest.mark.parametrize(
    "stack", ["autotune", "heuristics", "heuristics over autotuner", "autotuner over heuristics"]
)
def test_pre_run_hooks_under_a_tuned_stack_see_what_tritons_run_passes(stand_in, stack, early):
    """Triton's ``JITFunction.run`` passes a kernel's pre-run hooks the call's keywords with the
    tuned config's and the heuristics' values: while the kernel has hooks, a call of its
    autotuner or heuristics goes through Triton's run (the launch beneath native), so each hook
    runs once per launch and sees those values, the hooks added after native hits included."""
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        top, jit_fn = _stack_over_optional_add(stack, [1.0, 2.0] * 2)
        seen: list = []
        hook = functools.partial(
            lambda seen, *args, **kwargs: seen.append(
                sorted((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))
            ),
            seen,
        )
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            if early:
                jit_fn.add_pre_run_hook(hook)
            for _ in range(2):
                top[_grid_by_block](x, y, out, N)
            if not early:
                jit_fn.add_pre_run_hook(hook)
            for _ in range(2):
                top[_grid_by_block](x, y, out, N)
            if on:
                stats = _stats_of(top)
        runs[on] = (seen, stand_in.launches())
    (my_hooks, mine), (their_hooks, theirs) = runs[True], runs[False]
    assert len(mine) == len(theirs)
    for ours, reference_launch in zip(mine, theirs):
        assert_same_launch(ours, reference_launch)
    assert my_hooks == their_hooks and len(my_hooks) == (len(theirs) if early else 2)
    assert ("HAS_Y", True) in my_hooks[-1] and ("BLOCK", 1024) in my_hooks[-1]
    assert stats["fallbacks"] == (4 if early else 2)
    assert stats["fallback_reasons"] == {
        "the kernel has pre-run hooks, which Triton's run passes the tuned or computed values": (
            4 if early else 2
        )
    }


def test_a_heuristics_over_an_autotuner_over_a_heuristics_is_served_underneath(stand_in, caplog):
    """A heuristics over an autotuner over a heuristics: the top heuristics computes its values
    in Python (Triton's ``Heuristics.run``), and the autotuner under it, over the lower
    heuristics, is one native hit with them; no dispatch fails to build on the way."""
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        jit_fn = JITFunction(kernels.optional_add_kernel.fn)
        lower = triton.heuristics({"HAS_Y": lambda args: args["y_ptr"] is not None})(jit_fn)
        configs = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=2)]
        tuned = triton.autotune(configs=configs, key=["n"], do_bench=_timer([1.0, 2.0]))(lower)
        top = triton.heuristics({"BLOCK": lambda args: 256})(tuned)
        _KEPT.extend((jit_fn, lower, tuned, top))
        stand_in.reset()
        with caplog.at_level(logging.WARNING, logger="fastkernel"):
            with _triton_on_stand_in(stand_in, patched=on):
                for _ in range(3):
                    top[_grid_by_block](x, y, out, N)
                if on:
                    kept = vars(top)[PATCH_ATTR]
                    inner = _stats_of(tuned)
        runs[on] = stand_in.launches()
    assert len(runs[True]) == len(runs[False]) == 3 + 2
    for ours, reference_launch in zip(runs[True], runs[False]):
        assert_same_launch(ours, reference_launch)
    assert kept is False and not caplog.records
    assert (inner["misses"], inner["hits"], inner["fallbacks"]) == (1, 2, 0)


def test_a_heuristic_replaced_in_place_under_an_autotuner_is_never_registered(stand_in):
    """A heuristic function replaced in place in ``values`` (which the dispatch does not watch)
    after the first launch: a new key's miss finds that the value it computes is not the one
    Triton's run launched with, and registers nothing; every launch is Triton's."""
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        tuned = _autotune_over_heuristics([1.0, 2.0] * 2)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            tuned[_grid_by_block](x, y, out, N)
            tuned[_grid_by_block](x, y, out, N)
            tuned.fn.values["HAS_Y"] = lambda args: False
            tuned[_grid_by_block](x, y, out, N // 2)
            tuned[_grid_by_block](x, y, out, N // 2)
            if on:
                stats = _stats_of(tuned)
        runs[on] = stand_in.launches()
    assert len(runs[True]) == len(runs[False]) == 4 + 2 * 2
    for ours, reference_launch in zip(runs[True], runs[False]):
        assert_same_launch(ours, reference_launch)
    assert (stats["misses"], stats["hits"]) == (3, 1)
    assert stats["fallback_reasons"] == {
        "the heuristic for 'HAS_Y' gave True where the launch had False": 2
    }


def test_an_autotuner_whose_configs_set_a_computed_name_keeps_tritons_path(stand_in):
    """Configs that set a name the heuristics under them compute (the heuristic's value wins in
    Triton's run): the autotuner launches through Triton's ``Autotuner.run``."""
    configs = [triton.Config({"BLOCK": 1024, "HAS_Y": False}), triton.Config({"BLOCK": 256})]
    x, y, out = _tensors()
    runs = {}
    for on in (False, True):
        tuned = _autotune_over_heuristics([1.0, 2.0], configs=configs)
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=on):
            for _ in range(2):
                tuned[_grid_by_block](x, y, out, N)
            if on:
                kept = vars(tuned)[PATCH_ATTR]
        runs[on] = stand_in.launches()
    assert len(runs[True]) == len(runs[False]) == 2 + 2
    for ours, reference_launch in zip(runs[True], runs[False]):
        assert_same_launch(ours, reference_launch)
    assert kept is False


def _served_stack(stack: str):
    """A fresh kernel object launching through others (or a kernel), and the keywords its
    calls add: :func:`_launched_through` for one level, or a heuristics over an autotuner."""
    if stack == "heuristics over autotuner":
        return _heuristics_over_autotune([1.0, 2.0]), {}
    if stack == "autotuner over heuristics":
        return _autotune_over_heuristics([1.0, 2.0]), {}
    cls = {"kernel": JITFunction, "autotuner": Autotuner, "heuristics": Heuristics}[stack]
    return _launched_through(cls)


@pytest.mark.parametrize("wrapped", [False, True], ids=["function", "functools.wraps"])
@pytest.mark.parametrize(
    "stack, cls",
    [
        ("kernel", JITFunction),
        ("autotuner", JITFunction),
        ("heuristics", JITFunction),
        ("heuristics over autotuner", JITFunction),
        ("heuristics over autotuner", Autotuner),
        ("autotuner over heuristics", JITFunction),
        ("autotuner over heuristics", Heuristics),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else v,
)
def test_a_run_assigned_on_a_class_under_a_served_kernel_is_called(stand_in, stack, cls, wrapped):
    """Triton's autotuner and heuristics launch through ``self.fn.run``: while another
    library's ``run`` is on the class of an object under them (SGLang's ``replay_launches``
    puts a launch recorder on ``JITFunction``; vLLM replaces ``Autotuner.run``), every launch
    of theirs calls it, after native hits and on a first launch alike, as without the patch;
    once it is gone, they are native hits again. So for a kernel's own class; and for a
    recorder made with ``functools.wraps`` over the patch's run, which copies its attributes."""
    x, y, out = _tensors()
    calls: dict[bool, list] = {}
    hits: dict[str, int] = {}
    for on in (False, True):
        seen = calls[on] = []
        tritons = cls.__dict__["run"]
        first, extra = _served_stack(stack)
        later, _ = _served_stack(stack)
        with _triton_on_stand_in(stand_in, patched=on):
            saved = cls.run  # as SGLang saves it, when it records: read through the class

            def recorder(self, *args, saved=saved, seen=seen, **kwargs):
                seen.append(type(self).__name__)
                return saved(self, *args, **kwargs)

            if wrapped:
                recorder = functools.wraps(saved)(recorder)

            try:
                for _ in range(2):
                    first[(4,)](x, y, out, N, **extra)
                cls.run = recorder
                for _ in range(2):
                    first[(4,)](x, y, out, N, **extra)
                later[(4,)](x, y, out, N, **extra)  # its first launch
                first.run(x, y, out, N, grid=(4,), warmup=False, **extra)
            finally:
                cls.run = saved
            if on:
                before = {"first": _stats_of(first)["hits"], "later": 0}
            for _ in range(2):
                first[(4,)](x, y, out, N, **extra)
                later[(4,)](x, y, out, N, **extra)
            if on:
                hits = {
                    "first": _stats_of(first)["hits"] - before["first"],
                    "later": _stats_of(later)["hits"],
                }
        assert cls.__dict__["run"] is tritons
    # Four launches, and the later autotuner's two benchmarked configs as it first tunes.
    tuned_under = 2 if "autotuner" in stack and cls is not Autotuner else 0
    if stack == "kernel":  # the kernel itself: `first.run(...)` calls the recorder directly
        assert calls[True] == calls[False] and len(calls[True]) == 4, calls
        return
    assert calls[True] == calls[False] and len(calls[True]) == 4 + tuned_under, calls
    assert hits == {"first": 2, "later": 1}  # the later one: a miss, then a hit


@pytest.mark.parametrize("entry", ["subscript", "run"])
def test_a_dispatch_dropped_while_a_class_under_it_is_checked_serves_that_launch(stand_in, entry):
    """Checking a class under a dispatch (after it changed) calls Python, where another thread
    may drop the dispatch (an attribute it is built from assigned, ``unpatch()``): the launch
    that was checking keeps it alive and is served by it; the next one builds a new one."""
    x, y, out = _tensors()
    top = _heuristics_over_autotune([1.0, 2.0])
    dropped = []

    def drop_then_answer(cls):  # as if another thread ran inside the check
        dispatch = top.__dict__.get(PATCH_ATTR)
        if isinstance(dispatch, NativeDispatch) and not dropped:
            dropped.append(weakref.ref(dispatch))
            del dispatch
            patch_module._forget_dispatch(top)
            gc.collect()  # its own reference cycles (a cached bound launch) collected too
        return patch_module._type_launches_served(cls)

    triton_getitem = KernelInterface.__dict__["__getitem__"]
    with _triton_on_stand_in(stand_in, patched=True):
        top[_grid_by_block](x, y, out, N)
        top[_grid_by_block](x, y, out, N)
        for cls in patch_module._KERNEL_CLASSES:
            _C.install_patch(cls, patch_module._dispatch_for, triton_getitem, drop_then_answer)
        JITFunction._fastkernel_test_mark = True  # a change of the class under it
        del JITFunction._fastkernel_test_mark
        if entry == "subscript":
            launch = top[_grid_by_block]
            assert dropped and dropped[0]() is not None  # kept by the bound launch
            launch(x, y, out, N)
            del launch
        else:  # the autotuner's patched run asks for its dispatch so
            served = _C.patched_dispatch(top)
            assert dropped and served is dropped[0]()
            del served
        gc.collect()
        assert dropped[0]() is None  # released after that launch
        top[_grid_by_block](x, y, out, N)
        assert isinstance(top.__dict__.get(PATCH_ATTR), NativeDispatch)
    assert len(stand_in.launches()) >= 3 + (entry == "subscript")


def test_a_heuristic_sees_whether_an_argument_was_passed(stand_in):
    # Triton's Heuristics.run passes only the arguments given: `scale` left out (default 2.0)
    # and `scale=2.0` passed are different inputs to the heuristic, so different keys.
    heuristic = triton.heuristics(
        {"BLOCK": lambda args: 1024 if args.get("scale", 1.0) == 2.0 else 256}
    )(JITFunction(kernels.scaled_kernel.fn))
    _KEPT.append(heuristic)
    x, _, out = _tensors()
    calls = ((), (2.0,), (), (2.0,), ())
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = {
            extra: reference.launch(heuristic, _grid_by_block, x, out, N, *extra)
            for extra in ((), (2.0,))
        }
    stand_in.reset()
    with fastkernel.patched():
        for extra in calls:
            heuristic[_grid_by_block](x, out, N, *extra)
        stats = _stats_of(heuristic)
    ours = stand_in.launches()
    assert [launch.grid[0] for launch in ours] == [16, 4, 16, 4, 16]
    for extra, launch in zip(calls, ours):
        assert_same_launch(launch, theirs[extra])
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0)


def _jumps_on_none(args):
    if args["h0"] is None:
        return 1
    return 2


def _reads_h0_twice(args):
    return args["h0"] is not None and args["h0"].shape[0] > 2


def _pow2(n):  # SGLang's triton.next_power_of_2 (sglang/srt/utils/common.py), its code
    return 1 << (n - 1).bit_length() if n > 0 else 1


def _pow2_capped(n, cap=1024):  # a helper calling a helper, with a constant default
    return min(_pow2(n), cap)


def _times_n(n):
    return n * N


def _through_times_n(n):
    return _pow2(_times_n(n))


def _pow2_with_table(n, table=[1, 2, 4]):  # noqa: B006 - the mutable default is the case
    return table[n]


def _closure_helper():
    scale = [2]
    return lambda n: n * scale[0]


_SCALED = _closure_helper()


def _reads_the_block(args):
    return args["BLOCK"]


@pytest.mark.parametrize(
    "fn, identity_only, outside",
    [
        (lambda args: args["h0"] is not None, {"h0"}, None),
        (_jumps_on_none, {"h0"}, None),
        (_reads_h0_twice, set(), None),  # one read is not an identity test
        (lambda args: None is args["h0"], set(), None),  # a form not recognised: not trusted
        (lambda args: min(triton.next_power_of_2(args["n"]), 1024), set(), None),
        (lambda args: triton.cdiv(args["n"], 2) + math.ceil(args["n"] / 3), set(), None),
        (lambda args: sum(args[k] for k in ("a", "b")), set(), None),
        (lambda args: N, set(), "reads 'N', which the key does not hold"),
        (lambda args: math.pi, set(), "reads 'math.pi', which the key does not hold"),
        (lambda args: __import__("os"), set(), "reads '__import__', which the key does not hold"),
        (lambda args: _pow2(args["n"]), set(), None),
        (lambda args: _pow2_capped(args["n"]) + _pow2(2), set(), None),
        (lambda args: _reads_the_block(args), set(), None),
        (
            lambda args: _times_n(args["n"]),
            set(),
            "calls '_times_n', which reads 'N', which the key does not hold",
        ),
        (
            lambda args: _through_times_n(args["n"]),
            set(),
            "calls '_through_times_n', which reads 'N', which the key does not hold",
        ),
        (
            lambda args: _pow2_with_table(args["n"]),
            set(),
            "calls '_pow2_with_table', which reads its default argument 'table'",
        ),
        (lambda args: _SCALED(args["n"]), set(), "calls '_SCALED', which reads closure variable"),
    ],
    ids=[
        "is-not-none",
        "jump-if-none",
        "other-use",
        "reversed",
        "pure-calls",
        "math",
        "comprehension",
        "global",
        "module-constant",
        "import",
        "pure-helper",
        "helper-calling-helper",
        "helper-given-the-mapping",
        "helper-reading-global",
        "helper-calling-helper-reading-global",
        "helper-mutable-default",
        "helper-closure",
    ],
)
def test_heuristic_code_analysis(fn, identity_only, outside):
    from fastkernel import _heuristic_code

    reads = _heuristic_code.analyze(fn)
    assert reads.identity_only == identity_only
    if outside is not None and outside.endswith("closure variable"):
        assert reads.outside is not None and reads.outside.startswith(outside)
    else:
        assert reads.outside == outside


def test_a_helper_given_the_mapping_has_the_names_it_spells_keyed():
    from fastkernel import _heuristic_code

    reads = _heuristic_code.analyze(lambda args: _reads_the_block(args))
    assert "BLOCK" in reads.spelled


def test_a_heuristic_calling_a_replaced_next_power_of_2_is_one_native_hit(stand_in, monkeypatch):
    # SGLang's runtime replaces triton.next_power_of_2 with a Python function of its own when it
    # is imported (sglang/srt/utils/common.py); a heuristic calling it, as SGLang's Mamba
    # kernels' do, still reads only its arguments and is served natively.
    monkeypatch.setattr(triton, "next_power_of_2", _pow2)
    heuristic = triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"] // 8)})(
        _fresh_add_kernel()
    )
    ours, stats = _launches_by_n(stand_in, heuristic)
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 3, 0), stats
    assert [launch.grid[0] for launch in ours] == [8, 8, 8, 8, 8]


_SMALL_BLOCKS = {"on": False}


def _closure_heuristic():
    switch = _SMALL_BLOCKS
    return lambda args: 256 if switch["on"] else 1024


@pytest.mark.parametrize(
    "heuristic_fn, reason",
    [
        (
            lambda args: 256 if _SMALL_BLOCKS["on"] else 1024,
            "the heuristic for 'BLOCK' reads '_SMALL_BLOCKS', which the key does not hold",
        ),
        (
            lambda args: 256 if torch.are_deterministic_algorithms_enabled() else 1024,
            "the heuristic for 'BLOCK' calls 'torch.are_deterministic_algorithms_enabled', "
            "which reads '_C._get_deterministic_algorithms'",
        ),
        (_closure_heuristic(), "the heuristic for 'BLOCK' reads closure variable 'switch'"),
    ],
    ids=["global", "torch-state", "closure"],
)
def test_a_heuristic_reading_state_outside_its_arguments_never_serves_a_stale_value(
    heuristic_fn, reason, stand_in
):
    heuristic = triton.heuristics({"BLOCK": heuristic_fn})(_fresh_add_kernel())
    _KEPT.append(heuristic)
    x, y, out = _tensors()
    states = (False, True, False, True)

    def set_state(on: bool) -> None:
        _SMALL_BLOCKS["on"] = on
        torch.use_deterministic_algorithms(on)

    try:
        with TritonReference(stand_in, TEST_STREAM) as reference:
            theirs = {}
            for on in (False, True):
                set_state(on)
                theirs[on] = reference.launch(heuristic, _grid_by_block, x, y, out, N)
        stand_in.reset()
        with fastkernel.patched():
            for on in states:
                set_state(on)
                heuristic[_grid_by_block](x, y, out, N)
            stats = _stats_of(heuristic)
    finally:
        set_state(False)
    ours = stand_in.launches()
    assert [launch.grid[0] for launch in ours] == [4, 16, 4, 16]
    for on, launch in zip(states, ours):
        assert_same_launch(launch, theirs[on])
    assert stats["fallbacks"] == len(states) and stats["hits"] == 0
    (counted,) = stats["fallback_reasons"]
    assert counted.startswith(reason), counted


def test_a_copy_of_a_served_kernel_gets_its_own_dispatch(stand_in):
    # copy.copy copies the instance dict, dispatch included; the copy launches through its own.
    import copy

    jit_fn = _fresh_add_kernel()
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(jit_fn, (4,), x, y, out, N, BLOCK=1024)
    stand_in.reset()
    with fastkernel.patched():
        jit_fn[(4,)](x, y, out, N, BLOCK=1024)
        twin = copy.copy(jit_fn)
        _KEPT.append(twin)
        twin[(4,)](x, y, out, N, BLOCK=1024)
        jit_fn[(4,)](x, y, out, N, BLOCK=1024)
        assert (_stats_of(jit_fn)["misses"], _stats_of(jit_fn)["hits"]) == (1, 1)
        assert (_stats_of(twin)["misses"], _stats_of(twin)["hits"]) == (1, 0)
    for launch in stand_in.launches():
        assert_same_launch(launch, theirs)
    assert len(stand_in.launches()) == 3
    assert PATCH_ATTR not in jit_fn.__dict__ and PATCH_ATTR not in twin.__dict__


def test_unpatch_and_patch_while_the_factory_returns_leave_a_working_dispatch(
    stand_in, monkeypatch
):
    # What another thread can do once the patch factory has released its lock and before the
    # native hook has used the dispatch it returned: unpatch (dropping the kernel's own
    # reference to that dispatch) and patch again. The launch must still complete through it.
    factory = patch_module._dispatch_for
    repatches = []

    def factory_then_repatch(obj):
        result = factory(obj)
        if not repatches:
            repatches.append(obj)
            fastkernel.unpatch()
            fastkernel.patch()
        return result

    jit_fn = _fresh_add_kernel()
    x, y, out = _tensors()
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(jit_fn, (4,), x, y, out, N, BLOCK=1024)
    stand_in.reset()
    monkeypatch.setattr(patch_module, "_dispatch_for", factory_then_repatch)
    with _triton_on_stand_in(stand_in, patched=True):  # Triton's kernels collected unload there
        jit_fn[(4,)](x, y, out, N, BLOCK=1024)
        gc.collect()
        jit_fn[(4,)](x, y, out, N, BLOCK=1024)  # through a new dispatch
    assert repatches == [jit_fn]
    launches = stand_in.launches()
    assert len(launches) == 2
    for launch in launches:
        assert_same_launch(launch, theirs)


def _one_config_per_key(configs, named_args, **kwargs):
    """An early_config_prune keeping one config per key (so Triton times nothing): the first
    for n >= 2048, the second below."""
    return [configs[0]] if named_args["n"] >= 2048 else [configs[1]]


def test_a_tuned_miss_registers_the_config_it_launched_even_if_best_config_moved_meanwhile(
    stand_in,
):
    # The grid of the miss for n=N calls the autotuner for n=N//4, whose run sets the shared
    # best_config to the other config before the outer miss registers its own. It does so in
    # the launch Triton's run makes once it has chosen (best_config set), not while it times:
    # Triton <= 3.6's Autotuner.run cannot be re-entered then (it shares self.nargs).
    tuned = _autotuned([1.0, 1.0], prune_configs_by={"early_config_prune": _one_config_per_key})
    _KEPT.append(tuned)
    x, y, out = _tensors()
    nested = []

    def grid(meta):
        if not nested and getattr(tuned, "best_config", None) is not None:
            nested.append(True)
            tuned[(1,)](x, y, out, N // 4)
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        tuned[grid](x, y, out, N)
        stand_in.reset()
        tuned[grid](x, y, out, N)
        assert tuned.best_config is CONFIGS[0]
        stats = _stats_of(tuned)
    (hit,) = stand_in.launches()
    assert (hit.block[0], hit.grid[0]) == (128, N // 1024)  # CONFIGS[0]: 4 warps, BLOCK 1024
    assert (stats["misses"], stats["hits"]) == (2, 1)


def test_a_hit_after_a_call_through_tritons_run_sets_best_config_again(stand_in):
    # The second config has a pre_hook, so its key stays on Triton's Autotuner.run, which sets
    # best_config itself; the next hit of the first key must set it back.
    configs = [
        CONFIGS[0],
        triton.Config({"BLOCK": 256}, num_warps=2, pre_hook=lambda nargs: None),
    ]
    tuned = _autotuned(
        [1.0, 1.0], configs=configs, prune_configs_by={"early_config_prune": _one_config_per_key}
    )
    _KEPT.append(tuned)
    x, y, out = _tensors()
    seen = []
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for n in (N, N, N // 4, N):
            tuned[(4,)](x, y, out, n)
            seen.append(tuned.best_config)
    assert seen == [configs[0], configs[0], configs[1], configs[0]]


def test_a_heuristic_reading_a_runtime_bool_follows_its_value(stand_in):
    # A runtime bool's key word holds its kind only (Triton does not specialize its value); read
    # by a heuristic, its value joins the key.
    heuristic = triton.heuristics({"BLOCK": lambda args: 1024 if args["flag"] else 256})(
        JITFunction(kernels.flag_add_kernel.fn)
    )
    _KEPT.append(heuristic)
    x, _, out = _tensors()
    calls = (True, False, True, False)
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = {
            flag: reference.launch(heuristic, _grid_by_block, x, out, N, flag)
            for flag in (True, False)
        }
    stand_in.reset()
    with fastkernel.patched():
        for flag in calls:
            heuristic[_grid_by_block](x, out, N, flag)
        stats = _stats_of(heuristic)
    ours = stand_in.launches()
    assert [launch.grid[0] for launch in ours] == [4, 16, 4, 16]
    for flag, launch in zip(calls, ours):
        assert_same_launch(launch, theirs[flag])
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (2, 2, 0)


_PROGRAMS = {
    # Classes of __main__ pickle from an exit handler; the interpreter has removed __file__.
    "main.py": (
        "import atexit, pickle, sys\n"
        "class C:\n"
        "    pass\n"
        "def at_exit():\n"
        "    import __main__\n"
        "    print(len(pickle.dumps(C())) > 0, hasattr(__main__, '__file__'))\n"
        "atexit.register(at_exit)\n"
        "print(__name__, __file__, __package__, __spec__, type(__loader__).__name__)\n"
        "print(sys.argv, sys.path[0])\n"
    ),
    # __file__ and the traceback's file names are absolute, the traceback starts at the script.
    "chdir.py": "import os\nos.chdir('/')\nprint(__file__)\nraise ValueError('boom')\n",
    "syntax.py": "def f(:\n",
    # Reported from the script's frame; the exit is the interrupted one (SIGINT).
    "interrupt.py": "print('before')\nraise KeyboardInterrupt\n",
    "real/linked.py": "import sibling\nprint(sibling.NAME)\n",
    "real/sibling.py": "NAME = 'found beside the real file'\n",
    "appdir/__main__.py": "import sys\nprint(sys.argv, sys.path[0], __name__, __package__)\n",
    "pkg/__init__.py": "",
    "pkg/__main__.py": "import sys\nfrom . import part\nprint(sys.argv, __name__, __package__, part.X)\n",
    "pkg/part.py": "X = 3\n",
    "nomain/__init__.py": "",
}


@pytest.mark.parametrize(
    "args",
    [
        ["main.py", "a", "-b"],
        ["chdir.py"],
        ["syntax.py"],
        ["interrupt.py"],
        ["links/linked.py"],
        ["appdir", "x"],
        ["app.zip", "y"],
        ["-m", "pkg", "z"],
        ["-c", "import sys; print(sys.argv, sys.path[0], __name__)", "-v"],
        ["-m", "no_such_module"],
        ["-m", "nomain"],
        ["emptydir"],
        ["no_such_file.py"],
    ],
    ids=lambda args: " ".join(args)[:24],
)
def test_run_runs_a_target_as_the_interpreter_does(tmp_path, args):
    """`python -m fastkernel run ARGS` and `python ARGS` print the same, on both streams, and
    exit alike: __main__ kept for exit handlers, absolute __file__, a symbolic link's real
    directory first on sys.path, directory and zip targets, -m packages, -c, the interpreter's
    messages for what it cannot run, tracebacks from the target's own frame."""
    import zipfile

    for name, source in _PROGRAMS.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "linked.py").symlink_to(tmp_path / "real" / "linked.py")
    (tmp_path / "emptydir").mkdir()
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", _PROGRAMS["appdir/__main__.py"])
    theirs = _run_python(*args, cwd=tmp_path)
    ours = _run_python("-m", "fastkernel", "run", *args, cwd=tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        theirs.returncode,
        theirs.stdout,
        theirs.stderr,
    )


def test_run_reads_a_program_from_standard_input(tmp_path):
    program = "import sys\nprint(sys.argv, repr(sys.path[0]), __name__)\n"
    theirs = subprocess.run(
        [sys.executable, "-", "a"], input=program, capture_output=True, text=True, cwd=tmp_path
    )
    ours = subprocess.run(
        [sys.executable, "-m", "fastkernel", "run", "-", "a"],
        input=program,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (
        (ours.returncode, ours.stdout)
        == (theirs.returncode, theirs.stdout)
        == (
            0,
            "['-', 'a'] '' __main__\n",
        )
    )


def test_run_stats_come_last_on_the_interpreters_stderr(tmp_path):
    # After the program's non-daemon threads and exit handlers, and even when the program
    # closed its standard output and replaced its stderr.
    result = _run_with_stats(
        tmp_path,
        "import atexit, io, sys, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', file=sys.__stderr__)))"
        ".start()\n"
        "atexit.register(lambda: print('exit handler', file=sys.__stderr__))\n"
        "sys.stdout.close()\n"
        "sys.stderr = io.StringIO()\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "thread",
        "exit handler",
        "fastkernel: no Triton kernel launched",
    ]


def test_a_patched_kernel_dropped_after_launching_is_collected_with_its_module(stand_in):
    """Under the patch a JITFunction holds its native dispatch, whose launch record holds the
    compiled kernel, whose source holds the JITFunction: the collector must see that cycle, or
    every kernel a program builds and drops would stay alive with its module loaded."""
    x = torch.randn(64)
    registry = getattr(triton.runtime.jit, "_triton_jit_function_registry", {})
    refs = []
    gc.collect()  # what earlier tests left unloads now, not in the counts below
    loads, unloads = stand_in.module_loads(), stand_in.module_unloads()
    with fastkernel.patched():
        for _ in range(3):
            jit_fn = JITFunction(kernels.add_kernel.fn)
            jit_fn[(1,)](x, x, x, 64, BLOCK=64)
            refs.append(weakref.ref(jit_fn))
            for name in [name for name, fn in registry.items() if fn is jit_fn]:
                del registry[name]  # Triton (>= 3.6) keeps the newest kernel of each name
            del jit_fn
        gc.collect()
        assert [ref() for ref in refs] == [None, None, None]
        assert stand_in.module_loads() - loads == 3 and stand_in.module_unloads() - unloads == 3


def _launch_dropped_kernel(jit_fn, how: str, x, stand_in) -> list:
    """Launches ``jit_fn`` twice (a miss, then a hit) the way ``how`` names; returns what the
    caller keeps past the kernel (nothing, or the handle's ``run`` with its arguments and the
    modules Triton loaded for it)."""
    args = (x, x, x, 64)
    if how == "autotune":
        tuned = triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])(jit_fn)
        for _ in range(2):
            tuned[(1,)](*args)
        return []
    if how == "heuristics":
        guided = triton.heuristics({"BLOCK": lambda named: 64})(jit_fn)
        for _ in range(2):
            guided[(1,)](*args)
        return []
    if how == "grid function":
        for _ in range(2):
            jit_fn[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](*args, BLOCK=64)
        return []
    handle = jit_fn[(1,)](*args, BLOCK=64)
    if how == "handle":
        for _ in range(2):
            handle[(1, 1, 1)](*args, 64)
        return []
    loads = stand_in.module_loads()
    run = handle.run  # kept by the caller, as launch caches do; Triton loads its own module
    tritons_loads = stand_in.module_loads() - loads
    run_args = _run_args(handle)
    assert type(run) is _C.RunLauncher
    for _ in range(2):
        run(*run_args, *args, 64)
    return [(run, (*run_args, *args, 64), tritons_loads)]


@pytest.mark.parametrize("how", ["autotune", "heuristics", "grid function", "handle", "kept run"])
def test_a_patched_kernel_dropped_after_any_launch_is_collected_with_its_modules(stand_in, how):
    """As above, for each other way a patched kernel launches: its autotuner or heuristics, a
    grid function, its kept handle's launches (whose launcher is remembered natively while the
    handle lives: it must not keep the kernel, whose cache keeps the handle, alive), and the
    handle's ``run`` kept past the kernel (which launches natively until it is dropped too)."""
    x = torch.randn(64)
    registry = getattr(triton.runtime.jit, "_triton_jit_function_registry", {})
    refs, kept = [], []
    gc.collect()
    loads, unloads = stand_in.module_loads(), stand_in.module_unloads()
    with _triton_on_stand_in(stand_in, patched=True):
        for _ in range(3):
            jit_fn = JITFunction(kernels.add_kernel.fn)
            kept += _launch_dropped_kernel(jit_fn, how, x, stand_in)
            refs.append(weakref.ref(jit_fn))
            for name in [name for name, fn in registry.items() if fn is jit_fn]:
                del registry[name]  # Triton (>= 3.6) keeps the newest kernel of each name
            del jit_fn
        gc.collect()
        for i in range(len(kept)):  # the run keeps its handle, and launches as before
            before = stand_in.last_launch()
            assert kept[i][0](*kept[i][1]) is None
            assert_same_launch(stand_in.last_launch(), before)
        assert [ref() is not None for ref in refs] == [bool(kept)] * 3
        # Triton unloads the modules of its own CompiledKernels when they are freed from 3.8
        # (CompiledKernel.__del__); before, it never does.
        never_unloaded = 0 if hasattr(CompiledKernel, "__del__") else sum(k[2] for k in kept)
        kept.clear()
        gc.collect()
        gc.collect()  # a launcher freed in the first collection leaves a cycle of its own
        assert [ref() for ref in refs] == [None, None, None]
        loaded = stand_in.module_loads() - loads
        assert loaded > 0 and stand_in.module_unloads() - unloads == loaded - never_unloaded


def _grouped_autotuned(
    prune, configs=(triton.Config({}, num_warps=4), triton.Config({}, num_warps=2))
):
    jit_fn = JITFunction(kernels.grouped_kernel.fn)
    _KEPT.append(jit_fn)
    return triton.autotune(
        configs=list(configs),
        key=["n"],
        do_bench=_timer([1.0, 2.0]),
        prune_configs_by={"early_config_prune": prune},
    )(jit_fn)


def _launch_twice_each_way(stand_in, make, call):
    """Patched, then unpatched Triton (a fresh autotuner each way): the launches each made for
    two calls of ``call`` (tuning launches included), and what each call's grid read."""
    results = []
    for patched in (True, False):
        tuned, seen = make(), []
        stand_in.reset()
        with _triton_on_stand_in(stand_in, patched=patched):
            call(tuned, seen)
            call(tuned, seen)
        results.append((stand_in.launches(), seen))
    return results


def test_a_pruned_config_setting_what_no_declared_config_sets_is_launched_as_triton_does(stand_in):
    """Pruned configs may set a parameter the declared configs leave alone: one with a default
    (GROUP), which the native record cannot carry (the call goes through Triton's run), or a
    required one (BLOCK), which the call leaves out; every launch is Triton's."""
    x, out = torch.randn(N), torch.empty(N)

    def prune(configs, nargs, **_):
        return [triton.Config({"BLOCK": 256, "GROUP": 4}, num_warps=c.num_warps) for c in configs]

    def call(tuned, seen):
        def grid(meta):
            seen.append((meta["BLOCK"], meta["GROUP"]))
            return (triton.cdiv(meta["n"], meta["BLOCK"]) * meta["GROUP"],)

        tuned[grid](x, out, N)

    ours, theirs = _launch_twice_each_way(stand_in, lambda: _grouped_autotuned(prune), call)
    assert ours[1] == theirs[1] == [(256, 4)] * 4  # the two benchmarked configs, two calls
    assert len(ours[0]) == len(theirs[0]) == 4  # two configs benchmarked, two calls
    for mine, triton_launch in zip(ours[0], theirs[0]):
        assert_same_launch(mine, triton_launch)
    assert ours[0][-1].grid == (N // 256 * 4, 1, 1)

    y = torch.randn(N)

    def prune_block_only(configs, nargs, **_):
        return [triton.Config({"BLOCK": 512}, num_warps=c.num_warps) for c in configs]

    def call_add(tuned, seen):
        def grid(meta):
            seen.append(meta["BLOCK"])
            return (triton.cdiv(meta["n"], meta["BLOCK"]),)

        tuned[grid](x, y, out, N)

    def make_add():
        configs = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=2)]
        return triton.autotune(
            configs=configs,
            key=["n"],
            do_bench=_timer([1.0, 2.0]),
            prune_configs_by={"early_config_prune": prune_block_only},
        )(_fresh_add_kernel())

    ours, theirs = _launch_twice_each_way(stand_in, make_add, call_add)
    assert ours[1] == theirs[1] == [512] * 4
    assert [launch.grid for launch in ours[0]] == [launch.grid for launch in theirs[0]]
    for mine, triton_launch in zip(ours[0], theirs[0]):
        assert_same_launch(mine, triton_launch)


def test_best_config_set_by_user_code_is_set_again_by_the_next_hit(stand_in):
    tuned = _autotuned([3.0, 1.0])
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        tuned[(4,)](x, y, out, N)
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        tuned.best_config = None
        seen = []
        tuned[lambda meta: seen.append(tuned.best_config) or (4,)](x, y, out, N)
        assert seen == [CONFIGS[1]] and tuned.best_config is CONFIGS[1]
        del tuned.best_config
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        assert _stats_of(tuned)["hits"] == 3


def test_best_config_changed_in_the_instance_dict_is_set_again_by_the_next_hit(stand_in):
    """A hit skips reading the autotuner's instance dict while the dict is the one it last read,
    at the same version (PEP 509): a store straight into the dict, and a new ``__dict__``, both
    change that, so the next hit sets ``best_config`` again."""
    tuned = _autotuned([3.0, 1.0])
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for _ in range(3):  # tunes, then hits that find best_config in place and keep the dict
            tuned[(4,)](x, y, out, N)
            assert tuned.best_config is CONFIGS[1]
        vars(tuned)["best_config"] = CONFIGS[0]
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        tuned[(4,)](x, y, out, N)
        vars(tuned).pop("best_config")
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        tuned[(4,)](x, y, out, N)
        tuned.__dict__ = {**vars(tuned), "best_config": None}
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        tuned[(4,)](x, y, out, N)
        assert tuned.best_config is CONFIGS[1]
        assert _stats_of(tuned)["hits"] == 8


def test_a_run_assigned_on_the_instance_is_what_a_launch_calls(stand_in):
    """``kernel[grid]`` is Triton's ``self.run(...)``: a ``run`` set on the instance (a tracing
    wrapper) is called, on an autotuner and on a plain kernel."""
    x, y, out = _tensors()
    for kernel in (_autotuned([1.0, 2.0]), _fresh_add_kernel()):
        inner, calls = kernel.run, []

        def traced(*args, inner=inner, calls=calls, **kwargs):
            calls.append(kwargs["grid"])
            return inner(*args, **kwargs)

        kernel.run = traced
        extra = {} if isinstance(kernel, Autotuner) else {"BLOCK": 256}
        with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
            kernel[(4,)](x, y, out, N, **extra)
            kernel[(4,)](x, y, out, N, **extra)
        assert calls == [(4,), (4,)]


def test_a_run_assigned_or_deleted_after_native_launches_is_seen(stand_in):
    """A ``run`` assigned on an instance that already launched natively is what its next launch
    calls, as in Triton (its native dispatch is dropped); deleting it serves the kernel
    natively again, with the same dispatch. On a plain kernel, an autotuner and a heuristics."""
    x, y, out = _tensors()
    heuristic = triton.heuristics({"BLOCK": lambda args: 256})(_fresh_add_kernel())
    _KEPT.append(heuristic)
    for kernel in (_fresh_add_kernel(), _autotuned([1.0, 2.0]), heuristic):
        extra = {"BLOCK": 256} if type(kernel) is JITFunction else {}
        calls: list = []
        with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
            for _ in range(2):
                kernel[(4,)](x, y, out, N, **extra)
            hits = _stats_of(kernel)["hits"]
            assert hits == 1
            inner = kernel.run

            def traced(*args, inner=inner, calls=calls, **kwargs):
                calls.append(kwargs["grid"])
                return inner(*args, **kwargs)

            kernel.run = traced
            assert kernel.run is traced and vars(kernel)["run"] is traced
            launches = stand_in.launch_count()
            kernel[(4,)](x, y, out, N, **extra)
            assert calls == [(4,)] and stand_in.launch_count() == launches + 1
            del kernel.run
            with pytest.raises(AttributeError, match="run"):
                del kernel.run
            for _ in range(2):
                kernel[(4,)](x, y, out, N, **extra)
            assert calls == [(4,)]
            assert _stats_of(kernel)["hits"] == hits + 2, type(kernel)
        assert "run" not in vars(kernel)


def _stack_with_a_run_below(over: str):
    """(the object a call launches, the object under it whose ``run`` the test sets)."""
    kernel = _fresh_add_kernel()
    if over == "autotuner":
        top = _autotuned([1.0, 2.0])
        return top, top.fn
    if over.startswith("heuristics over autotuner"):
        tuned = _autotuned([1.0, 2.0])
        top = triton.heuristics({})(tuned)
        _KEPT.append(top)
        return top, tuned.fn if over.endswith("kernel") else tuned
    heuristics = triton.heuristics({"BLOCK": lambda args: 256})(kernel)
    _KEPT.append(heuristics)
    if over == "heuristics":
        return heuristics, kernel
    top = triton.heuristics({})(heuristics)
    _KEPT.append(top)
    return top, heuristics if over == "stack level" else kernel


@pytest.mark.parametrize(
    "over",
    [
        "heuristics",
        "stack level",
        "stack kernel",
        "autotuner",
        "heuristics over autotuner",
        "heuristics over autotuner kernel",
    ],
)
def test_a_run_set_under_a_heuristics_or_autotuner_is_what_its_launches_call(stand_in, over):
    """Triton's ``Heuristics.run`` and ``Autotuner.run`` launch through ``self.fn.run``: a
    ``run`` set on the kernel or heuristics level under them, before their first launch or after
    native ones, is called as in Triton (the same calls, tuning included); once it is deleted,
    their launches are native hits again."""
    x, y, out = _tensors()
    calls: dict[bool, list] = {}
    hits: list[int] = []
    for on in (False, True):
        top, below = _stack_with_a_run_below(over)
        seen = calls[on] = []
        inner = below.run

        def traced(*args, inner=inner, seen=seen, **kwargs):
            seen.append(kwargs["grid"])
            return inner(*args, **kwargs)

        with _triton_on_stand_in(stand_in, patched=on):
            below.run = traced
            top[(4,)](x, y, out, N)
            top[(2,)](x, y, out, N)
            del below.run
            for _ in range(3):
                top[(4,)](x, y, out, N)
            if on:
                hits.append(_stats_of(top)["hits"])
            below.run = traced
            top[(1,)](x, y, out, N)
            del below.run
    assert calls[True] == calls[False] and calls[True][-1] == (1,)
    assert hits == [2]  # a miss (its dispatch is new), then two hits


def _stack_and_its_change(what: str):
    """(the object a call launches, the kernels it may launch, a function that assigns one
    attribute its dispatch is built from)."""
    k1, k2 = _fresh_add_kernel(), _fresh_add_kernel()
    if "autotuner" in what:
        tuned = _autotuned([1.0, 2.0, 3.0, 0.5])  # CONFIGS[0]; after a retune, CONFIGS[1]
        k1 = tuned.fn
        top = tuned
        if what.startswith("heuristics over"):  # the autotuner under a heuristics
            top = triton.heuristics({})(tuned)
            _KEPT.append(top)

        def change():
            if what.endswith("autotuner fn"):
                tuned.fn = k2
            elif what.endswith("autotuner cache"):
                tuned.cache = {}
            elif what.endswith("autotuner keys"):
                tuned.keys = []  # a new Triton key for every call: tuned again
            else:
                tuned.configs = [triton.Config({"BLOCK": 128}, num_warps=1)]
                tuned.cache = {}

        return top, (k1, k2), change
    heuristics = triton.heuristics({"BLOCK": lambda args: 256})(k1)
    top = heuristics if what.startswith("heuristics") else triton.heuristics({})(heuristics)
    _KEPT.extend((heuristics, top))

    def change():
        if what.endswith(" fn"):
            heuristics.fn = k2
        else:
            heuristics.values = {"BLOCK": lambda args: 512}

    return top, (k1, k2), change


@pytest.mark.parametrize(
    "what",
    [
        "heuristics values",
        "heuristics fn",
        "stack level values",
        "stack level fn",
        "autotuner fn",
        "autotuner cache",
        "autotuner keys",
        "autotuner configs",
        "heuristics over autotuner fn",
        "heuristics over autotuner cache",
    ],
)
def test_an_attribute_a_dispatch_is_built_from_assigned_after_native_launches(stand_in, what):
    """Triton's ``Heuristics.run`` and ``Autotuner.run`` read ``fn``, ``values``, ``configs``,
    ``keys`` and ``cache`` on every call: one assigned after native hits (on the object
    launched, or on a heuristics level under it) changes the next launches as it does in
    Triton: the other kernel, the new value, a new tuning."""
    launched: dict[bool, list] = {}
    for on in (False, True):
        top, kernels_, change = _stack_and_its_change(what)
        x, y, out = _tensors()
        got = launched[on] = []
        with _triton_on_stand_in(stand_in, patched=on):
            for i in range(5):
                if i == 2:
                    change()
                compiled = top[(4,)](x, y, out, N)
                got.append(
                    (
                        kernels_.index(compiled.src.fn),
                        sorted(map(repr, compiled.src.constants.values())),
                        stand_in.last_launch().block,
                    )
                )
            if on:
                assert _stats_of(top)["hits"] >= 1
    assert launched[True] == launched[False]
    assert launched[True][1] == launched[True][0] != launched[True][2] == launched[True][4]


def _launched_through(cls):
    """A fresh kernel object of ``cls`` (a JITFunction of add_kernel, or an autotuner or a
    heuristics over one), and the keywords its calls add."""
    if cls is Autotuner:
        return _autotuned([1.0, 2.0]), {}
    if cls is Heuristics:
        launched = triton.heuristics({"BLOCK": lambda args: 256})(_fresh_add_kernel())
        _KEPT.append(launched)
        return launched, {}
    return _fresh_add_kernel(), {"BLOCK": 256}


@pytest.mark.parametrize("replaced", ["before patch()", "with functools.wraps", "while patched"])
@pytest.mark.parametrize("cls", [JITFunction, Autotuner, Heuristics], ids=lambda c: c.__name__)
def test_a_run_another_library_assigns_on_the_class_is_kept(stand_in, cls, replaced):
    """A library may replace ``run`` on Triton's class itself (vLLM's
    ``VLLM_TRITON_FORCE_FIRST_CONFIG`` replaces ``Autotuner.run``): assigned before
    :func:`fastkernel.patch` (``functools.wraps`` copying Triton's names included) or while
    patched, every launch goes through it, what it launches through a kernel's ``run`` stays
    native, and ``unpatch()`` leaves it in place."""
    original = cls.__dict__["run"]
    calls = []

    @functools.wraps(original)
    def wrapped(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    def run(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    if replaced == "with functools.wraps":
        run = wrapped
    launched, extra = _launched_through(cls)
    x, y, out = _tensors()
    try:
        if replaced != "while patched":
            cls.run = run
        with TritonReference(stand_in, TEST_STREAM):
            fastkernel.patch()
            try:
                if replaced == "while patched":
                    cls.run = run
                for _ in range(3):
                    launched[(4,)](x, y, out, N, **extra)
                if cls is not JITFunction:  # the kernel under it launches natively
                    assert _stats_of(launched.fn)["hits"] >= 1
            finally:
                fastkernel.unpatch()
        assert cls.__dict__["run"] is run
    finally:
        cls.run = original
    assert calls == [cls.__name__] * 3


@pytest.mark.parametrize("cls", [JITFunction, Autotuner, Heuristics], ids=lambda c: c.__name__)
def test_a_run_assigned_on_the_class_for_a_while_is_called_then_native_again(stand_in, cls):
    """SGLang's ``replay_launches`` records a wrapper's launches so: ``saved = JITFunction.run;
    JITFunction.run = recorder; ...; JITFunction.run = saved``. While patched, after the
    kernel launched natively: each launch in between goes through the recorder (the native
    subscript sees the class change), and afterwards the kernel launches natively again, as
    does one first launched afterwards; ``unpatch()`` then gives Triton's own ``run`` back."""
    tritons = cls.__dict__["run"]
    launched, extra = _launched_through(cls)
    later, _ = _launched_through(cls)
    x, y, out = _tensors()
    calls = []
    with TritonReference(stand_in, TEST_STREAM):
        fastkernel.patch()
        try:
            for _ in range(2):
                launched[(4,)](x, y, out, N, **extra)
            saved = cls.run

            def recorder(self, *args, **kwargs):
                calls.append(type(self).__name__)
                return saved(self, *args, **kwargs)

            cls.run = recorder
            launched[(4,)](x, y, out, N, **extra)
            later[(4,)](x, y, out, N, **extra)
            cls.run = saved
            hits = _stats_of(launched)["hits"]
            for _ in range(2):
                launched[(4,)](x, y, out, N, **extra)
                later[(4,)](x, y, out, N, **extra)
            assert _stats_of(launched)["hits"] == hits + 2
            assert _stats_of(later)["hits"] >= 1
            # A run set on an instance is still watched (Triton's [grid] calls it).
            below = launched if cls is JITFunction else launched.fn
            inner = below.run

            def traced(*args, **kwargs):
                calls.append("instance")
                return inner(*args, **kwargs)

            below.run = traced
            launched[(4,)](x, y, out, N, **extra)
            del below.run
        finally:
            fastkernel.unpatch()
    assert cls.__dict__["run"] is tritons
    assert calls == [cls.__name__] * 2 + ["instance"]


def test_heuristics_made_anew_over_one_kernel_leave_nothing_behind(stand_in):
    """What the patch notes of a heuristics over a kernel (so that a ``run`` set on the kernel
    drops its dispatch) goes with it: wrappers made and dropped again and again over one kernel
    hold no memory."""
    patch_module = importlib.import_module(
        "fastkernel.patch"
    )  # the package's `patch` is a function
    kernel = _fresh_add_kernel()
    x, y, out = _tensors()

    def noted() -> int:
        entry = patch_module._under.get(id(kernel))
        return 0 if entry is None else len(entry[1])

    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for _ in range(20):
            heuristics = triton.heuristics({"BLOCK": lambda args: 256})(kernel)
            heuristics[(4,)](x, y, out, N)
            assert noted() >= 1
            del heuristics
            gc.collect()
        assert noted() == 0


def test_autotuner_run_without_warmup_raises_tritons_error(stand_in):
    tuned = _autotuned([1.0, 2.0])
    x, y, out = _tensors()
    errors = []
    for on in (True, False):
        with _triton_on_stand_in(stand_in, patched=on):
            tuned[(4,)](x, y, out, N)
            with pytest.raises(TypeError) as info:
                tuned.run(x, y, out, N, grid=(4,))
            errors.append(str(info.value))
    assert errors[0] == errors[1] and "warmup" in errors[0]


def test_a_heuristic_testing_a_constexpr_it_names_at_run_time_gets_tritons_value(stand_in):
    """Whether a defaulted constexpr was passed is keyed only for names a heuristic spells; one
    that builds the name at run time sees the call as Triton passes it."""
    x, out = torch.randn(N), torch.empty(N)
    heuristic = triton.heuristics(
        {"BLOCK": lambda args, p="GRO": 256 if p + "UP" in args else 128}
    )(JITFunction(kernels.grouped_kernel.fn))
    _KEPT.append(heuristic.fn)
    seen: list = []

    def grid(meta):
        seen.append(meta["BLOCK"])
        return (1,)

    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        for group in (None, 1, None, 1):
            heuristic[grid](x, out, N, **({} if group is None else {"GROUP": group}))
    assert seen == [128, 256, 128, 256]


def test_a_tuned_hit_returns_the_compiled_kernel_this_process_compiled(
    stand_in, tmp_path, monkeypatch
):
    """The autotuner's registration finds the binary its kernel's own launch compiled in this
    process: a hit returns that CompiledKernel, as Triton's run does, not the disk cache's
    read-only CachedKernel of it."""
    monkeypatch.setenv("FASTKERNEL_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached yet
    tuned = _autotuned([3.0, 1.0])
    x, y, out = _tensors()
    with fastkernel.patched(), TritonReference(stand_in, TEST_STREAM):
        first = tuned[(4,)](x, y, out, N)
        hits = [tuned[(4,)](x, y, out, N) for _ in range(2)]
        assert _stats_of(tuned)["hits"] == 2
    assert isinstance(first, CompiledKernel)
    assert hits[0] is first and hits[1] is first


def _function_attributes(compiled) -> tuple[int, int, int]:
    return compiled.n_regs, compiled.n_spills, compiled.n_max_threads


def test_what_a_native_launch_returns_has_the_attributes_tritons_loader_sets(stand_in):
    """n_regs, n_spills and n_max_threads, which Triton's CompiledKernel._init_handles sets from
    its driver (driver.c loadBinary): on the CompiledKernel a native miss compiled, and on the
    disk cache's CachedKernel that another kernel of the same source registers from, as Triton
    gives them for the same binary. A CompiledKernel Triton never loaded had none of them."""
    stand_in.set_function_defaults(1024, 40, 12)  # what a real driver reads from the cubin
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=False):
        reference = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
    with _triton_on_stand_in(stand_in, patched=True):
        compiled = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        cached = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
    assert isinstance(reference, CompiledKernel)
    assert _function_attributes(reference) == (40, 3, 1024)
    assert isinstance(compiled, CompiledKernel) and compiled.module is None  # loaded natively
    assert _function_attributes(compiled) == _function_attributes(reference)
    assert isinstance(cached, fastkernel.cache.CachedKernel)
    assert _function_attributes(cached) == _function_attributes(reference)


def test_what_a_warm_launch_returns_launches_through_tritons_launcher_as_triton_s_does(stand_in):
    """Libraries with launch caches of their own keep what ``kernel[grid](...)`` returns and
    launch it with Triton's launcher: ``h.run(gx, gy, gz, stream, h.function,
    h.packed_metadata, h.launch_metadata(grid, stream, *args), enter, exit, *args)``. The disk
    cache's CachedKernel, which a process whose binary is cached gets, takes that launch as
    Triton's CompiledKernel of the same binary does, byte for byte, launch hooks included, with
    a module Triton loads for it (not the launch table's). It had no ``run``, ``function`` or
    ``packed_metadata``."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)  # every argument, the constexpr too, as JITFunction.run passes
    with _triton_on_stand_in(stand_in, patched=False):
        reference = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
    runtime = triton.knobs.runtime
    with _triton_on_stand_in(stand_in, patched=True):
        _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)  # compiled, stored on disk
        cached = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        assert isinstance(cached, fastkernel.cache.CachedKernel)
        loads = stand_in.module_loads()
        assert cached.function and cached.module  # loaded when read, as Triton's loader does
        assert stand_in.module_loads() == loads + 1  # its own module
        assert cached.function and stand_in.module_loads() == loads + 1  # once
        seen, launches = [], []
        saved_hook = runtime.launch_enter_hook
        runtime.launch_enter_hook = lambda metadata: seen.append(dict(metadata.get()))
        try:
            for handle in (reference, cached):
                metadata = handle.launch_metadata((4, 1, 1), TEST_STREAM, *args)
                enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
                handle.run(
                    4,
                    1,
                    1,
                    TEST_STREAM,
                    handle.function,
                    handle.packed_metadata,
                    metadata,
                    enter,
                    exit_,
                    *args,
                )
                launches.append(stand_in.launches()[-1])
        finally:
            runtime.launch_enter_hook = saved_hook
        assert_same_launch(launches[1], launches[0])
        assert [m["name"] for m in seen] == ["add_kernel", "add_kernel"]
        assert [m["function"] for m in seen] == [reference.function, cached.function]
        assert [m["stream"] for m in seen] == [TEST_STREAM, TEST_STREAM]
        launches.clear()
        before = _handle_stats(kernels.add_kernel) or {"misses": 0, "fallbacks": 0}
        _tritons_runner(reference, (4, 1, 1))(*args)  # CompiledKernel.__getitem__'s runner
        launches.append(stand_in.launches()[-1])
        cached[(4, 1, 1)](*args)  # under the patch: the native launch of its binary
        launches.append(stand_in.launches()[-1])
        assert_same_launch(launches[1], launches[0])
        after = _handle_stats(kernels.add_kernel)
        assert after["misses"] == before["misses"] + 1
        assert after["fallbacks"] == before["fallbacks"]
    assert cached.packed_metadata == reference.packed_metadata
    with pytest.raises(TypeError):
        iter(cached)  # not a sequence, although it has __getitem__


def test_a_warm_launchs_cached_kernel_is_a_handle_of_its_own(stand_in, monkeypatch):
    """Under the patch, ``cached[grid](*args)`` of the disk cache's CachedKernel (what a launch
    returns in a process whose binary is cached; what launch caches keep) is the native launch
    of its binary with no Triton CompiledKernel made or loaded for it; after the first, its
    launches skip the Python path, as a CompiledKernel's do."""
    calls = _python_handle_launches(monkeypatch)
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    with _triton_on_stand_in(stand_in, patched=False):
        reference = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        _tritons_runner(reference, (4, 1, 1))(*args)
        theirs = stand_in.last_launch()
    with _triton_on_stand_in(stand_in, patched=True):
        _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)  # compiled, stored on disk
        cached = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        assert isinstance(cached, fastkernel.cache.CachedKernel)
        loads = stand_in.module_loads()
        for _ in range(3):
            cached[(4, 1, 1)](*args)
            assert_same_launch(stand_in.last_launch(), theirs)
        launcher = _C.handle_launcher(cached)
    assert len(calls) == 1 and isinstance(launcher, CompiledLaunch)
    assert (launcher.stats()["misses"], launcher.stats()["hits"]) == (1, 2)
    assert stand_in.module_loads() == loads + 1  # the launcher's own, once
    assert "_triton" not in cached.__dict__  # no Triton CompiledKernel was made for it


def _run_args(handle, stream=TEST_STREAM, enter=None, exit_=None, function=None):
    """The leading arguments of Triton's launcher object, as vLLM's ``CachedKernel`` passes
    them: grid, stream, the handle's function and packed metadata, no launch metadata, hooks."""
    function = handle.function if function is None else function
    return (4, 1, 1, stream, function, handle.packed_metadata, None, enter, exit_)


@pytest.mark.parametrize("handle_kind", ["compiled", "cached"])
def test_a_handles_run_launches_natively_as_tritons_launcher_does(stand_in, handle_kind):
    """Launch caches keep ``compiled.run`` (Triton's launcher object) and call it directly
    (vLLM's ``CachedKernel``). Under the patch ``run`` of a served kernel's handle (Triton's
    CompiledKernel, or the disk cache's CachedKernel) is a native launcher object: the same
    bytes as Triton's launcher, a miss then native hits on the handle's launcher, no fallback."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)  # every argument, the constexpr too, as JITFunction.run passes
    with _triton_on_stand_in(stand_in, patched=False):
        reference = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        reference.run(*_run_args(reference), *args)
        theirs = stand_in.last_launch()
    with _triton_on_stand_in(stand_in, patched=True):
        handle = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        if handle_kind == "cached":
            handle = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
            assert isinstance(handle, fastkernel.cache.CachedKernel)
        run = handle.run
        assert type(run) is _C.RunLauncher
        for _ in range(3):
            assert run(*_run_args(handle), *args) is None
            assert_same_launch(stand_in.last_launch(), theirs)
        stats = _C.handle_launcher(handle).stats()
    assert (stats["misses"], stats["hits"], stats["fallbacks"]) == (1, 2, 0), stats
    assert type(handle.run) is not _C.RunLauncher  # unpatched: Triton's own again


def test_a_handles_run_gives_what_the_native_launch_does_not_take_to_tritons_launcher(stand_in):
    """A call of a handle's native ``run`` that Triton's launcher would launch otherwise (another
    stream, another function, a launch hook given or set) or whose arguments the native key does
    not cover (a tensor subclass) goes to Triton's own launcher object, launching what it
    launches, counted as a fallback with the reason; none recurses into the native path."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    seen: list = []
    with _triton_on_stand_in(stand_in, patched=True):
        handle = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        other = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=64)  # another binary
        run = handle.run
        with tritons_own_launches():
            triton_run = handle.run
            other.run  # noqa: B018 - loads it through Triton, which sets its function
        assert type(run) is _C.RunLauncher and type(triton_run) is not _C.RunLauncher
        assert other.function not in (None, handle.function)

        class DataPtr:  # what Triton's launcher takes for a pointer, not a tensor
            def data_ptr(self):
                return x.data_ptr()

        cases = {
            "a stream other than torch's current stream": (
                *_run_args(handle, stream=TEST_STREAM + 16),
                *args,
            ),
            "launch hooks given to Triton's launcher": (
                *_run_args(handle, enter=seen.append),
                *args,
            ),
            "a function other than the handle's": (
                *_run_args(handle, function=other.function),
                *args,
            ),
            "an argument of a kind the native key does not cover": (
                *_run_args(handle),
                DataPtr(),
                *args[1:],
            ),
        }
        for call_args in cases.values():
            triton_run(*call_args)
            theirs = stand_in.last_launch()
            assert run(*call_args) is None
            assert_same_launch(stand_in.last_launch(), theirs)
        assert seen == [None, None]  # the hook given runs, with the launch metadata given
        saved_hook = triton.knobs.runtime.launch_enter_hook
        triton.knobs.runtime.launch_enter_hook = seen.append
        try:
            run(*_run_args(handle), *args)  # the hook set is not given: Triton runs none
        finally:
            triton.knobs.runtime.launch_enter_hook = saved_hook
        assert seen == [None, None]
        stats = _C.handle_launcher(handle).stats()
    reasons = stats["fallback_reasons"]
    for reason in (*cases, "a launch hook set"):
        assert sum(n for r, n in reasons.items() if reason in r) == 1, (reason, list(reasons))
    assert stats["fallbacks"] == 5


def test_a_handles_run_checks_what_it_gives_tritons_launcher_for_arguments_read_past(
    stand_in, patch_on
):
    """A call of a handle's native ``run`` that goes to Triton's own launcher object (here for
    another stream) and whose kernel arguments that launcher would read past (a tuple shorter
    than its type; from Triton 3.7 a runtime argument left out: ``extractArgs`` counts neither)
    raises the TypeError naming the argument, as the native launch does, and launches nothing;
    a sound one launches through Triton's launcher, counted as a fallback."""
    x, y, out = torch.randn(64), torch.randn(64), torch.empty(64)
    with TritonReference(stand_in, TEST_STREAM):
        compiled = kernels.tuple_kernel.warmup(
            out, (x, 2.0), 64, (1.5, (0.5, y)), BLOCK=64, grid=(1,)
        )
        run = compiled.run
        assert type(run) is _C.RunLauncher
        leading = _run_args(compiled, stream=TEST_STREAM + 16)
        launches = stand_in.launch_count()
        with pytest.raises(TypeError, match="tuple_kernel: argument 'nested\\[1\\]': expected"):
            run(*leading, out, (x, 2.0), 64, (1.5, (0.5,)), 64)
        if abi.TRITON_VERSION >= (3, 7):
            with pytest.raises(TypeError, match="tuple_kernel missing required argument 'n'"):
                run(*leading, out, (x, 2.0))
        assert stand_in.launch_count() == launches
        run(*leading, out, (x, 2.0), 64, (1.5, (0.5, y)), 64)
        assert stand_in.launch_count() == launches + 1
        stats = _C.handle_launcher(compiled).stats()
    assert stats["fallbacks"] == 1, stats


@pytest.mark.skipif(
    not hasattr(triton.knobs, "HookChain"), reason="Triton's launch hook knobs hold no HookChain"
)
def test_a_handles_run_given_the_knobs_hook_chains_is_native_while_they_are_empty(stand_in):
    """vLLM's ``CachedKernel`` passes the launch hook knobs' values, empty HookChains by default
    from Triton 3.9, on every call: native while the chains are empty; a hook added to the
    chain later makes the call Triton's, which runs it."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)
    knobs = triton.knobs.runtime
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    assert isinstance(enter, triton.knobs.HookChain) and not enter.calls
    seen: list = []
    with _triton_on_stand_in(stand_in, patched=True):
        handle = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        run = handle.run
        for _ in range(2):
            run(*_run_args(handle, enter=enter, exit_=exit_), *args)
        launcher = _C.handle_launcher(handle)
        assert launcher.stats()["fallbacks"] == 0 and launcher.stats()["hits"] == 1
        enter.add(seen.append)
        try:
            run(*_run_args(handle, enter=enter, exit_=exit_), *args)
        finally:
            enter.remove(seen.append)
        stats = launcher.stats()
    assert seen == [None] and stats["fallbacks"] == 1
    assert any("launch hooks given" in r for r in stats["fallback_reasons"])


@pytest.mark.skipif(
    not hasattr(triton.knobs, "HookChain"), reason="Triton's launch hook knobs hold no HookChain"
)
def test_a_handles_run_in_a_reference_cycle_is_collected(stand_in):
    """A native ``run`` keeps the last HookChain it was given, and a hook in the chain can hold
    the object that keeps the ``run`` (a launch cache with a hook method): the cycle goes
    through the native object, which the garbage collector must see to free it."""
    x, y, out = _tensors()
    args = (x, y, out, N, 1024)

    class LaunchCache:  # keeps the launcher object, as vLLM's CachedKernel does
        def __init__(self, run):
            self.run = run

        def hook(self, metadata):
            pass

    chain = triton.knobs.HookChain()
    with _triton_on_stand_in(stand_in, patched=True):
        handle = _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024)
        cache = LaunchCache(handle.run)
        assert type(cache.run) is _C.RunLauncher
        cache.run(*_run_args(handle, enter=chain), *args)  # native: the chain is kept
        chain.add(cache.hook)  # cache -> run -> chain -> cache.hook -> cache
        gone = weakref.ref(cache)
        del cache, chain
        gc.collect()
        assert gone() is None


def test_a_block_larger_than_the_function_allows_raises_tritons_out_of_resources(stand_in):
    """A function whose registers limit its block below the kernel's 32 * num_warps threads:
    Triton raises OutOfResources when it loads it (CompiledKernel._init_handles), which its
    autotuner takes as a config to skip. The native path refuses the binary when it loads it and
    hands the call to Triton, which raises the same; nothing launches. It used to launch and
    raise the driver's CudaError."""
    from triton.runtime.errors import OutOfResources

    stand_in.set_function_defaults(64, 255, 0)
    x, y, out = _tensors()
    with _triton_on_stand_in(stand_in, patched=False):
        with pytest.raises(OutOfResources) as reference:
            _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024, num_warps=4)
    kernel = _fresh_add_kernel()
    with _triton_on_stand_in(stand_in, patched=True):
        for _ in range(2):  # the refused binary is remembered: the second call goes to Triton
            with pytest.raises(OutOfResources) as native:
                kernel[(4,)](x, y, out, N, BLOCK=1024, num_warps=4)
            assert str(native.value) == str(reference.value)
        assert _stats_of(kernel)["misses"] == 2 and _stats_of(kernel)["specializations"] == 0
    assert stand_in.launch_count() == 0


def test_a_disk_cache_entry_the_device_cannot_run_is_kept(stand_in, caplog):
    """A binary refused for the device's resources is sound: a kernel meeting it in the disk
    cache (another process, another kernel of the same source) hands the call to Triton and
    keeps the entry. It was taken for corrupt: removed, logged, compiled and stored again."""
    from triton.runtime.errors import OutOfResources

    stand_in.set_function_defaults(64, 255, 0)
    x, y, out = _tensors()
    caplog.set_level(logging.INFO, logger="fastkernel")
    cache_dir = pathlib.Path(os.environ["FASTKERNEL_CACHE_DIR"])
    with _triton_on_stand_in(stand_in, patched=True):
        for i in range(3):
            with pytest.raises(OutOfResources):
                _fresh_add_kernel()[(4,)](x, y, out, N, BLOCK=1024, num_warps=4)
            if i == 0:
                entries = sorted(cache_dir.rglob("*.fkc"))
                stamps = [p.stat().st_mtime_ns for p in entries]
    assert len(entries) == 1
    assert [p.stat().st_mtime_ns for p in entries] == stamps  # not removed and written again
    assert "removed" not in caplog.text and "corrupt" not in caplog.text
