"""``fastkernel.patch()``: every Triton kernel launch in the process served by the native path.

After :func:`patch`, ``kernel[grid](*args, **kwargs)`` and ``kernel.run(*args, grid=grid,
warmup=False, **kwargs)`` of any ``triton.runtime.jit.JITFunction`` (created before or after the
call, wherever it is held) bind, key, look up and launch natively, exactly as a ``@fastkernel``
kernel does. Nothing in a library is found or replaced: the patch sits on Triton's own class.

- ``JITFunction.__getitem__`` becomes a slot wrapper whose C function is the native subscript
  (see ``csrc/python/patch_hook.cpp``): ``kernel[grid]`` costs what a ``@fastkernel`` kernel's
  costs, no Python frame in between.
- ``JITFunction.run`` becomes :func:`_patched_run`, so ``triton.autotune`` and
  ``triton.heuristics`` wrappers (which end in ``self.fn.run(...)``, Triton's
  ``runtime/autotuner.py``) launch natively under their own Python.
- ``Autotuner.__getitem__`` and ``Autotuner.run`` are served the same way: a tuned call of
  Triton's own ``@triton.autotune`` over a ``triton.jit`` function is one native hit
  (:class:`PatchedAutotuner`). Its misses run Triton's ``Autotuner.run`` itself, so tuning,
  pruning, hooks, ``cache_results`` and the chosen config are Triton's.
- ``Heuristics.__getitem__`` likewise: a call of Triton's own ``@triton.heuristics`` over a
  ``triton.jit`` function, or over Triton's own autotuner over one, is one native hit when its
  functions read only scalars and constexprs, each named in their code
  (:class:`PatchedHeuristics`); other heuristics run in Python on every call and launch
  natively underneath. Triton's own autotuner over Triton's own heuristics over a
  ``triton.jit`` function is one native hit by the same rules, the heuristics seeing the
  tuned config's values as in Triton (:class:`PatchedAutotunerOverHeuristics`).
- ``CompiledKernel.__getitem__`` and ``fastkernel.cache.CachedKernel.__getitem__`` (what a
  launch returns in a process that read the binary from the disk cache) become slot wrappers of
  the native handle subscript (``csrc/python/handle_launch.cpp``): ``handle[grid]`` of a handle
  (what ``warmup`` returns, what launch caches keep) of a served kernel is the native launch of
  the handle's own binary (``fastkernel.kernel.CompiledLaunch``). The handle's first launch,
  and any the native subscript does not take, go through :func:`_patched_handle_getitem`.
- ``CompiledKernel.run`` and ``CachedKernel.run`` (the handle's launcher object, which launch
  caches keep and call directly) become :func:`_patched_handle_run`: for a served kernel's
  handle a native launcher object (``_C.run_launcher``), which launches the binary natively
  where Triton's launcher would launch exactly that and calls Triton's otherwise.
- Each kernel gets its dispatch at its first launch, kept in the kernel's ``__dict__`` under
  ``kernel.PATCH_ATTR``; :func:`unpatch` removes it again. Assigning an attribute the dispatch
  was built from (a ``run`` on any of them; an autotuner's or heuristics' ``fn``, an
  autotuner's ``configs``, ``keys`` or ``cache``, a heuristics' ``values``) drops it, and the
  next launch builds it again.

An ``Autotuner`` subclass that defines its own ``run`` is served the same way when registered
with :func:`fastkernel.register_autotuner`, or known to ``fastkernel._autotuner_classes``
(flash-linear-attention's ``CachedAutotuner``, for the code verified): its misses run its own
``run``, whose ``super().run`` is Triton's.

What stays on Triton's path: a ``JITFunction`` subclass, or an unregistered ``Autotuner``
subclass, that defines its own ``run``, and these classes while another library's ``run`` is
assigned on the class itself (before :func:`patch`, or while patched: the native subscript
asks again whenever the class changed, or a class it launches through underneath; left in
place by :func:`unpatch`) (its own behaviour is kept; the launch underneath is still native),
``warmup=True`` (compile only), and every call the native key does not cover (counted in ``fastkernel.stats()``
with its reason, as for ``@fastkernel``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import triton
from triton.compiler.compiler import CompiledKernel
from triton.runtime.autotuner import Autotuner
from triton.runtime.autotuner import Heuristics as TritonHeuristics
from triton.runtime.jit import JITFunction, KernelInterface

from . import _C, _env, _heuristic_code, _locks
from . import _autotuner_classes as _classes
from . import _triton_abi as abi
from . import cache as _cache
from ._autotune import TUNE_CONFIG_PROVIDED, TUNE_MAY_BE_PROVIDED, TUNE_VALUE
from ._handle_args import HandleSignature, checked_launcher
from .kernel import (
    _KERNELS,
    COMPILED_GETITEM,
    PATCH_ATTR,
    PATCHED_RUNS,
    TRITON_RUN,
    CompiledLaunch,
    NativeDispatch,
    _params_spec,
    in_tritons_own_launch,
    install_triton_watch,
    stats_name,
    tritons_own_launches,
    uninstall_triton_watch,
)

log = logging.getLogger("fastkernel")


#: Triton's own ``Autotuner.run``, as it was when fastkernel was imported.
AUTOTUNER_RUN = Autotuner.run
HEURISTICS_RUN = TritonHeuristics.run
#: The ``run`` properties of Triton's ``CompiledKernel`` and of the disk cache's ``CachedKernel``
#: (each gives the handle's launcher object), as they were when fastkernel was imported.
COMPILED_RUN = CompiledKernel.__dict__.get("run")
CACHED_RUN = _cache.CachedKernel.__dict__["run"]
# Triton's knobs.HookChain (Triton 3.9: the launch hook knobs hold an empty one by default).
_HOOK_CHAIN = getattr(getattr(triton, "knobs", None), "HookChain", None)

# The classes whose __getitem__ and run the patch replaces (and unpatch restores).
_PATCHED_CLASSES = (JITFunction, Autotuner, TritonHeuristics, CompiledKernel, _cache.CachedKernel)
# Those of them that are kernel objects, served by the native subscript.
_KERNEL_CLASSES = (JITFunction, Autotuner, TritonHeuristics)

_lock = _locks.rlock()
_saved: dict[tuple[type, str], Any] | None = None  # Triton's attributes as they were, while patched
# The run attribute the patch installed on each kernel class, while patched: not on a class
# whose run another library had replaced (kept), and unpatch() puts back only these.
_installed_runs: dict[type, Any] = {}
# The watch the patch put on the run of each registered Autotuner subclass it served, while
# patched (_watch_registered_runs).
_watched_runs: dict[type, _RunAttribute] = {}
# Every JITFunction given a dispatch, by id (JITFunctions need not be hashable).
_served: dict[int, weakref.ref[JITFunction]] = {}


def _forget_served(key: int, _ref: object) -> None:
    """Weak-reference callback: a served kernel was collected."""
    _served.pop(key, None)


# The kernel objects that launch through another's ``run`` (a heuristics stack's lower levels
# and its JITFunction, an autotuner's JITFunction), by id: a weak reference to the object, and
# weak references by id to the objects over it whose dispatch decision read it. A ``run``
# assigned on or deleted from it changes what their launches call (Triton's ``Heuristics.run``
# and ``Autotuner.run`` call ``self.fn.run``), so it drops their dispatches too.
_under: dict[int, tuple[weakref.ref, dict[int, weakref.ref]]] = {}


def _note_under(level: Any, top: Any) -> None:
    """Records that ``top``'s dispatch decision depends on ``level``'s ``run`` (until either is
    collected)."""
    entry = _under.get(id(level))
    if entry is None or entry[0]() is not level:
        ref = weakref.ref(level, functools.partial(_forget_under, id(level)))
        entry = _under[id(level)] = (ref, {})
    over = entry[1]
    over[id(top)] = weakref.ref(top, functools.partial(_forget_over, over, id(top)))


def _forget_over(over: dict[int, weakref.ref], key: int, ref: weakref.ref) -> None:
    """Weak-reference callback: an object over another was collected."""
    if over.get(key) is ref:
        del over[key]


def _forget_under(key: int, ref: weakref.ref) -> None:
    """Weak-reference callback: an object under another was collected."""
    entry = _under.get(key)
    if entry is not None and entry[0] is ref:
        del _under[key]


def _forget_dispatches_over(obj: Any) -> None:
    """Drops the dispatch of every object launching through ``obj``'s ``run`` (native, or the
    decision to keep Triton's path): their next launch decides again."""
    with _lock:
        entry = _under.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return
        for ref in list(entry[1].values()):
            top = ref()
            if top is not None:
                _C.drop_patched_dispatch(top)
                top.__dict__.pop(PATCH_ATTR, None)


