"""Triton's launch hooks, pre-run hooks and binary-changing knobs on the native path.

Hooks set after the first call are honoured, knob changes select a new binary (and changing
them back returns to the old one), and nothing in Python runs on a hit while they are unset."""

from __future__ import annotations

import contextlib
import gc
import struct

import kernels
import pytest
import torch
import triton
from conftest import TEST_STREAM
from triton import knobs
from triton_reference import TritonReference, assert_same_launch

from fastkernel import _C, fastkernel
from fastkernel import _triton_abi as abi
from fastkernel import patched as fastkernel_patched
from fastkernel.kernel import PATCH_ATTR

X = torch.randn(64)


@pytest.fixture
def add(stand_in):
    k = fastkernel(kernels.add_kernel)
    k[(1,)](X, X, X, 64, BLOCK=64)  # the first call happens before any hook is set
    return k


@pytest.fixture
def hook_log():
    events = []

    # Hooks receive Triton's LazyDict; .get() materializes it (as Triton's profilers do).
    def enter(metadata):
        d = metadata.get()
        events.append(("enter", d["name"], d["stream"], d["function"]))

    def exit(metadata):
        events.append(("exit", metadata.get()["name"]))

    knobs.runtime.launch_enter_hook.add(enter)
    knobs.runtime.launch_exit_hook.add(exit)
    try:
        yield events
    finally:
        knobs.runtime.launch_enter_hook.remove(enter)
        knobs.runtime.launch_exit_hook.remove(exit)


def test_launch_hooks_added_after_the_first_call_run_around_each_launch(add, stand_in, hook_log):
    add[(1,)](X, X, X, 64, BLOCK=64)
    assert [e[0] for e in hook_log] == ["enter", "exit"]
    _, name, stream, function = hook_log[0]
    assert name == "add_kernel" and stream == TEST_STREAM and function != 0
    assert len(stand_in.launches()) == 2
    assert add.stats()["hits"] == 1  # still the native path


def test_removed_hooks_stop_running(add, stand_in):
    calls = []
    hook = calls.append
    knobs.runtime.launch_enter_hook.add(hook)
    add[(1,)](X, X, X, 64, BLOCK=64)
    knobs.runtime.launch_enter_hook.remove(hook)
    add[(1,)](X, X, X, 64, BLOCK=64)
    assert len(calls) == 1 and len(stand_in.launches()) == 3


def test_a_plain_callable_assigned_as_hook(add, stand_in):
    calls = []
    knobs.runtime.launch_enter_hook = calls.append
    try:
        add[(1,)](X, X, X, 64, BLOCK=64)
    finally:
        del knobs.runtime.launch_enter_hook  # back to the class's HookChain
    add[(1,)](X, X, X, 64, BLOCK=64)
    assert len(calls) == 1 and calls[0].get()["name"] == "add_kernel"


def test_a_hook_assigned_by_the_grid_function_runs_for_that_launch(add, stand_in):
    # Triton calls the grid function first and reads both hook knobs after it
    # (triton/runtime/jit.py JITFunction.run): a hook the grid assigns runs for the same launch.
    calls = []

    def grid(meta):
        knobs.runtime.launch_enter_hook = calls.append
        return tuple([1])  # a call fastkernel's grid programs do not translate: run in Python

    try:
        add[grid](X, X, X, 64, BLOCK=64)
    finally:
        del knobs.runtime.launch_enter_hook
    assert len(calls) == 1 and calls[0].get()["name"] == "add_kernel"
    assert add._grid_counts() == (0, 1)


def test_a_failing_enter_hook_raises_and_launches_nothing(add, stand_in):
    def enter(metadata):
        raise RuntimeError("profiler says no")

    knobs.runtime.launch_enter_hook.add(enter)
    try:
        with pytest.raises(RuntimeError, match="profiler says no"):
            add[(1,)](X, X, X, 64, BLOCK=64)
    finally:
        knobs.runtime.launch_enter_hook.remove(enter)
    assert len(stand_in.launches()) == 1


def test_kernel_launch_metadata_callback_reaches_hooks(stand_in, hook_log):
    def describe(grid, metadata, args):
        return {"bytes": args["n"] * 4 * 3, "grid": grid}

    k = fastkernel(triton.jit(kernels.add_kernel.fn, launch_metadata=describe))
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        k[(2,)](X, X, X, 64, BLOCK=32)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    metadata = seen[0].get()
    assert metadata["bytes"] == 64 * 12 and metadata["grid"] == (2, 1, 1)
    assert metadata["name"] == "add_kernel"