class PatchedKernel(NativeDispatch):
    """The native dispatch of one Triton ``JITFunction`` under :func:`patch`.

    It is not a ``JITFunction`` itself: the kernel object a library holds stays exactly
    Triton's, so ``isinstance`` checks, ``torch.compile`` capture and pickling see no change.
    ``stats()`` and ``fastkernel.stats()`` report it under the kernel's ``module.qualname``.
    """

    _serves_patch = True

    def __init__(self, jit_fn: JITFunction):
        self._init_native(jit_fn, _params_spec(jit_fn), jit_fn.pre_run_hooks)

    def __repr__(self) -> str:
        return f"PatchedKernel({self._stats_name()})"


def _leaves(value: Any) -> Iterator[Any]:
    """``value``, or the elements of a tuple, depth first (Triton flattens tuple arguments)."""
    if isinstance(value, tuple):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


class _TunedLaunch:
    """One tuned miss in progress on this thread: the config its ``Autotuner.run`` launched
    ``kernel`` (the ``triton.jit`` function under the autotuner, and under any heuristics
    between them) with, and the keywords of that launch, noted by :func:`_patched_run` when the
    run reaches the kernel's ``run`` (``best_config`` itself is shared: a launch from the grid,
    or another thread, can set it again before the miss reads it)."""

    __slots__ = ("autotuner", "kernel", "config", "kwargs")

    def __init__(self, autotuner: Autotuner, kernel: JITFunction):
        self.autotuner = autotuner
        self.kernel = kernel
        self.config: Any = None
        self.kwargs: dict[str, Any] = {}


#: Per thread, the PatchedAutotuner misses in progress, innermost last.
_tuning = threading.local()


def _note_tuned_launch(jit_fn: JITFunction, kwargs: dict) -> None:
    """Called by :func:`_patched_run`: when the innermost tuned miss on this thread is running
    ``jit_fn``, notes the config its ``Autotuner.run`` set, if this launch carries that config's
    values (else None: it was set again in between), and the launch's keywords."""
    pending = getattr(_tuning, "pending", None)
    if not pending or pending[-1].kernel is not jit_fn:
        return
    entry = pending[-1]
    config = getattr(entry.autotuner, "best_config", None)  # unset until a first run sets it
    missing = object()
    matches = config is not None and all(
        kwargs.get(name, missing) == value for name, value in config.all_kwargs().items()
    )
    entry.config = config if matches else None
    entry.kwargs = kwargs


class PatchedAutotuner(NativeDispatch):
    """The native dispatch of one Triton ``Autotuner`` over a ``triton.jit`` function.

    A call whose native key is registered is one native hit: the record holds the tuned
    config's values for the parameters the call leaves out, and a hit sets the autotuner's
    ``best_config`` as Triton's ``Autotuner.run`` does. A miss runs Triton's ``Autotuner.run``
    itself (which tunes if Triton's key is new, and launches natively underneath), then
    registers the call's key with the config Triton chose.

    The native key holds everything Triton's autotune key holds (the ``key`` arguments' values
    and every tensor's dtype; ``runtime/autotuner.py``, ``Autotuner.run``) and more, so a hit
    never serves a config Triton would not pick. Calls Triton keys in ways the native key cannot
    follow stay on Triton's path, counted with the reason: a ``key`` argument that is a tensor
    (Triton keys it by identity), a NaN key value, a non-tensor argument with a ``dtype``, a
    kernel with pre-run hooks (while it has them: Triton's run passes them the config's
    values), a tuned config setting a parameter the declared configs do not (a pruned config, a
    replaced ``configs``), a call leaving out a required constexpr that no declared config sets.
    A key whose tuned config has a ``pre_hook`` is registered with a hit that calls the hook and
    then the autotuner's ``fn.run`` (:class:`_ConfigPreHookHit`), which keys the arguments as
    the hook left them.
    A config picked for a key stays registered for that key: clearing ``autotuner.cache`` in
    place does not re-tune keys already served natively (call :func:`unpatch` first); assigning
    the autotuner's ``fn``, ``configs``, ``keys`` or ``cache`` drops its dispatch
    (``_DISPATCH_INPUTS``), so its next launches are served as Triton's ``run`` then serves
    them.
    """

    _serves_patch = True

    def __init__(self, autotuner: Autotuner, config_params: tuple[str, ...]):
        jit_fn = autotuner.fn
        self.autotuner = autotuner
        self._config_params = config_params
        tune = {p.name: _tuned_flags(p, autotuner, config_params) for p in jit_fn.params}
        self._init_native(jit_fn, _params_spec(jit_fn, tune), jit_fn.pre_run_hooks)
        # Triton's run passes pre-run hooks the tuned config's values: calls go through it.
        self._set_hooks_through_triton(True)
        self._set_publish(autotuner, "best_config")
        _set_under_types(self, autotuner, (jit_fn,))

    def __repr__(self) -> str:
        return f"PatchedAutotuner({self._stats_name()})"

    _stats_suffix = " [triton.autotune]"

    @staticmethod
    def config_params(
        autotuner: Autotuner, jit_fn: JITFunction | None = None
    ) -> tuple[str, ...] | None:
        """The parameters of ``jit_fn`` (the kernel the autotuner launches; its ``fn`` by
        default) the autotuner's configs set, or None when a config sets something the native
        record cannot carry (a runtime parameter, or a name that is neither a parameter nor a
        compile option)."""
        jit_fn = jit_fn or autotuner.fn
        by_name = {p.name: p for p in jit_fn.params}
        options = set(abi.option_names(abi.cuda_target(9, 0)))
        names: list = []
        for config in autotuner.configs:
            for name in config.kwargs:
                p = by_name.get(name)
                if p is None:
                    if name not in options:
                        return None
                elif not p.is_constexpr:
                    return None
                elif name not in names:
                    names.append(name)
        return tuple(names)

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        return _tuned_miss(
            self, self.autotuner, self._config_params, grid, args, kwargs, key, device, reason
        )


def _tuned_flags(
    p: Any, autotuner: Autotuner, config_params: tuple[str, ...], computed: Any = ()
) -> int:
    """The ``TUNE_*`` flags of kernel parameter ``p`` launched through ``autotuner``, whose
    configs set ``config_params`` and a heuristics over it computes ``computed``: those are
    absent from the call and given by the record; the autotuner's ``key`` parameters the call
    gives are keyed by value; a required constexpr nothing sets is left to Triton's ``run``
    when a call leaves it out (a pruned config can set it)."""
    set_for_call = p.name in config_params or p.name in computed
    return (
        (TUNE_CONFIG_PROVIDED if set_for_call else 0)
        | (TUNE_VALUE if p.name in autotuner.keys and p.name not in computed else 0)
        | (TUNE_MAY_BE_PROVIDED if p.is_constexpr and not p.has_default and not set_for_call else 0)
    )


def _autotune_not_native(
    autotuner: Autotuner,
    jit_fn: JITFunction,
    config_params: tuple[str, ...],
    named: dict[str, Any],
    kwargs: dict[str, Any],
) -> str | None:
    """Why Triton's autotune key of a call of ``jit_fn`` through ``autotuner`` (its arguments by
    name in ``named``, its keywords in ``kwargs``) is not implied by the native key, or None."""
    import torch

    if type(autotuner.cache) is not dict:
        return "the autotuner's cache is not a plain dict"
    if jit_fn.pre_run_hooks:
        return "the kernel has pre-run hooks, which Triton runs with the config's values"
    given = [name for name in config_params if name in kwargs]
    if given:
        return f"argument {given[0]!r} is set by the autotuner's configs"
    for name in autotuner.keys:
        for value in _leaves(named.get(name)):
            if isinstance(value, torch.Tensor):
                return f"autotune key {name!r} holds a tensor, which Triton keys by identity"
            if isinstance(value, float) and value != value:
                return f"autotune key {name!r} holds NaN, which never equals Triton's key"
    for name, value in named.items():
        if hasattr(value, "dtype") and not isinstance(value, torch.Tensor):
            return (
                f"argument {name!r} of type {type(value).__name__} has a dtype, which "
                f"Triton's autotune key includes"
            )
    return None


def _tuned_miss(
    dispatch: NativeDispatch,
    autotuner: Autotuner,
    config_params: tuple[str, ...],
    grid,
    args: tuple,
    kwargs: dict,
    key: bytes | None,
    device: int,
    reason: str | None,
    provided: frozenset[str] = frozenset(),
    computed_under: Callable[[Any, tuple, dict, Any], dict[str, Any] | str] | None = None,
):
    """The miss of ``dispatch``, a native dispatch whose calls launch through ``autotuner``:
    runs Triton's ``Autotuner.run`` itself on the call (``kwargs`` hold any values computed
    over the autotuner), which tunes if Triton's key is new and launches natively underneath;
    then registers ``key`` with the config that run launched, unless ``reason`` (or a reason
    found here) keeps the call on Triton's path, counted as a fallback. ``provided``: the
    parameters given by the record besides the configs' (values computed over or under the
    autotuner). ``computed_under(grid, args, merged, launch)``: for heuristics under the
    autotuner, the values they computed for the launch (``merged``: the call's keywords with
    the config's; ``launch``: the :class:`_TunedLaunch`), or why the key does not imply
    them."""
    jit_fn = dispatch.jit_function
    if key is not None:
        named = dict(zip(autotuner.arg_names, args))
        named.update((k, v) for k, v in kwargs.items() if k in autotuner.arg_names)
        reason = reason or _autotune_not_native(autotuner, jit_fn, config_params, named, kwargs)
    # A call without a key was counted as a fallback natively. A registered subclass's own run
    # runs on its miss (its super().run is then Triton's: _in_tuned_miss), unless this call
    # came through Autotuner.run, which that run calls: it ran already.
    run = AUTOTUNER_RUN if getattr(_tuning, "entered", None) is autotuner else _own_run(autotuner)
    pending = _tuning.__dict__.setdefault("pending", [])
    launch = _TunedLaunch(autotuner, jit_fn)
    pending.append(launch)
    try:
        result = dispatch._run_through_triton(
            lambda: run(autotuner, *args, grid=grid, warmup=False, **kwargs),
            counted=key is None,
        )
    finally:
        pending.pop()
        # Triton's run set best_config itself: the next hit sets it again even when its
        # config is the one a hit set last.
        dispatch._set_publish(autotuner, "best_config")
    if key is not None and reason is None:
        config = launch.config  # what Triton's run launched this call with
        if config is None:
            reason = "the config Triton's Autotuner.run launched with could not be told"
        elif unkeyed := [
            name for name in config.kwargs if name in jit_fn.arg_names and name not in config_params
        ]:
            # A config from a prune or a replaced `configs` list: the native key and the
            # record's tuned arguments cover only what the configs set when the dispatch
            # was made.
            reason = (
                f"the tuned config sets {unkeyed[0]!r}, which the autotuner's configs did "
                f"not set when its native dispatch was made"
            )
        else:
            merged = {**kwargs, **config.all_kwargs()}
            if computed_under is not None:
                computed = computed_under(grid, args, merged, launch)
                if isinstance(computed, str):
                    reason = computed
                else:
                    merged.update(computed)
        if reason is None and config.pre_hook is not None:
            # The values heuristics over the autotuner computed for the key, in the order
            # Triton's Heuristics.run adds them to the keywords it passes Autotuner.run.
            over = {name: value for name, value in kwargs.items() if name in provided}
            hit = _ConfigPreHookHit(autotuner, config, over)
            dispatch._insert(key, dispatch._hit_call_record(args, merged, hit))
        elif reason is None:
            tuned_args = dispatch._tuned_args(merged, frozenset(config_params) | provided)
            record = dispatch._launch_record(
                args, merged, key, device, tuned_args, published=config, launched=result
            )
            if isinstance(record, str):
                reason = record
            else:  # Triton launched this call; the record serves the next ones
                dispatch._insert(key, record)
    if reason is not None:
        if key is not None:
            dispatch._miss_fallbacks += 1
        dispatch._count_fallback(reason, what="tunes and launches through Triton's Autotuner.run")
    return result


#: Pushed on a thread's pending tuned misses while a hit runs a config's pre_hook and the
#: launch under it: that launch is not the miss's.
_NOT_A_MISS = _TunedLaunch(None, None)


class _ConfigPreHookHit:
    """A hit on the key of a config with a ``pre_hook``: the rest of Triton's
    ``Autotuner.run`` once its cache gave the config (``runtime/autotuner.py``). It sets the
    autotuner's ``best_config`` to the config, then calls the hook with one dict: the
    positional arguments by name, the call's keywords (``grid`` and ``warmup`` first, as
    ``KernelInterface.__getitem__`` passes them; then ``over``, the values heuristics over
    the autotuner computed for the key, as Triton's ``Heuristics.run`` adds them) and the
    config's values and options. Then the autotuner's ``fn.run`` launches with the config's
    values and options among the keywords, natively underneath (its own dispatch keys the
    arguments as the hook left them: a hook may set a tensor descriptor's ``block_shape``).
    The autotuner's ``nargs`` is the positional arguments by name until ``fn.run`` returns,
    then None, as in Triton's run (a hook may read it)."""

    __slots__ = ("autotuner", "config", "over")

    def __init__(self, autotuner: Autotuner, config: Any, over: dict[str, Any]):
        self.autotuner = autotuner
        self.config = config
        self.over = over

    def __call__(self, grid, *args, **kwargs):
        autotuner = self.autotuner
        config = self.config
        run_kwargs = {"grid": grid, "warmup": False, **kwargs, **self.over}
        tuned = config.all_kwargs()
        autotuner.best_config = config
        autotuner.nargs = nargs = dict(zip(autotuner.arg_names, args))
        # A miss in progress on this thread must not note these launches as its own.
        pending = getattr(_tuning, "pending", None) or None
        if pending is not None:
            pending.append(_NOT_A_MISS)
        try:
            if config.pre_hook is not None:  # checked per call, as Triton's run checks it
                config.pre_hook({**nargs, **run_kwargs, **tuned})
            result = autotuner.fn.run(*args, **run_kwargs, **tuned)
        finally:
            if pending is not None:
                pending.pop()
        autotuner.nargs = None
        return result