def test_a_tuned_hits_launch_metadata_sees_the_configs_values(stand_in, hook_log):
    """A tuple grid reads no tuned value, but the launch hooks do: the kernel's
    ``launch_metadata`` callback gets the config's ``BLOCK`` on a native hit, as Triton's
    autotuner passes it."""

    def describe(grid, metadata, args):
        return {"block": args["BLOCK"]}

    jit_fn = triton.jit(kernels.add_kernel.fn, launch_metadata=describe)
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])(jit_fn)
    seen = []
    with fastkernel_patched(), TritonReference(stand_in, TEST_STREAM):
        knobs.runtime.launch_enter_hook.add(seen.append)
        try:
            for _ in range(3):
                tuned[(2,)](X, X, X, 64)
        finally:
            knobs.runtime.launch_enter_hook.remove(seen.append)
        hits = tuned.__dict__[PATCH_ATTR].stats()["hits"]
    assert hits == 2 and [m.get()["block"] for m in seen] == [32] * 3


def test_pre_run_hooks_added_after_the_first_call(add, stand_in):
    seen = []
    hooks = add.jit_function.pre_run_hooks  # kernels.add_kernel's, which other tests launch
    hooks.append(lambda *args, **kwargs: seen.append((len(args), kwargs)))
    try:
        add[(1,)](X, X, X, 64, BLOCK=64)
    finally:
        hooks.pop()
    # The call's keywords and the options JITFunction.run adds before calling the hooks.
    (call,) = seen
    assert call[0] == 4 and call[1]["BLOCK"] == 64 and call[1]["debug"] is False
    assert sorted(call[1]) == sorted(["BLOCK", *abi.RUN_ADDED_OPTIONS])


def test_debug_knob_selects_a_new_binary_and_back(add, stand_in):
    assert add._compiled[0].metadata.debug is False
    knobs.runtime.debug = True
    try:
        add[(1,)](X, X, X, 64, BLOCK=64)
        assert add.stats()["specializations"] == 2
        assert add._compiled[-1].metadata.debug is True
    finally:
        knobs.runtime.debug = False
    add[(1,)](X, X, X, 64, BLOCK=64)
    stats = add.stats()
    assert stats["specializations"] == 2 and stats["misses"] == 2 and stats["hits"] == 1


def test_a_kernels_own_debug_set_after_launches_selects_its_binary(stand_in):
    # Triton reads the kernel's debug attribute into every call's compile options
    # (JITFunction.run: kwargs.get("debug", self.debug)): set on the @fastkernel kernel, on the
    # function it wraps, or on a patched kernel, the next launch is of the matching binary.
    jit_fn = triton.jit(kernels.add_kernel.fn)
    add = fastkernel(jit_fn)
    for set_on in (add, jit_fn):
        assert add[(1,)](X, X, X, 64, BLOCK=64).metadata.debug is False
        set_on.debug = True
        assert add.debug is True and jit_fn.debug is True
        assert add[(1,)](X, X, X, 64, BLOCK=64).metadata.debug is True
        assert add[(1,)](X, X, X, 64, BLOCK=64).metadata.debug is True  # now a hit
        set_on.debug = False
    patched = triton.jit(kernels.add_kernel.fn)
    with fastkernel_patched():
        assert patched[(1,)](X, X, X, 64, BLOCK=64).metadata.debug is False
        patched.debug = True
        assert patched[(1,)](X, X, X, 64, BLOCK=64).metadata.debug is True


def test_a_kernels_debug_set_while_its_launch_is_in_flight_selects_its_binary(stand_in):
    """Set from the grid of a launch of that very specialization (its record in use), the
    next launch is of the matching binary, as when set between launches."""
    add = fastkernel(triton.jit(kernels.add_kernel.fn))
    flip = []

    def grid(meta):
        if flip:
            add.debug = flip.pop()
        return (1,)

    assert add[grid](X, X, X, 64, BLOCK=64).metadata.debug is False
    flip.append(True)
    add[grid](X, X, X, 64, BLOCK=64)  # the grid sets debug while its record launches
    assert add[grid](X, X, X, 64, BLOCK=64).metadata.debug is True
    assert add.stats()["misses"] == 2


def _on(system: str, stand_in):
    """Triton's own launcher on the stand-in for ``system`` "triton"; nothing for fastkernel."""
    return (
        TritonReference(stand_in, TEST_STREAM) if system == "triton" else contextlib.nullcontext()
    )