class _RecordedArguments(dict):
    """The mapping a heuristic function receives (a dict, as Triton passes), noting each name
    it reads; reading it as a whole (iteration, ``len``, views, a copy, a comparison, ``repr``,
    a merge) is noted too."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()
        self.read_whole = False

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self.read.add(name)
        return super().get(name, default)

    def __contains__(self, name):
        self.read.add(name)
        return super().__contains__(name)


def _reads_whole(method: str):
    def read_whole(self, *args, **kwargs):
        self.read_whole = True
        return getattr(dict, method)(self, *args, **kwargs)

    read_whole.__name__ = method
    return read_whole


# Set on the class (not looked up per access): operators and built-ins such as len(), iteration,
# ==, | and repr() find them through the type's slots, as they find dict's own.
for _method in (
    "keys",
    "values",
    "items",
    "copy",
    "pop",
    "popitem",
    "setdefault",
    "__iter__",
    "__reversed__",
    "__len__",
    "__eq__",
    "__ne__",
    "__or__",
    "__ror__",
    "__repr__",
):
    setattr(_RecordedArguments, _method, _reads_whole(_method))
del _method


class PatchedHeuristics(NativeDispatch):
    """The native dispatch of Triton's own ``@triton.heuristics`` over a ``triton.jit`` function
    (or over a stack of them, or over Triton's own ``@triton.autotune`` over one:
    :meth:`for_heuristics`), under :func:`patch`: each computed value (and the tuned config) is
    compiled into the launch record of its key, so a call is one native hit.

    The key is the kernel's own plus, for every parameter whose name a heuristic function's code
    spells (its string constants, nested functions included), its exact value and whether the
    call passed it (Triton's ``Heuristics.run`` passes the functions only the arguments given).
    On a miss the functions run as Triton runs them (each sees the positional arguments by name,
    the keywords, ``grid`` and ``warmup``, and the values computed before it) on a mapping that
    notes what they read; the record is registered only when every read is a parameter the key
    holds by value (an int, float, bool or None, or a constexpr), a parameter the code only
    compares with None by identity (``args["h0"] is not None``: the key holds which arguments
    are None), an earlier value, a compile option passed by keyword, or ``warmup``. Anything
    else (a tensor read otherwise, a tuple, the grid, a name the code does not spell, reading
    the mapping as a whole, a computed parameter passed by the caller) sends that call through
    Triton's ``Heuristics.run``, counted with the reason; its launch underneath is still native.
    So does every call of a function whose code may read state outside its arguments (a global
    other than a pure built-in, ``math`` function, ``triton.cdiv``, ``triton.next_power_of_2`` or
    a Python function whose own code reads none; a closure variable; an import), found from its
    bytecode (``fastkernel._heuristic_code``). While the kernel has pre-run hooks, every call
    goes through Triton's run, which passes them the computed values (``JITFunction.run``).
    Assigning ``fn`` or ``values`` on a level drops the dispatch (``_DISPATCH_INPUTS``); a
    change made in place to a ``values`` dict after the first launch is not seen.
    """

    _serves_patch = True

    def __init__(
        self,
        heuristics: TritonHeuristics,
        jit_fn: JITFunction,
        values: dict[str, Any],
        reads: _ValueReads,
        autotuner: Autotuner | None = None,
        config_params: tuple[str, ...] = (),
        under: tuple[Any, ...] = (),
        top: Any = None,
    ):
        #: The outermost heuristics of the stack.
        self.heuristics = heuristics
        #: The Triton ``Autotuner`` the stack launches through, or None (over the kernel).
        self.autotuner = autotuner
        self._config_params = config_params
        self._values = values
        self._identity_only = reads.identity_only
        self._outside = reads.outside
        by_name = {p.name: p for p in jit_fn.params}
        self._constexprs = frozenset(p.name for p in jit_fn.params if p.is_constexpr)
        self._defaulted = frozenset(p.name for p in jit_fn.params if p.has_default)
        self._keyed = frozenset(n for n in reads.spelled if n in by_name and n not in self._values)
        tune = {
            p.name: (TUNE_CONFIG_PROVIDED if p.name in self._values else 0)
            | (TUNE_VALUE if p.name in self._keyed else 0)
            | (_tuned_flags(p, autotuner, config_params, values) if autotuner is not None else 0)
            for p in jit_fn.params
        }
        self._init_native(jit_fn, _params_spec(jit_fn, tune), jit_fn.pre_run_hooks)
        # Triton's run passes pre-run hooks the computed (and tuned) values: calls go through it.
        self._set_hooks_through_triton(True)
        if autotuner is not None:
            self._set_publish(autotuner, "best_config")
        _set_under_types(self, heuristics if top is None else top, under)

    @classmethod
    def for_heuristics(cls, heuristics: TritonHeuristics) -> PatchedHeuristics | None:
        """Its dispatch, or None when it keeps Triton's path: over an autotuner or a kernel with
        a ``run`` of its own, over an autotuner whose configs set what the record cannot carry or
        a computed name, or a computed name that is not a constexpr parameter of the kernel (a
        compile option or a runtime argument, which the record cannot carry).

        A stack of heuristics (``@triton.heuristics`` over ``@triton.heuristics`` ... over the
        ``triton.jit`` function, as SGLang's Mamba kernel stacks eight, vLLM's seven) is one
        dispatch: each ``Heuristics.run`` computes its values, then calls the next level's
        ``run`` with them among the keywords, so the stack computes every level's values in
        order, outermost first, each function seeing the values computed before it. A name
        computed at two levels keeps the stack on Triton's path.

        Over Triton's own ``Autotuner`` (flash-linear-attention's usual stack), the stack and
        the autotuner are one dispatch too: the key adds the autotuner's (``_tuned_flags``), a
        miss computes the values and then runs Triton's ``Autotuner.run`` with them among the
        keywords (:func:`_tuned_miss`), and the record carries both the values and the tuned
        config's; a hit sets the autotuner's ``best_config``.
        """
        under: list[Any] = []  # the objects it launches through, in order
        stack = _heuristics_stack(heuristics, heuristics, under)
        if stack is None:
            return None
        values, level = stack
        autotuner = None
        config_params: tuple[str, ...] | None = ()
        if isinstance(level, Autotuner):
            # Over Triton's own autotuner (flash-linear-attention's usual stack): its
            # Autotuner.run gets the computed values among the keywords.
            if not _launches_through_served_run(level, heuristics) or not _registration_allows(
                level
            ):
                return None  # an Autotuner subclass or instance with a run of its own
            if not isinstance(level.fn, JITFunction):
                # Over another stack (an autotuner over a heuristics): the values computed
                # here reach its run as keywords, and its own dispatch serves them.
                return None
            autotuner, level = level, level.fn
            under.append(autotuner)
            config_params = PatchedAutotuner.config_params(autotuner)
            if config_params is None or set(config_params) & set(values):
                return None  # a config sets what the record cannot carry, or a computed name
        jit_fn = level
        if not isinstance(jit_fn, JITFunction) or not _launches_through_served_run(
            jit_fn, heuristics
        ):
            return None  # a kernel with a run of its own (`kernel.run = wrapper`, a subclass's)
        under.append(jit_fn)
        reads = _ValueReads.of(values, jit_fn)
        if reads is None:
            return None
        return cls(heuristics, jit_fn, values, reads, autotuner, config_params or (), tuple(under))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._stats_name()})"

    _stats_suffix = " [triton.heuristics]"

    def _not_native(
        self,
        read: set[str],
        seen: dict[str, Any],
        values: dict[str, Any],
        configured: frozenset[str] = frozenset(),
    ) -> str | None:
        """Why values computed from the names in ``read`` (the call's arguments by name in
        ``seen``) are not implied by the native key, or None. ``configured``: the names the
        tuned config set for the functions to see (implied by the key, as the config is)."""
        for name in sorted(read):
            if name in values or name in configured or name == "warmup":
                continue
            if name in self._constexprs and (name in self._keyed or name not in self._defaulted):
                continue  # keyed by value; and whether the call passed it, where it can omit it
            if name not in self._keyed:
                if name in seen and name not in self.heuristics.arg_names and name != "grid":
                    continue  # a compile option passed by keyword: keyed with its value
                return f"a heuristic reads {name!r}, which its code does not name"
            value = seen.get(name)
            if (
                value is not None
                and type(value) not in (int, float, bool)
                and name not in self._identity_only
            ):
                return (
                    f"a heuristic reads argument {name!r} of type {type(value).__name__}; "
                    f"only scalars are keyed by value"
                )
        return None

    def _call_not_native(self, kwargs: dict) -> str | None:
        """Why no call like this one (its keywords ``kwargs``) can be registered, or None."""
        given = [name for name in self._values if name in kwargs]
        if given:
            return f"argument {given[0]!r} is computed by the heuristics"
        return self._outside

    def _compute(
        self, grid, args: tuple, kwargs: dict, configured: frozenset[str] = frozenset()
    ) -> tuple[dict[str, Any], str | None]:
        """The values the heuristics compute for a call (its keywords, and any config's values,
        in ``kwargs``) as Triton's ``Heuristics.run`` computes them, and why the native key does
        not imply them (or None)."""
        positional = dict(zip(self.heuristics.arg_names, args))
        merged = {"grid": grid, "warmup": False, **kwargs}
        read: set[str] = set()
        reason = None
        for name, fn in self._values.items():
            seen = _RecordedArguments({**positional, **merged})
            merged[name] = fn(seen)
            if seen.read_whole:
                reason = "a heuristic reads its arguments as a whole"
            read |= seen.read
        values = {name: merged[name] for name in self._values}
        if reason is None:
            reason = self._not_native(read, {**positional, **merged}, values, configured)
        return values, reason

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        if key is not None:
            reason = self._call_not_native(kwargs) or reason
        if key is None or reason is not None:
            return self._through_triton(grid, args, kwargs, key, reason or "unsupported call")
        values, reason = self._compute(grid, args, kwargs)
        if reason is not None:
            return self._through_triton(grid, args, kwargs, key, reason)
        call_kwargs = {**kwargs, **values}
        if self.autotuner is not None:
            # What Triton's Heuristics.run does next: the autotuner's run, with the values.
            return self._tuned_miss(grid, args, call_kwargs, key, device, None)
        tuned_args = self._tuned_args(call_kwargs, self._values)
        return self._register_miss(grid, args, call_kwargs, key, device, tuned_args)

    def _tuned_miss(self, grid, args, kwargs, key, device, reason, computed_under=None):
        """:func:`_tuned_miss` through the stack's autotuner, the record giving the computed
        values too."""
        assert self.autotuner is not None
        return _tuned_miss(
            self,
            self.autotuner,
            self._config_params,
            grid,
            args,
            kwargs,
            key,
            device,
            reason,
            frozenset(self._values),
            computed_under,
        )

    def _through_triton(self, grid, args, kwargs, key, reason: str):
        """Triton's ``Heuristics.run`` for this call, counted as a fallback with ``reason`` (a
        call without a key was counted natively)."""
        result = self._run_through_triton(
            lambda: HEURISTICS_RUN(self.heuristics, *args, grid=grid, warmup=False, **kwargs),
            counted=key is None,
        )
        if key is not None:
            self._miss_fallbacks += 1
        self._count_fallback(reason, what="computes its values through Triton's Heuristics.run")
        return result


class PatchedAutotunerOverHeuristics(PatchedHeuristics):
    """The native dispatch of Triton's own ``@triton.autotune`` over Triton's own
    ``@triton.heuristics`` (one, or a stack) over a ``triton.jit`` function, as FlagGems'
    nearest upsampling kernels and flash-linear-attention's WALL attention kernels stack them,
    under :func:`patch`: a call is one native hit whose record carries the tuned
    config's values and the values the heuristics computed with them, and sets the autotuner's
    ``best_config`` as Triton's ``Autotuner.run`` does.

    Triton's ``Autotuner.run`` picks the config by its autotune key, then calls the heuristics'
    ``run`` with the config's values (and the compile options it sets) among the keywords, so
    each heuristic function sees them besides the call's arguments (``runtime/autotuner.py``).
    The native key is the kernel's, plus the autotuner's (as :class:`PatchedAutotuner`'s), plus
    for every parameter a heuristic's code spells, what :class:`PatchedHeuristics`'s holds: so
    the config is implied by the key, and so is every value computed from the config and the
    keyed arguments. A miss runs Triton's ``Autotuner.run`` itself (it tunes if its key is new;
    its launches are native underneath), then runs the heuristic functions once more on what
    they saw for the launch, noting what they read, and registers the key only when every read
    is implied by the native key (a config's name, or what :class:`PatchedHeuristics` allows)
    and each value is the one the launch had. Every other call runs as Triton runs it, counted
    as a fallback with the reason: a call either class leaves to Triton, or a value that
    differs from the launch's (a function reading state its code does not show). An autotuner
    whose configs set a name the heuristics compute, or over a heuristics or kernel with a
    ``run`` of its own, keeps Triton's path.
    """

    _stats_suffix = " [triton.autotune]"

    @classmethod
    def for_autotuner(cls, autotuner: Autotuner) -> PatchedAutotunerOverHeuristics | None:
        """Its dispatch for ``autotuner`` (whose ``fn`` is a Triton ``Heuristics``), or None
        when it keeps Triton's path (above)."""
        under: list[Any] = []
        stack = _heuristics_stack(autotuner.fn, autotuner, under)
        if stack is None:
            return None
        values, jit_fn = stack
        if not isinstance(jit_fn, JITFunction) or not _launches_through_served_run(
            jit_fn, autotuner
        ):
            return None
        under.append(jit_fn)
        if not _registration_allows(autotuner):
            return None
        config_params = PatchedAutotuner.config_params(autotuner, jit_fn)
        if config_params is None or set(config_params) & set(values):
            return None  # a config sets what the record cannot carry, or a computed name
        reads = _ValueReads.of(values, jit_fn)
        if reads is None:
            return None
        return cls(
            autotuner.fn, jit_fn, values, reads, autotuner, config_params, tuple(under), autotuner
        )

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        if key is not None:
            reason = self._call_not_native(kwargs) or reason
        return self._tuned_miss(grid, args, kwargs, key, device, reason, self._computed_under)

    def _computed_under(
        self, grid, args: tuple, merged: dict, launch: _TunedLaunch
    ) -> dict[str, Any] | str:
        """The values the heuristics computed for the launch a miss's ``Autotuner.run`` made
        (``merged``: the call's keywords and the config's), or why the key does not imply
        them."""
        values, reason = self._compute(grid, args, merged, frozenset(launch.config.all_kwargs()))
        if reason is not None:
            return reason
        missing = object()
        for name, value in values.items():
            launched = launch.kwargs.get(name, missing)
            try:
                same = type(launched) is type(value) and bool(launched == value)
            except Exception:  # noqa: BLE001 - a value without a plain equality is not keyed
                same = False
            if not same:
                return (
                    f"the heuristic for {name!r} gave {value!r} where the launch had "
                    f"{'nothing' if launched is missing else repr(launched)}"
                )
        return values


class _ValueReads:
    """What the heuristic functions of a stack read, found from their code
    (``fastkernel._heuristic_code``): the names they spell, those they only compare with None
    by identity, and why one may read state outside its arguments (or None)."""

    __slots__ = ("identity_only", "outside", "spelled")

    def __init__(self, spelled: frozenset[str], identity_only: frozenset[str], outside: str | None):
        self.spelled = spelled
        self.identity_only = identity_only
        self.outside = outside

    @classmethod
    def of(cls, values: dict[str, Any], jit_fn: JITFunction) -> _ValueReads | None:
        """Their reads, or None when a computed name is not a constexpr parameter of ``jit_fn``
        or a function is not a plain Python function."""
        params = {p.name: p for p in jit_fn.params}
        spelled: set[str] = set()
        identity_only: set[str] = set()
        other_uses: set[str] = set()
        outside = None
        for name, fn in values.items():
            p = params.get(name)
            if p is None or not p.is_constexpr:
                return None
            if not isinstance(fn, types.FunctionType):
                return None
            reads = _heuristic_code.analyze(fn)
            spelled |= reads.spelled
            identity_only |= reads.identity_only
            other_uses |= reads.spelled - reads.identity_only
            if outside is None and reads.outside is not None:
                outside = f"the heuristic for {name!r} {reads.outside}"
        return cls(frozenset(spelled), frozenset(identity_only - other_uses), outside)


def _heuristics_stack(level: Any, top: Any, under: list[Any]) -> tuple[dict[str, Any], Any] | None:
    """From ``level`` down through the Triton heuristics that ``top`` launches through: each
    computed name's function, in the order their ``Heuristics.run`` calls compute them
    (outermost first), and the first level below that is not a heuristics; None when a level
    other than ``top`` launches through a ``run`` of its own, or a name is computed twice.
    Appends each heuristics level other than ``top`` to ``under``."""
    values: dict[str, Any] = {}
    while isinstance(level, TritonHeuristics):
        if level is not top:
            if not _launches_through_served_run(level, top):
                return None  # a level with a run of its own: its behaviour is its own
            under.append(level)
        for name, fn in level.values.items():
            if name in values:
                return None
            values[name] = fn
        level = level.fn
    return values, level


def _new_dispatch(obj: Any) -> NativeDispatch | None:
    """A new dispatch for a kernel object, or None when that object keeps Triton's path."""
    if isinstance(obj, JITFunction):
        return PatchedKernel(obj)
    fn = getattr(obj, "fn", None)
    if isinstance(obj, TritonHeuristics):
        return PatchedHeuristics.for_heuristics(obj)
    if not isinstance(obj, Autotuner):
        return None
    if isinstance(fn, TritonHeuristics):
        return PatchedAutotunerOverHeuristics.for_autotuner(obj)
    if not isinstance(fn, JITFunction) or not _launches_through_served_run(fn, obj):
        return None  # over another autotuner or a kernel with its own run
    params = PatchedAutotuner.config_params(obj)
    if params is None or not _registration_allows(obj):
        return None
    return PatchedAutotuner(obj, params)


class _Unserved:
    """A kernel object whose native dispatch could not be built (a kernel with more parameters
    than the native path takes, for one): every launch of it takes Triton's own path and is
    counted in :func:`fastkernel.stats` as a fallback under ``reason``."""

    def __init__(self, obj: Any, reason: str):
        suffix = ""
        if isinstance(obj, Autotuner):
            suffix = PatchedAutotuner._stats_suffix
        elif isinstance(obj, TritonHeuristics):
            suffix = PatchedHeuristics._stats_suffix
        fn = obj
        while getattr(fn, "fn", None) is not None:  # Autotuner -> JITFunction -> function
            fn = fn.fn
        self.name = stats_name(fn, suffix)
        self.reason = reason
        self.launches = 0
        _KERNELS.add(self)

    def _stats_name(self) -> str:
        return self.name

    def stats(self) -> dict[str, Any]:
        """The counters :func:`fastkernel.stats` merges: every launch a fallback."""
        return {
            "hits": 0,
            "misses": 0,
            "fallbacks": self.launches,
            "specializations": 0,
            "evictions": 0,
            "table_bytes": 0,
            "fallback_reasons": {self.reason: self.launches} if self.launches else {},
        }


def _new_dispatch_or_unserved(obj: Any) -> NativeDispatch | _Unserved | None:
    """:func:`_new_dispatch`, or an :class:`_Unserved` record (logged once) when building the
    dispatch raises: the kernel then keeps Triton's path instead of failing every launch."""
    try:
        return _new_dispatch(obj)
    except Exception as exc:  # noqa: BLE001 - any failure here means Triton's path, said once
        unserved = _Unserved(obj, f"its native dispatch could not be built: {exc}")
        log.warning(
            "fastkernel: %s goes through Triton's own launcher: %s", unserved.name, unserved.reason
        )
        return unserved


def _type_launches_served(cls: type) -> bool:
    """Whether objects of ``cls`` launch through a ``run`` the patch serves: the patch's own
    (``JITFunction``, ``Autotuner``) or Triton's ``Heuristics.run`` where the patch installed
    it, or a registered ``Autotuner`` subclass's over the patch's (:func:`_registered_run_served`);
    not another subclass's, nor one another library assigned on the class. The native subscript
    asks again whenever the class (or a base) changed."""
    for base, attribute in [*_installed_runs.items(), *_watched_runs.items()]:
        if base.__dict__.get("run") is attribute.function:
            # The patch's function, read through the class and assigned back (SGLang's
            # recorder puts `JITFunction.run` back so): the attribute that also watches
            # instance assignments goes back in its place.
            type.__setattr__(base, "run", attribute)
    run = getattr(cls, "run", None)
    if run in PATCHED_RUNS or (run is HEURISTICS_RUN and TritonHeuristics in _installed_runs):
        return True
    return issubclass(cls, Autotuner) and _registered_run_served(cls)


def _runs_above_autotuner(cls: type) -> Iterator[tuple[type, Any]]:
    """Each class in ``cls``'s MRO before Triton's ``Autotuner`` that holds a ``run`` (whose
    ``super().run`` calls lead to ``Autotuner.run``), with its registration
    (``fastkernel._autotuner_classes``) or None. Nothing for a class that is not an
    ``Autotuner``."""
    if not issubclass(cls, Autotuner):
        return
    for owner in cls.__mro__:
        if owner is Autotuner:
            return
        if "run" in owner.__dict__:
            yield owner, _classes.registration(owner)


def _registered_run_served(cls: type) -> bool:
    """Whether objects of ``cls``, an ``Autotuner`` subclass, call a registered ``run`` that
    reaches the patch's ``Autotuner.run`` through ``super()``, each class on the way registered
    and as registered."""
    for owner, found in _runs_above_autotuner(cls):
        if found is None or not found.current(cls, _unwrapped_run(owner)):
            return False
    return Autotuner.__dict__.get("run") is _installed_runs.get(Autotuner, False)


def _unwrapped_run(owner: type) -> Any:
    """The ``run`` function ``owner``'s ``__dict__`` holds, through the patch's watch on it."""
    run = owner.__dict__.get("run")
    return run.function if isinstance(run, _RunAttribute) else run


def _own_run(autotuner: Autotuner) -> Any:
    """The ``run`` function a served autotuner's calls go through: Triton's ``Autotuner.run``,
    or a registered subclass's own (which reaches Triton's through ``super()``)."""
    owner = _run_owner(type(autotuner))
    return AUTOTUNER_RUN if owner is Autotuner or owner is None else _unwrapped_run(owner)


def _watch_registered_runs(cls: type) -> None:
    """Puts the patch's watch (:class:`_RunAttribute`) on the ``run`` of each registered class
    in ``cls``'s MRO, as on Triton's classes: a ``run`` assigned on one of their objects then
    drops that object's dispatch (Python finds the class's own ``run`` before Triton's, so the
    watch on ``Autotuner.run`` never sees it). :func:`unpatch` puts the functions back."""
    for owner, found in _runs_above_autotuner(cls):
        run = owner.__dict__["run"]
        if found is not None and run is not None and not isinstance(run, _RunAttribute):
            _watched_runs[owner] = _RunAttribute(run, owner)
            type.__setattr__(owner, "run", _watched_runs[owner])


def register_autotuner(cls: type, *, when: Callable[[Any], bool] | None = None) -> None:
    """Serve ``cls``, a subclass of Triton's ``Autotuner`` that defines its own ``run``, natively
    under :func:`patch`.

    Without this, such a class keeps its own ``run`` on every call (only the launch underneath
    is native). Registering it declares that ``cls.run``, called with a call whose autotune key
    (Triton's: the ``key`` arguments' values and every tensor's dtype) it has launched before,
    does what Triton's ``Autotuner.run`` does for a key in ``self.cache``: it ends in
    ``super().run(*args, **kwargs)`` with the call unchanged, and nothing else it does changes a
    launch. Then the first call of each key runs ``cls.run`` itself (its own config lookup, or
    Triton's tuning through ``super().run``) and the native record keeps the config that call
    launched; later calls of the key are one native hit, which sets ``best_config`` and skips
    ``cls.run``. Another ``run`` assigned on ``cls``, on one of its objects or on Triton's
    ``Autotuner`` sends the calls through it again, as for Triton's own classes. Objects
    launched before the registration are served from their next launch. The registration lasts
    for the process (the class is kept alive).

    Parameters
    ----------
    cls : type
        A subclass of ``triton.runtime.autotuner.Autotuner`` with a ``run`` function in its own
        ``__dict__`` that reaches Triton's through ``super()`` (directly, or through registered
        classes).
    when : callable(autotuner) -> bool, optional
        Asked of each autotuner object when its native dispatch is built (at its first launch
        under the patch, and again after its dispatch is dropped): False keeps that object on
        its own ``run``. A predicate that raises answers False (logged).

    Raises
    ------
    TypeError
        ``cls`` is not a subclass of Triton's ``Autotuner``, or ``when`` is neither None nor
        callable.
    ValueError
        ``cls`` is Triton's ``Autotuner`` itself, defines no ``run`` of its own, or has a
        ``run`` that is not a function.
    """
    _classes.register(cls, when)
    with _lock:
        # Its objects launched before now, refused as a class or kept on Python under a
        # heuristics: decided again at their next launch.
        _C.forget_refused_types()
        for ref, _over in list(_under.values()):
            level = ref()
            if isinstance(level, cls):
                _forget_dispatches_over(level)


def _registration_allows(autotuner: Autotuner) -> bool:
    """Whether each registered class ``autotuner``'s run goes through allows serving it."""
    return all(
        found is not None and found.allows(autotuner)
        for _owner, found in _runs_above_autotuner(type(autotuner))
    )


def _type_run_served(obj: Any) -> bool:
    """:func:`_type_launches_served` of ``obj``'s type."""
    return _type_launches_served(type(obj))


def _run_owner(cls: type) -> type | None:
    """The class in ``cls``'s MRO whose ``__dict__`` holds the ``run`` its objects call."""
    return next((c for c in cls.__mro__ if "run" in c.__dict__), None)


def _tritons_own_run(cls: type) -> bool:
    """Whether ``cls.run`` is the function Triton defines (``runtime/jit.py``,
    ``runtime/autotuner.py``), not one another library assigned on the class, as vLLM does to
    ``Autotuner.run`` under ``VLLM_TRITON_FORCE_FIRST_CONFIG`` (a replacement made before
    fastkernel was imported included, and one made with ``functools.wraps``, which copies the
    names: its code is not in Triton's module)."""
    run = cls.__dict__.get("run")
    return _classes.defined_by(cls, "run", run) and run not in PATCHED_RUNS


def _launches_through_served_run(level: Any, top: Any) -> bool:
    """Whether ``level``, which ``top`` launches through (a kernel, autotuner or heuristics
    under it), launches through a ``run`` the patch serves: none set on the instance, and its
    type's (:func:`_type_run_served`) or Triton's class's with another library's ``run`` on it
    for now (a launch of ``top`` checks that natively, :func:`_set_under_types`), not a
    subclass's own. Notes the dependency either way, so that a ``run`` set on or deleted from
    ``level`` later drops ``top``'s dispatch (:func:`_forget_dispatches_over`)."""
    _note_under(level, top)
    if "run" in vars(level):
        return False
    if _type_run_served(level):
        _watch_registered_runs(type(level))
        return True
    return _served_for_now(type(level))


def _served_for_now(cls: type) -> bool:
    """Whether ``cls``'s objects launch through Triton's class's ``run`` or a registered
    subclass's, which another library's ``run`` assigned on a class may displace for a while
    (the native subscript asks :func:`_type_launches_served` again when a class changes)."""
    owner = _run_owner(cls)
    return owner in _KERNEL_CLASSES or (
        owner is not None
        and issubclass(owner, Autotuner)
        and _classes.registration(owner) is not None
    )


def _set_under_types(dispatch: NativeDispatch, top: Any, levels: Iterable[Any]) -> None:
    """Tells ``dispatch`` (serving ``top``) the classes of the ``levels`` its launches go
    through underneath, other than ``top``'s own (which the native subscript checks anyway):
    Triton's ``run`` of ``top`` calls theirs, so while another library's ``run`` is assigned on
    one of these classes (SGLang's launch recorder on ``JITFunction``, vLLM's
    ``Autotuner.run``), ``top``'s launches take Triton's path and call it (``_C``
    ``_set_under_types``; ``csrc/python/patch_hook.cpp``)."""
    dispatch._set_under_types(
        tuple(dict.fromkeys(type(level) for level in levels if type(level) is not type(top)))
    )


def _dispatch_for(obj: Any):
    """The patch factory (called natively at each launch of a kernel object it has no cached
    dispatch for): its dispatch; None when this object keeps Triton's own path; False when every
    instance of its type does (a subclass with its own ``run``)."""
    if not _type_run_served(obj):
        if _served_for_now(type(obj)):
            return None  # a run another library assigned on Triton's class, maybe for a while
        return False  # a subclass with its own run: its behaviour is its own
    if "run" in getattr(obj, "__dict__", ()):
        return None  # a run of its own (`kernel.run = wrapper`), which Triton's [grid] calls
    with _lock:  # not while unpatch() runs in another thread
        if _saved is None:
            return None
        _watch_registered_runs(type(obj))
        dispatch = obj.__dict__.get(PATCH_ATTR)
        served = _served.get(id(obj))
        if dispatch is not None and (served is None or served() is not obj):
            dispatch = None  # a copy (copy.copy copies the instance dict): given its own
        if dispatch is None:
            dispatch = _new_dispatch_or_unserved(obj)
            obj.__dict__[PATCH_ATTR] = dispatch if dispatch is not None else False
            _served[id(obj)] = weakref.ref(obj, functools.partial(_forget_served, id(obj)))
        return dispatch if isinstance(dispatch, NativeDispatch) else None


def _count_unserved(obj: Any) -> None:
    """Counts a launch of ``obj`` on Triton's path when the patch could not serve it."""
    unserved = obj.__dict__.get(PATCH_ATTR)
    if type(unserved) is _Unserved:
        unserved.launches += 1


def _patched_run(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` under the patch: a launch goes through the kernel's native dispatch;
    ``warmup=True`` (compile only) and kernels that keep Triton's path go to Triton's ``run``."""
    if not warmup:
        _note_tuned_launch(self, kwargs)
        dispatch = _C.patched_dispatch(self)
        if dispatch is not None:
            return dispatch[grid](*args, **kwargs)
        _count_unserved(self)
    with tritons_own_launches():  # its handle's `run` is then Triton's at once
        return TRITON_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)


def _in_tuned_miss(autotuner: Autotuner) -> bool:
    """Whether the innermost tuned miss on this thread is ``autotuner``'s: its registered
    subclass's ``run`` is running and now calls ``super().run``, which is Triton's for it."""
    pending: list[_TunedLaunch] = getattr(_tuning, "pending", [])
    return bool(pending) and pending[-1].autotuner is autotuner


def _patched_autotuner_run(self, *args, **kwargs):
    """``Autotuner.run`` under the patch: a launch (``grid=`` given, not ``warmup``) goes
    through the autotuner's native dispatch; everything else, and the ``super().run`` of a
    registered subclass's ``run`` on a miss, to Triton's ``Autotuner.run``."""
    if (
        "grid" in kwargs
        and "warmup" in kwargs
        and not kwargs["warmup"]
        and not _in_tuned_miss(self)
    ):
        # (Without `warmup`, Triton's JITFunction.run under Autotuner.run raises TypeError.)
        dispatch = _C.patched_dispatch(self)
        if dispatch is not None:
            kwargs = dict(kwargs)
            grid = kwargs.pop("grid")
            kwargs.pop("warmup", None)
            if type(self) is Autotuner:  # a miss runs Triton's run itself
                return dispatch[grid](*args, **kwargs)
            entered = getattr(_tuning, "entered", None)
            _tuning.entered = self  # for a miss: any run of a subclass over this one has run
            try:
                return dispatch[grid](*args, **kwargs)
            finally:
                _tuning.entered = entered
        _count_unserved(self)
    try:
        return AUTOTUNER_RUN(self, *args, **kwargs)
    finally:
        # Triton's run set best_config itself: the next hit of the autotuner's dispatch sets
        # it again even when its config is the one a hit set last.
        served = self.__dict__.get(PATCH_ATTR)
        if isinstance(served, (PatchedAutotuner, PatchedAutotunerOverHeuristics)):
            served._set_publish(self, "best_config")


PATCHED_RUNS.add(_patched_autotuner_run)


class _RunAttribute:
    """``run`` of Triton's ``JITFunction``, ``Autotuner`` and ``Heuristics`` (and of a registered
    ``Autotuner`` subclass) while patched: what Python's own lookup gives, and a watch on
    instance assignments.

    Read on the class, it is ``function`` (the patched run, or Triton's own for ``Heuristics``);
    read on an instance, the ``run`` assigned on that instance if there is one (kept in its
    ``__dict__``, as without the patch), else ``function`` bound to it. Through ``super()``
    from a subclass's own ``run`` (the instance's class has a ``run`` before ``owner``, the
    class holding this attribute, in its MRO), ``function`` bound to it, as ``super()`` reads
    no instance attribute. Assigning or deleting an instance's ``run`` (``kernel.run =
    wrapper``, which Triton's ``kernel[grid]`` calls) also drops the instance's native
    dispatch: its next launch asks the patch factory again, which keeps it on Triton's path,
    the wrapper called, while one is assigned and serves it natively again once it is
    deleted. The objects that launch through it (a heuristics or an autotuner
    over it, each level of a heuristics stack) lose their dispatches too, and decide again at
    their next launch. (A change made through ``kernel.__dict__`` directly is not seen.)
    """

    __slots__ = ("function", "owner")

    def __init__(self, function, owner: type):
        self.function = function
        self.owner = owner

    def __get__(self, obj, cls=None):
        if obj is None:
            return self.function
        try:
            run = obj.__dict__["run"]
        except KeyError:
            return self.function.__get__(obj, cls)
        if _run_owner(type(obj)) is not self.owner:  # super().run from a subclass's run
            return self.function.__get__(obj, cls)
        return run

    def __set__(self, obj, value) -> None:
        obj.__dict__["run"] = value
        _C.drop_patched_dispatch(obj)
        _forget_dispatches_over(obj)

    def __delete__(self, obj) -> None:
        try:
            del obj.__dict__["run"]
        except KeyError:
            raise AttributeError(
                f"{type(obj).__name__!r} object has no instance attribute 'run'"
            ) from None
        _C.drop_patched_dispatch(obj)
        _forget_dispatches_over(obj)


# The instance attributes of Triton's Autotuner and Heuristics that their native dispatch is
# built from, by class. While patched each is a native descriptor (_C.DispatchInput): read and
# stored in the instance __dict__ as without the patch (a read stays a dict lookup, which
# Triton's own run makes several of on every call), and assigning or deleting one calls
# _forget_dispatch, so the next launch is built from what is there now, as Triton's run reads
# them on every call. (A change made in place, such as ``heuristics.values[name] = f`` or
# ``autotuner.cache.clear()``, or through ``__dict__`` directly, is not seen.)
_DISPATCH_INPUTS = (
    (Autotuner, ("fn", "configs", "keys", "cache")),
    (TritonHeuristics, ("fn", "values")),
)


def _forget_dispatch(obj: Any) -> None:
    """Drops ``obj``'s dispatch and those of the objects launching through it."""
    with _lock:
        _C.drop_patched_dispatch(obj)
        obj.__dict__.pop(PATCH_ATTR, None)
        _forget_dispatches_over(obj)


def _handle_dispatch(handle) -> NativeDispatch | None:
    """The dispatch serving the kernel a ``CompiledKernel`` or ``CachedKernel`` was compiled
    from (``handle.src.fn``) under the patch, or None when the patch does not serve it."""
    fn = getattr(getattr(handle, "src", None), "fn", None)
    return _C.patched_dispatch(fn) if isinstance(fn, JITFunction) else None


def _patched_handle_getitem(self, grid, own_getitem=COMPILED_GETITEM):
    """``handle[grid]`` under the patch past the native handle subscript, for a
    ``CompiledKernel`` (or a disk-cache ``CachedKernel``) of a kernel the patch serves: the
    native launch of the binary (``NativeDispatch._handle_launch``, kernel.py), or Triton's
    runner with each launch counted as a fallback; the handle type's own ``__getitem__``
    (``own_getitem``) for any other binary."""
    dispatch = _handle_dispatch(self)
    if dispatch is None:
        return own_getitem(self, grid)
    return dispatch._handle_launch(self, grid)  # a NativeDispatch (kernel.py)


def _patched_handle_run(self, own_run=COMPILED_RUN):
    """``handle.run`` under the patch: the handle's launcher object, which launch caches call
    directly (vLLM's ``CachedKernel`` keeps ``compiled.run`` and calls it as
    ``run(gx, gy, gz, stream, function, packed_metadata, None, enter_hook, exit_hook, *args)``).
    For a handle of a kernel the patch serves, a native launcher object
    (``_C.run_launcher``): the native launch of the binary where Triton's launcher would launch
    exactly that, else Triton's own launcher object (``own_run``), counted as a fallback, behind
    the check of what it would read past (:func:`fastkernel._handle_args.checked_launcher`), as
    is the launcher object of a handle whose launches take Triton's runner. Triton's own
    launcher object for any other handle, and inside a launch handed to Triton's own path
    (``kernel.tritons_own_launches``), whose runner calls ``run`` again."""
    with tritons_own_launches():  # (a CachedKernel's is its Triton CompiledKernel's)
        triton_run = own_run.__get__(self, type(self))  # loads the module, as Triton's does
    if in_tritons_own_launch():
        return triton_run
    dispatch = _handle_dispatch(self)
    if dispatch is None:
        return triton_run
    launcher = dispatch._handle_launcher(self)
    if not isinstance(launcher, CompiledLaunch):
        return checked_launcher(HandleSignature.of(self), triton_run)
    return _C.run_launcher(
        self,
        launcher,
        checked_launcher(launcher._signature, triton_run),
        self.function,
        self.packed_metadata,
        _HOOK_CHAIN,
        launcher._count_run_fallback,
    )


#: ``CachedKernel.__getitem__`` past the native handle subscript under the patch.
_patched_cached_getitem = functools.partial(
    _patched_handle_getitem, own_getitem=_cache.CachedKernel.__getitem__
)


PATCHED_RUNS.add(_patched_run)

# Python names a function by these in the TypeError a bad call raises (a missing `warmup`, a
# keyword given twice): the patched methods raise Triton's own message.
for _patched, _original in ((_patched_run, TRITON_RUN), (_patched_autotuner_run, AUTOTUNER_RUN)):
    _patched.__module__ = _original.__module__
    _patched.__qualname__ = _original.__qualname__
del _patched, _original


def _disabled_reason() -> str | None:
    if _env.triton_interpret():
        return "TRITON_INTERPRET=1 (Triton's interpreter runs kernels on CPU tensors)"
    if _env.flag("FASTKERNEL_DISABLE"):
        return "FASTKERNEL_DISABLE=1"
    import torch

    hip = getattr(torch.version, "hip", None)
    if hip:  # its "cuda" tensors are HIP's, launched by Triton's HIP driver
        return (
            f"torch {torch.__version__} is a ROCm build (HIP {hip}); the native path launches "
            "through the CUDA driver only"
        )
    return None


def is_patched() -> bool:
    """Whether :func:`patch` is in effect."""
    return _saved is not None


def patch() -> bool:
    """Serve every Triton kernel launch in this process natively, until :func:`unpatch`.

    Kernels created before and after the call are served; so are the launches that
    ``triton.autotune`` and ``triton.heuristics`` make. Calling it again does nothing.

    Returns
    -------
    bool
        True when the patch is in effect; False when ``TRITON_INTERPRET=1``,
        ``FASTKERNEL_DISABLE=1`` or a ROCm build of torch (``torch.version.hip``) make it a
        no-op (logged on the ``fastkernel`` logger). A Triton
        outside ``SUPPORTED_TRITON`` never gets here: ``import fastkernel`` refuses it with
        ImportError.
    """
    global _saved
    with _lock:
        if _saved is not None:
            return True
        reason = _disabled_reason()
        if reason is not None:
            log.info("fastkernel.patch(): not patching Triton: %s", reason)
            return False
        from . import _host_helpers

        saved = {
            (cls, name): cls.__dict__[name]
            for cls in _PATCHED_CLASSES
            for name in ("__getitem__", "run")
            if name in cls.__dict__
        }
        triton_getitem = KernelInterface.__dict__["__getitem__"]
        for cls in _KERNEL_CLASSES:
            _C.install_patch(cls, _dispatch_for, triton_getitem, _type_launches_served)
        for cls, function in (
            (JITFunction, _patched_run),
            (Autotuner, _patched_autotuner_run),
            (TritonHeuristics, HEURISTICS_RUN),
        ):
            if _tritons_own_run(cls):
                _installed_runs[cls] = _RunAttribute(function, cls)
                type.__setattr__(cls, "run", _installed_runs[cls])
            else:  # its objects launch through it; what it launches through a kernel is native
                run = cls.__dict__.get("run")
                log.warning(
                    "fastkernel.patch(): %s.run is %s.%s, not Triton's own: kept",
                    cls.__name__,
                    getattr(run, "__module__", "?"),
                    getattr(run, "__qualname__", type(run).__name__),
                )
        for cls, names in _DISPATCH_INPUTS:
            for name in names:
                if name not in cls.__dict__:  # an instance attribute in every supported Triton
                    setattr(cls, name, _C.DispatchInput(name, _forget_dispatch))
        _C.install_handle_subscript(CompiledKernel, None, _patched_handle_getitem)
        _C.install_handle_subscript(_cache.CachedKernel, None, _patched_cached_getitem)
        if isinstance(COMPILED_RUN, property):
            CompiledKernel.run = property(_patched_handle_run)
        _cache.CachedKernel.run = property(  # type: ignore[method-assign,assignment]
            functools.partial(_patched_handle_run, own_run=CACHED_RUN)
        )
        _host_helpers.install()
        install_triton_watch(keep=False)
        _saved = saved
        log.debug("fastkernel.patch(): Triton kernels launch natively")
        return True


def unpatch() -> None:
    """Undo :func:`patch`: Triton's classes get back their own attributes (the same objects) and
    every kernel served meanwhile loses its dispatch. Safe while other threads launch: a launch
    already inside the native path finishes there, later ones go to Triton."""
    global _saved
    with _lock:
        if _saved is None:
            return
        from . import _host_helpers

        for cls in _PATCHED_CLASSES:
            for name in ("__getitem__", "run"):
                if name == "run" and cls in _KERNEL_CLASSES:
                    installed = _installed_runs.pop(cls, None)
                    current = cls.__dict__.get("run")
                    # The patch's own: the attribute, or the function a library read through
                    # the class (`saved = JITFunction.run`) and assigned back.
                    if installed is None or current not in (installed, installed.function):
                        continue  # kept at patch(), or replaced since by another library: theirs
                if (cls, name) in _saved:
                    setattr(cls, name, _saved[(cls, name)])
                else:
                    delattr(cls, name)
        for cls, names in _DISPATCH_INPUTS:
            for name in names:
                if isinstance(cls.__dict__.get(name), _C.DispatchInput):
                    delattr(cls, name)
        for owner, run_watch in _watched_runs.items():
            if owner.__dict__.get("run") is run_watch:  # else replaced since: left as it is
                type.__setattr__(owner, "run", run_watch.function)
        _watched_runs.clear()
        _host_helpers.uninstall()
        _C.uninstall_patch()
        _C.forget_handle_launches()
        uninstall_triton_watch()
        for ref in list(_served.values()):
            jit_fn = ref()
            if jit_fn is not None:
                jit_fn.__dict__.pop(PATCH_ATTR, None)
        _served.clear()
        _under.clear()
        _saved = None
        log.debug("fastkernel.unpatch(): Triton launches its kernels itself again")


@contextlib.contextmanager
def patched() -> Iterator[bool]:
    """``with fastkernel.patched():`` patch for the block, then restore the state before it (a
    block inside an already patched process leaves the patch on). Yields what :func:`patch`
    returned."""
    was = is_patched()
    on = patch()
    try:
        yield on
    finally:
        if not was:
            unpatch()