def test_knobs_a_pre_run_hook_sets_are_read_when_triton_reads_them(stand_in):
    """Triton reads the binary-changing knobs into the options before the pre-run hooks run,
    and the launch hook knobs when it launches, after them: a pre-run hook setting
    knobs.runtime.debug changes the next call's binary, not this one's, and a launch hook it
    sets runs for this launch. The binaries and hook calls match Triton's."""
    x = torch.randn(64)
    results = []
    chain = knobs.runtime.launch_enter_hook  # Triton's HookChain, put back after each system
    kept = []  # Triton's compiled kernels unload through its driver: freed inside its reference
    for system in ("triton", "fastkernel"):
        jit_fn = triton.jit(kernels.add_kernel.fn)
        kept.append(jit_fn)
        launch = jit_fn if system == "triton" else fastkernel(jit_fn)
        calls = []

        def pre_run(*args, calls=calls, **kwargs):
            knobs.runtime.debug = True
            knobs.runtime.launch_enter_hook = calls.append

        with _on(system, stand_in):
            try:
                jit_fn.pre_run_hooks.append(pre_run)
                first = launch[(1,)](x, x, x, 64, BLOCK=64).metadata.debug
                knobs.runtime.launch_enter_hook = chain
                jit_fn.pre_run_hooks.clear()
                second = launch[(1,)](x, x, x, 64, BLOCK=64).metadata.debug
                knobs.runtime.debug = False
                third = launch[(1,)](x, x, x, 64, BLOCK=64).metadata.debug
            finally:
                knobs.runtime.debug = False
                knobs.runtime.launch_enter_hook = chain
        results.append((first, second, third, len(calls)))
    with TritonReference(stand_in, TEST_STREAM):
        del jit_fn, launch
        kept.clear()
        gc.collect()
    assert results[0] == results[1] == (False, True, False, 1)


def test_knob_scope_restores_the_key(add):
    def key():
        return _C._testing.build_key(add, (X, X, X, 64), {"BLOCK": 64}, 0)[0]

    before = key()
    with knobs.runtime.scope():
        knobs.runtime.debug = True
        inside = key()
    # scope() restores the knobs by rewriting the dict, not by assignment.
    assert inside != before and key() == before


def test_instrumentation_mode_changes_the_key(add):
    def key():
        return _C._testing.build_key(add, (X, X, X, 64), {"BLOCK": 64}, 0)[0]

    before = key()
    with knobs.compilation.scope():
        knobs.compilation.instrumentation_mode = "consan"
        assert key() != before
    assert key() == before


def test_stages_inspection_hook_routes_calls_to_triton(add, stand_in):
    def hook(*args):
        # Called with no arguments for its cache key (jit.py), and by the backend with its
        # stages to inspect (which it leaves as they are).
        return ("key", "hash") if not args else None

    knobs.runtime.add_stages_inspection_hook = hook
    try:
        # Triton's own launcher takes the call (on the stand-in, through TritonReference).
        with TritonReference(stand_in, TEST_STREAM):
            add[(1,)](X, X, X, 64, BLOCK=64)
        assert add.stats()["fallbacks"] == 1
        assert len(stand_in.launches()) == 2
    finally:
        knobs.runtime.add_stages_inspection_hook = None
    add[(1,)](X, X, X, 64, BLOCK=64)
    assert add.stats()["hits"] == 1 and len(stand_in.launches()) == 3


def test_knob_state_is_stable_without_changes():
    assert abi.knob_state()[0] == abi.knob_state()[0]


# torch 2.11's profiler warns that it clears its events at the end of each cycle (torch's own
# notice about profiler schedules, unrelated to what the test checks).
@pytest.mark.filterwarnings("ignore:.*Profiler clears events at the end of each cycle:UserWarning")
def test_profiler_sees_a_named_range_only_while_active(add, stand_in):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            add[(1,)](X, X, X, 64, BLOCK=64)
    names = [event.name for event in prof.events()]
    assert names.count("fastkernel::add_kernel") == 3
    add[(1,)](X, X, X, 64, BLOCK=64)  # no profiler: launches as before
    assert len(stand_in.launches()) == 5 and add.stats()["hits"] == 4


def _hook_scenario(launch) -> list:
    """Events of two launches under chained enter and exit hooks, one enter hook assigning a
    plain callable as the exit hook while the first launch is under way."""
    events: list = []

    def first(metadata):
        events.append(("first", metadata.get()["name"]))

    def second(metadata):
        events.append("second")

    def exit_a(metadata):
        events.append("exit_a")

    def exit_b(metadata):
        events.append("exit_b")

    def replacement(metadata):
        events.append("replacement")

    def swap_exit_hook(metadata):
        if "swapped" not in events:
            events.append("swapped")
            knobs.runtime.launch_exit_hook = replacement

    enter_chain, exit_chain = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    for hook in (first, second, swap_exit_hook):
        enter_chain.add(hook)
    exit_chain.add(exit_a)
    exit_chain.add(exit_b)
    try:
        launch()
        events.append("between")
        launch()
    finally:
        for hook in (first, second, swap_exit_hook):
            enter_chain.remove(hook)
        exit_chain.remove(exit_a)
        exit_chain.remove(exit_b)
        del knobs.runtime.launch_exit_hook  # back to the class's HookChain
    return events


def test_launch_hooks_run_in_tritons_order_with_the_knobs_taken_before_the_launch(add, stand_in):
    """The same hooks around Triton's own launcher and around a native launch: enter hooks in
    order, the (reversed) exit chain backwards, and both knobs read before the enter hooks run,
    so an exit hook assigned by an enter hook serves the next launch."""

    def triton_launch():
        with TritonReference(stand_in, TEST_STREAM):
            kernels.add_kernel[(1,)](X, X, X, 64, BLOCK=64)

    expected = _hook_scenario(triton_launch)
    assert expected == [
        ("first", "add_kernel"),
        "second",
        "swapped",
        "exit_b",
        "exit_a",
        "between",
        ("first", "add_kernel"),
        "second",
        "replacement",
    ]
    hits = add.stats()["hits"]
    assert _hook_scenario(lambda: add[(1,)](X, X, X, 64, BLOCK=64)) == expected
    assert add.stats()["hits"] == hits + 2


def test_a_failing_exit_hook_raises_after_the_launch(add, stand_in):
    def exit(metadata):
        raise RuntimeError("exit hook failed")

    knobs.runtime.launch_exit_hook.add(exit)
    try:
        with pytest.raises(RuntimeError, match="exit hook failed"):
            add[(1,)](X, X, X, 64, BLOCK=64)
    finally:
        knobs.runtime.launch_exit_hook.remove(exit)
    assert len(stand_in.launches()) == 2  # the launch was issued before the exit hook ran


def _metadata_of(launch):
    """The metadata objects an enter hook receives during ``launch()``."""
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launch()
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    return seen


def _shape(metadata):
    return (
        type(metadata),
        list(vars(metadata)),
        metadata.extras,
        [(key, type(value)) for key, value in metadata.data.items()],
        metadata.data["name"],
        metadata.data["stream"],
    )


def test_hook_metadata_is_built_as_tritons_launcher_builds_it(add, stand_in):
    def triton_launch():
        with TritonReference(stand_in, TEST_STREAM):
            kernels.add_kernel[(1,)](X, X, X, 64, BLOCK=64)

    (expected,) = _metadata_of(triton_launch)
    (got,) = _metadata_of(lambda: add[(1,)](X, X, X, 64, BLOCK=64))
    assert _shape(got) == _shape(expected)
    assert _shape(got)[:4] == (
        abi.HOOK_METADATA_TYPE,
        ["data", "extras"],
        [],
        [("name", str), ("function", int), ("stream", int)],
    )


def test_hook_metadata_is_new_on_every_launch(add, stand_in):
    def scribble(metadata):
        metadata.data["name"] = "scribbled"
        metadata.extras.append((dict, ()))

    knobs.runtime.launch_enter_hook.add(scribble)
    try:
        first, second = _metadata_of(lambda: [add[(1,)](X, X, X, 64, BLOCK=64) for _ in "ab"])
    finally:
        knobs.runtime.launch_enter_hook.remove(scribble)
    (third,) = _metadata_of(lambda: add[(1,)](X, X, X, 64, BLOCK=64))
    assert first.data is not second.data and first.extras is not second.extras
    assert first.data["name"] == second.data["name"] == "scribbled"  # each by its own hook call
    assert third.data == {
        "name": "add_kernel",
        "function": first.data["function"],
        "stream": TEST_STREAM,
    }
    assert third.extras == []


def test_hook_metadata_follows_the_stream_of_each_launch(add, stand_in):
    other = TEST_STREAM + 0x100
    _C._testing.set_host_testing(True, 0, other)
    try:
        (on_other,) = _metadata_of(lambda: add[(1,)](X, X, X, 64, BLOCK=64))
    finally:
        _C._testing.set_host_testing(True, 0, TEST_STREAM)
    (on_test,) = _metadata_of(lambda: add[(1,)](X, X, X, 64, BLOCK=64))
    assert (on_other.data["stream"], on_test.data["stream"]) == (other, TEST_STREAM)
    assert [launch.stream for launch in stand_in.launches()[-2:]] == [other, TEST_STREAM]


def test_a_changed_metadata_class_is_constructed_by_calling_it(add, stand_in, monkeypatch):
    """The metadata class is built without its __init__ only while the predicate says that is
    the same thing; a change to the class makes the launch ask again, and call it meanwhile."""
    asked = []

    def plain_check(cls):
        asked.append(cls)
        return abi.plain_lazy_dict(cls)

    lazy_dict = abi.HOOK_METADATA_TYPE
    _C.set_launch_hook_support(lazy_dict, abi.add_launch_metadata, plain_check)
    try:
        _metadata_of(lambda: [add[(1,)](X, X, X, 64, BLOCK=64) for _ in "abc"])
        assert asked == [lazy_dict]  # once, then cached by the class's version tag
        original = lazy_dict.__init__
        inits = []

        def counting_init(self, data):
            inits.append(data["name"])
            original(self, data)

        monkeypatch.setattr(lazy_dict, "__init__", counting_init)
        (metadata,) = _metadata_of(lambda: add[(1,)](X, X, X, 64, BLOCK=64))
        assert inits == ["add_kernel"] and asked == [lazy_dict] * 2
        assert _shape(metadata)[1:3] == (["data", "extras"], [])
        monkeypatch.undo()
        _metadata_of(lambda: [add[(1,)](X, X, X, 64, BLOCK=64) for _ in "ab"])
        assert inits == ["add_kernel"] and asked == [lazy_dict] * 3
    finally:
        _C.set_launch_hook_support(lazy_dict, abi.add_launch_metadata, abi.plain_lazy_dict)


def test_only_tritons_plain_metadata_class_counts_as_plain():
    assert abi.plain_lazy_dict(abi.HOOK_METADATA_TYPE)

    class Same:
        def __init__(self, data):
            self.data = data
            self.extras = []

    class OtherBody:
        def __init__(self, data):
            self.data = dict(data)
            self.extras = []

    class WithDefault:
        def __init__(self, data=None):
            self.data = data
            self.extras = []

    class WithSlots:
        __slots__ = ("data", "extras")

        def __init__(self, data):
            self.data = data
            self.extras = []

    class WithNew(Same):
        def __new__(cls, data):
            return super().__new__(cls)

    class Derived(Same):
        pass

    class WithSetattr(Same):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)

    class Meta(type):
        pass

    class WithMeta(metaclass=Meta):
        __init__ = Same.__init__

    assert abi.plain_lazy_dict(Same)
    for cls in (OtherBody, WithDefault, WithSlots, WithNew, Derived, WithSetattr, WithMeta):
        assert not abi.plain_lazy_dict(cls), cls.__name__


def test_jit_function_lives_in_the_native_slot(add):
    assert add.jit_function is kernels.add_kernel
    assert "jit_function" not in vars(add)
    add.jit_function = kernels.add_kernel
    assert add.jit_function is kernels.add_kernel
    with pytest.raises(AttributeError, match="jit_function"):
        _ = _C.Kernel().jit_function


@pytest.mark.parametrize(
    "knob",
    ["jit_cache_hook", "jit_post_compile_hook", "kernel_load_start_hook", "kernel_load_end_hook"],
)
def test_a_compile_or_load_hook_sees_what_is_compiled_and_loaded_while_it_is_set(stand_in, knob):
    """Triton calls these hooks when it compiles (JITFunction.run) or loads a module
    (CompiledKernel._init_handles); the native path does neither through Triton, so a miss
    while one is set is Triton's to compile, load and launch. Once unset, the next miss
    registers natively."""
    from triton.runtime.jit import JITFunction

    seen = []

    def hook(*args, **kwargs):
        seen.append(knob)
        return False  # jit_cache_hook: False means compile as usual

    jit_fn = JITFunction(kernels.add_kernel.fn)  # nothing compiled for it yet, in Triton either
    k = fastkernel(jit_fn)
    chain = getattr(knobs.runtime, knob)
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        setattr(knobs.runtime, knob, hook)
    try:
        with TritonReference(stand_in, TEST_STREAM):
            k[(1,)](X, X, X, 64, BLOCK=64)
            assert seen, f"Triton's {knob} did not run"
            theirs = stand_in.launches()[-1]
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            setattr(knobs.runtime, knob, None)
    stats = k.stats()
    assert stats["fallbacks"] == 1 and stats["specializations"] == 0
    (reason,) = stats["fallback_reasons"]
    assert f"knobs.runtime.{knob} is set" in reason
    seen.clear()
    k[(1,)](X, X, X, 64, BLOCK=64)
    assert not seen and k.stats()["specializations"] == 1
    assert_same_launch(stand_in.launches()[-1], theirs)


def test_pre_run_hooks_run_before_the_arguments_are_read_and_see_tritons_keywords(stand_in):
    """JITFunction.run calls its pre-run hooks first, with the call's keywords plus the compile
    options it adds (debug, and from Triton 3.6 instrumentation_mode, from 3.9
    fpsan_homomorphic_casts), and binds the arguments after them: a hook that gives an output
    its storage (`out.set_(...)`) is launched with that storage."""
    from triton.runtime.jit import JITFunction

    seen = {}

    def hook_for(name):
        def hook(*args, **kwargs):
            seen[name] = sorted(kwargs)
            args[2].set_(storage[name])

        return hook

    storage = {"triton": torch.randn(64), "fastkernel": torch.randn(64)}
    theirs_fn = JITFunction(kernels.add_kernel.fn)
    theirs_fn.add_pre_run_hook(hook_for("triton"))
    with TritonReference(stand_in, TEST_STREAM) as reference:
        theirs = reference.launch(theirs_fn, (1,), X, X, torch.empty(64), 64, BLOCK=64)
    k = fastkernel(JITFunction(kernels.add_kernel.fn))
    k[(1,)](X, X, X, 64, BLOCK=64)  # registered before the hook is added
    k.jit_function.add_pre_run_hook(hook_for("fastkernel"))
    k[(1,)](X, X, torch.empty(64), 64, BLOCK=64)
    ours = stand_in.launches()[-1]
    assert seen["fastkernel"] == seen["triton"]
    assert seen["triton"] == sorted(["BLOCK", *abi.RUN_ADDED_OPTIONS])
    pointer = struct.Struct("<Q")
    assert pointer.unpack(theirs.params[2])[0] == storage["triton"].data_ptr()
    assert pointer.unpack(ours.params[2])[0] == storage["fastkernel"].data_ptr()
    assert ours.params[:2] == theirs.params[:2] and ours.params[3:] == theirs.params[3:]


@pytest.mark.parametrize("where", ["grid", "enter hook"])
def test_a_tensor_given_new_storage_during_the_launch_launches_its_current_storage(stand_in, where):
    """Triton's launcher reads each tensor's data_ptr() after the grid function and the enter
    hooks: a tensor one of them gives new storage (``out.set_``) is launched with it, never
    with the pointer read before (whose storage may be freed by then)."""
    x, y = torch.randn(4096), torch.randn(4096)
    k = fastkernel(kernels.add_kernel)
    current = []
    for system in ("triton", "fastkernel"):
        out = torch.empty(4096)
        launch = kernels.add_kernel if system == "triton" else k

        def move(*_, out=out):
            out.set_(torch.empty(4096))

        def grid(meta):
            if where == "grid":
                move()
            return (4,)

        with _on(system, stand_in):
            launch[(4,)](x, y, out, 4096, BLOCK=1024)
            if where == "enter hook":
                knobs.runtime.launch_enter_hook.add(move)
            try:
                launch[grid](x, y, out, 4096, BLOCK=1024)
            finally:
                if where == "enter hook":
                    knobs.runtime.launch_enter_hook.remove(move)
        current.append(struct.unpack("<Q", stand_in.last_launch().params[2])[0] == out.data_ptr())
    assert current == [True, True]


def test_a_tensor_in_a_tuple_given_new_storage_by_the_grid_launches_its_current_storage(stand_in):
    k = fastkernel(kernels.tuple_kernel)
    x, y, out = torch.randn(64), torch.randn(64), torch.empty(64)
    moved = []

    def grid(meta):
        if moved:
            x.set_(torch.randn(64))
        return (1,)

    k[grid](out, (x, 3), 64, (7, (2.5, y)), BLOCK=64)
    old = x.data_ptr()
    moved.append(True)
    k[grid](out, (x, 3), 64, (7, (2.5, y)), BLOCK=64)
    pointers = [struct.unpack("<Q", p)[0] for p in stand_in.last_launch().params if len(p) == 8]
    assert x.data_ptr() != old and x.data_ptr() in pointers and old not in pointers
