"""The ``@fastkernel`` decorator: Triton's ``kernel[grid](...)`` served by native code.

A call is bound, keyed, looked up and launched by ``fastkernel._C`` without running Python.
On a miss (a new specialization or device) the native entry calls :meth:`FastKernel._on_miss`,
which lets Triton specialize and compile exactly as ``JITFunction.run`` would, loads the cubin
with its launch facts as a ``_C.LaunchRecord`` and returns it; the native entry inserts that
record under the call's key and launches it. Calls the native key does not cover go to Triton
itself.
"""

from __future__ import annotations

import builtins
import collections
import collections.abc
import contextlib
import inspect
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import triton
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction, KernelInterface, KernelParam

from . import _C, _env, _grid_program, _host_helpers, _locks
from . import _triton_abi as abi
from . import cache as _cache
from ._handle_args import HandleSignature, TensorDescriptor
from .cache.settings import count as cache_count
from .cache.settings import log_once

log = logging.getLogger("fastkernel")

# Immutable objects Triton takes as constexprs, keyed natively by identity. Every one seen at a
# registration is kept alive by its kernel (FastKernel._keep_identity_keyed), so no address in a
# registered key can be reused by another object.
_IDENTITY_TYPES = abi.IDENTITY_CONSTEXPR_TYPES
# How many such objects a kernel keeps per specialization its table can hold before it drops
# its records to release them (FastKernel._keep_identity_keyed).
_KEEPALIVE_PER_SPECIALIZATION = 4
_C.set_constexpr_types(triton.language.constexpr, _IDENTITY_TYPES)
if TensorDescriptor is not None:  # host tensor descriptors (without, they take Triton's path)
    _C.set_tensor_descriptor_type(TensorDescriptor)


# What the native path installs into Triton, at the first kernel creation (or by patch()):
# under _triton_watch_lock, the knob classes' own __setattr__ / __delattr__ while replaced, and
# whether a kernel outside the patch (which unpatch() leaves alone) needs them to stay.
_triton_watch_lock = _locks.lock()
_saved_knob_methods: dict[type, tuple[Any, Any]] | None = None
_knob_dicts_watched = False
_watch_kept = False
_MISSING = object()
_saved_debug_attr: Any = _MISSING  # JITFunction's own class attribute `debug` (normally none)


def _forget_specializations_of(jit_fn: JITFunction) -> None:
    """Drop the launch records of every native dispatch of ``jit_fn``: its ``debug`` changed,
    which Triton reads into the compile options of each call (``JITFunction.run``:
    ``kwargs.get("debug", self.debug)``) and the native key does not hold, so the next call
    of each specialization compiles (or loads) the binary of the new value."""
    for kernel in list(_KERNELS):
        if isinstance(kernel, NativeDispatch) and kernel.jit_function is jit_fn:
            kernel._invalidate_records()


def _get_debug(self):
    try:
        return self.__dict__["debug"]
    except KeyError:
        raise AttributeError(f"{type(self).__name__!r} object has no attribute 'debug'") from None


def _set_debug(self, value) -> None:
    self.__dict__["debug"] = value
    _forget_specializations_of(self)


def _del_debug(self) -> None:
    try:
        del self.__dict__["debug"]
    except KeyError:
        raise AttributeError("debug") from None
    _forget_specializations_of(self)


#: Installed as ``JITFunction.debug`` while the Triton watch is: the instance attribute Triton
#: sets in ``JITFunction.__init__``, kept in the instance dict as before, whose changes also
#: drop the native records compiled under the old value.
_DEBUG_ATTR = property(_get_debug, _set_debug, _del_debug, "Triton's per-kernel debug option.")


def install_triton_watch(keep: bool) -> None:
    """Install what the native path needs to see inside Triton; idempotent.

    The native knob state (the compile options in every key, the launch hooks) is recomputed
    after a change: edits of the knobs' dicts are seen by dict watchers
    (``_C.configure_knob_watch``), and assignments to knob attributes, which on Python 3.13 bypass
    the dict, by the knob classes' ``__setattr__`` / ``__delattr__``, replaced by ones that also
    mark the state stale (``triton/knobs.py``). Runs at the first kernel creation and in
    :func:`fastkernel.patch`, never at import.

    Parameters
    ----------
    keep : bool
        True for a kernel that outlives the patch (``@fastkernel``, ``fastkernel.autotune``):
        :func:`uninstall_triton_watch` then leaves the knob classes as they are.
    """
    global _saved_knob_methods, _knob_dicts_watched, _watch_kept, _saved_debug_attr
    with _triton_watch_lock:
        _watch_kept = _watch_kept or keep
        if _saved_knob_methods is not None:
            return
        _saved_debug_attr = JITFunction.__dict__.get("debug", _MISSING)
        type.__setattr__(JITFunction, "debug", _DEBUG_ATTR)
        saved: dict[type, tuple[Any, Any]] = {}
        for cls in abi.knob_classes():
            saved[cls] = (cls.__dict__.get("__setattr__"), cls.__dict__.get("__delattr__"))
            set_attr, del_attr = cls.__setattr__, cls.__delattr__

            def __setattr__(self, name, value, _set=set_attr):
                _set(self, name, value)
                _C.mark_knobs_dirty()

            def __delattr__(self, name, _del=del_attr):
                _del(self, name)
                _C.mark_knobs_dirty()

            type.__setattr__(cls, "__setattr__", __setattr__)
            type.__setattr__(cls, "__delattr__", __delattr__)
        _saved_knob_methods = saved
        if not _knob_dicts_watched:
            _C.configure_knob_watch(abi.knob_dicts(), abi.knob_state)
            _knob_dicts_watched = True
        _C.mark_knobs_dirty()  # assignments made before this were not seen


def uninstall_triton_watch() -> None:
    """Give the knob classes back their own ``__setattr__`` / ``__delattr__`` (the same
    objects), unless a kernel created outside the patch needs them; called by
    :func:`fastkernel.unpatch`. The dict watchers stay: they only mark the state stale."""
    global _saved_knob_methods, _saved_debug_attr
    with _triton_watch_lock:
        if _saved_knob_methods is None or _watch_kept:
            return
        if _saved_debug_attr is _MISSING:
            type.__delattr__(JITFunction, "debug")
        else:
            type.__setattr__(JITFunction, "debug", _saved_debug_attr)
        _saved_debug_attr = _MISSING
        for cls, methods in _saved_knob_methods.items():
            for name, method in zip(("__setattr__", "__delattr__"), methods):
                if method is None:
                    type.__delattr__(cls, name)
                else:
                    type.__setattr__(cls, name, method)
        _saved_knob_methods = None


_C.set_launch_hook_support(abi.HOOK_METADATA_TYPE, abi.add_launch_metadata, abi.plain_lazy_dict)
_C.set_pre_run_options(abi.add_run_options)
_C.set_grid_program_support(
    _grid_program.compile_grid,
    _host_helpers.CDIV,
    _host_helpers.NEXT_POWER_OF_2,
    builtins.max,
    builtins.min,
)

#: Triton's own ``JITFunction.run``, captured before fastkernel.patch() can replace it: the launch
#: path of every fallback.
TRITON_RUN = JITFunction.run


#: The ``run`` functions fastkernel.patch() puts on Triton's classes, told apart by identity (a
#: marker attribute would not do: ``functools.wraps`` copies a function's ``__dict__`` onto the
#: wrapper another library assigns over one of them).
PATCHED_RUNS: set[Any] = set()


def triton_launch(jit_fn: JITFunction, grid, args: tuple, kwargs: dict):
    """Launch a call through Triton's own ``run`` (the kernel's class's, or Triton's
    ``JITFunction.run`` where fastkernel.patch() replaced it), as ``jit_fn[grid](*args, **kwargs)``
    does without fastkernel."""
    run = type(jit_fn).run
    if run in PATCHED_RUNS:
        run = TRITON_RUN
    return run(jit_fn, *args, grid=grid, warmup=False, **kwargs)


_KIND_NAMES = {bool: "bool", int: "int", float: "float", type(None): "None"}


def _kind_of(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "tensor"
    return _KIND_NAMES.get(type(value), type(value).__name__)


#: Parameter kinds the native binder does not bind, as named in its error.
_UNBOUND_KINDS = {
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}


def _specialization_flags(param: KernelParam) -> tuple[bool, bool]:
    """``(specialize, align)`` of a declared parameter: whether Triton value-specializes it (not
    under ``do_not_specialize``, and not annotated as a float or bool, which Triton's
    jit.py ``create_function_from_signature`` leaves unspecialized), and whether it keys the
    16-byte alignment (not under ``do_not_specialize_on_alignment``)."""
    ann = param.annotation_type
    unspecialized_annotation = bool(ann) and (ann == "u1" or ann[:2] in ("fp", "bf"))
    return (
        not param.do_not_specialize and not unspecialized_annotation,
        not param.do_not_specialize_on_alignment,
    )


def _params_spec(
    jit_fn: JITFunction, tune_flags: dict[str, int] | None = None
) -> list[tuple[str, bool, bool, bool, int, bool, Any]]:
    """The native key builder's view of each declared parameter (see csrc/python/kernel_object.h):
    (name, is_constexpr, specialize, align, tune flags, has_default, default). ``tune_flags``
    maps parameter names to TuneFlag bits (fastkernel.autotune; csrc specialization.h).

    Raises TypeError for a kernel with a ``*args``, keyword-only or ``**kwargs`` parameter: the
    native binder binds every parameter by position or by name, as those kinds do not."""
    # Triton's own signature of the function (JITFunction.signature, what its binder binds).
    signature = getattr(jit_fn, "signature", None) or inspect.signature(jit_fn.fn)
    for param in signature.parameters.values():
        if param.kind in _UNBOUND_KINDS:
            raise TypeError(
                f"{jit_fn.__name__}: its {_UNBOUND_KINDS[param.kind]} parameter '{param.name}' "
                "is not bound by the native launch; launch it through Triton"
            )
    spec = []
    for p in jit_fn.params:
        specialize, align = _specialization_flags(p)
        tune = (tune_flags or {}).get(p.name, 0)
        spec.append(
            (
                p.name,
                bool(p.is_constexpr),
                specialize,
                align,
                tune,
                p.has_default,
                p.default if p.has_default else None,
            )
        )
    return spec


def _warm_spec_problem(
    jit_fn: JITFunction, spec: abi.Specialization, args: tuple, kwargs: dict
) -> str | None:
    """Why ``spec``, read from the disk cache's warm index, is not the specialization Triton
    gives this call, or None. Judged on what makes a binary unsafe for a call: each pointer's
    16-byte alignment and each int's == 1 and divisible-by-16 classes, by Triton's rules (the
    native key builder's, csrc/include/fastkernel/specialization.h pointer_class / int_class).
    An int of 1 is a constant of the binary only for a parameter without a type annotation: an
    annotated one (``n: tl.int32``) keeps its annotation as its signature type, and the binary
    takes it as a parameter (triton/runtime/jit.py ``create_function_from_signature``)."""
    params = jit_fn.params
    bound = dict(zip((p.name for p in params), args))
    bound.update(kwargs)
    for p in params:
        name = p.name
        if p.is_constexpr or name not in bound:
            continue
        specialize, align = _specialization_flags(p)
        value, index = bound[name], (p.num,)
        divisible = any(a[0] == "tt.divisibility" and a[1] == 16 for a in spec.attrs.get(index, ()))
        if isinstance(value, int) and not isinstance(value, bool):
            if specialize and value == 1 and not p.annotation_type:
                if spec.constexprs.get(index) != 1:
                    return f"'{name}' is 1 but the record's binary takes it as a parameter"
                continue
            if index in spec.constexprs:
                return f"'{name}' is {value} but the record's binary has it as a constant"
            if divisible != (specialize and align and value % 16 == 0):
                return f"'{name}' = {value} has another divisibility than the record's binary"
        elif hasattr(value, "data_ptr") and not isinstance(value, type):
            try:
                aligned = value.data_ptr() % 16 == 0
            except Exception:  # noqa: BLE001 - not a pointer argument after all
                continue
            if divisible != (specialize and align and aligned):
                return f"'{name}' has another 16-byte alignment than the record's binary"
    return None


def stats_name(fn: Any, suffix: str = "") -> str:
    """A kernel's name in :func:`stats`: its Python function's ``module.qualname``, then
    ``suffix``."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}{suffix}"


class StatsSource(Protocol):
    """What :func:`stats` reads: native dispatches, and kernels the patch could not serve."""

    def _stats_name(self) -> str: ...

    def stats(self) -> dict[str, Any]: ...


#: Every live source of :func:`stats` counters.
_KERNELS: weakref.WeakSet[StatsSource] = weakref.WeakSet()

# What a callable grid receives is a read-only mapping (Triton passes a dict of the same
# contents); it is a collections.abc.Mapping to isinstance checks.
collections.abc.Mapping.register(_C.GridMeta)

#: The attribute under which fastkernel.patch() keeps a JITFunction's dispatch (its __dict__).
PATCH_ATTR = "_fastkernel_dispatch"

#: Triton's own ``CompiledKernel.__getitem__``, as it was when fastkernel was imported.
COMPILED_GETITEM = CompiledKernel.__getitem__

# How many launches this thread has handed to Triton's own path (its runner, JITFunction.run)
# and not finished: while one is, a handle's `run` under the patch gives Triton's own launcher
# object (fastkernel.patch), so a launch handed to Triton is Triton's to the end.
_TRITON_LAUNCHES = threading.local()


@contextlib.contextmanager
def tritons_own_launches() -> Iterator[None]:
    """Within the block this thread's launches are Triton's own down to its launcher object."""
    _TRITON_LAUNCHES.depth = getattr(_TRITON_LAUNCHES, "depth", 0) + 1
    try:
        yield
    finally:
        _TRITON_LAUNCHES.depth -= 1


def in_tritons_own_launch() -> bool:
    """Whether this thread is inside :func:`tritons_own_launches`."""
    return getattr(_TRITON_LAUNCHES, "depth", 0) > 0


#: The fallback reason of a launch of a ``CompiledKernel`` (what ``warmup()`` returns, what a
#: library's launch cache keeps) that the native launch of its binary does not take.
COMPILED_LAUNCH_REASON = (
    "a launch of a CompiledKernel that the native launch of its binary does not take (a grid "
    "other than three dims, launch hooks set, or a binary it cannot load): it launches through "
    "Triton's own launcher"
)

#: The fallback reason of a ``CompiledKernel`` launch given keywords (``stream=``).
COMPILED_KEYWORDS_REASON = (
    "a launch of a CompiledKernel given keywords (stream=): it launches through Triton's own "
    "launcher"
)

#: Why a call of a kept handle's ``run`` (its launcher object, under the patch) went to Triton's
#: own launcher object; the particular reason follows after a colon.
COMPILED_RUN_REASON = (
    "a call of a CompiledKernel's launcher object that the native launch does not take"
)

#: Specializations each kernel keeps registered (FASTKERNEL_MAX_SPECIALIZATIONS; 0 = no limit).
DEFAULT_MAX_SPECIALIZATIONS = 1024


def _address_keyed(values) -> list[Any]:
    """The objects whose addresses the native key of these values may hold (recursing into
    tuples and tl.constexpr wrappers): objects keyed by identity, and the types of numbers that
    are not plain int, float or bool (key_builder.cpp, push_typed_number). A registrant keeps
    them alive, so no address in a registered key is reused by another object."""
    found: list[Any] = []
    for v in values:
        if isinstance(v, triton.language.constexpr):
            v = v.value
        if isinstance(v, _IDENTITY_TYPES):
            found.append(v)
        elif isinstance(v, tuple):
            found.extend(_address_keyed(v))
        elif type(v) not in _PLAIN_NUMBERS and (
            isinstance(v, (int, float)) or type(v).__module__ == "numpy"
        ):
            found.append(type(v))
    return found


_PLAIN_NUMBERS = (int, float, bool)


def capacity_exceeded(items, capacity: int) -> bool:
    """Whether a bounded collection (capacity 0 = unbounded) holds more than it may."""
    return capacity != 0 and len(items) > capacity


def _max_specializations() -> int:
    return _env.count("FASTKERNEL_MAX_SPECIALIZATIONS", DEFAULT_MAX_SPECIALIZATIONS)


#: The counters that count launches (the others, ``specializations`` and ``table_bytes``, are
#: what a kernel holds now).
_LAUNCH_COUNTERS = ("hits", "misses", "fallbacks", "evictions")


def counters_now() -> weakref.WeakKeyDictionary[StatsSource, dict[str, Any]]:
    """Each live kernel's own counters (its ``stats()``) as they are now: the ``since`` of
    :func:`stats_since`."""
    return weakref.WeakKeyDictionary((kernel, kernel.stats()) for kernel in list(_KERNELS))


def stats() -> dict[str, dict[str, Any]]:
    """Native-path counters of every live fastkernel kernel, by ``module.qualname``.

    Returns
    -------
    dict of str to dict
        Per kernel: ``hits``, ``misses``, ``fallbacks``, ``specializations``, ``evictions``,
        ``table_bytes`` (ints) and
        ``fallback_reasons`` (reason -> count). Kernels with the same name are merged by
        summing their counters. Where the misses' binaries came from (the disk cache, its warm
        index, a compile) is counted for the whole process by ``fastkernel.cache.counters()``.
    """
    return stats_since(None)


def stats_since(
    since: collections.abc.Mapping[StatsSource, dict[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """:func:`stats`, with each kernel's launch counters (hits, misses, fallbacks, evictions,
    fallback reasons) less those ``since`` holds for it (a :func:`counters_now` result; a kernel
    it does not hold counts from zero)."""
    result: dict[str, dict[str, Any]] = {}
    for kernel in list(_KERNELS):
        name = kernel._stats_name()
        own = kernel.stats()
        before = since.get(kernel) if since is not None else None
        merged = result.setdefault(
            name,
            {
                "hits": 0,
                "misses": 0,
                "fallbacks": 0,
                "specializations": 0,
                "evictions": 0,
                "table_bytes": 0,
                "fallback_reasons": {},
            },
        )
        for counter in ("specializations", "table_bytes", *_LAUNCH_COUNTERS):
            merged[counter] += own[counter]
        reasons = merged["fallback_reasons"]
        for reason, count in own["fallback_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + count
        if before is not None:
            for counter in _LAUNCH_COUNTERS:
                merged[counter] -= before[counter]
            for reason, count in before["fallback_reasons"].items():
                reasons[reason] -= count
                if reasons[reason] == 0:
                    del reasons[reason]
    return result


class NativeDispatch(_C.Kernel):
    """The native table of one kernel and its Python miss path, shared by :class:`FastKernel`
    and ``fastkernel.autotune``'s kernels: registration of compiled specializations, fallbacks to
    Triton, and the counters. Subclasses call :meth:`_init_native` and define ``_on_miss``."""

    #: Whether the kernel exists only while :func:`fastkernel.patch` is in effect.
    _serves_patch = False

    def _init_native(
        self, jit_fn: JITFunction, params_spec, pre_run_hooks, options: list[str] | None = None
    ) -> None:
        install_triton_watch(keep=not self._serves_patch)
        #: The wrapped ``triton.jit`` function; ``jit_function[grid](...)`` is Triton's own launch.
        self.jit_function = jit_fn
        self._kernel_name: str = jit_fn.__name__
        self._stats_label = stats_name(jit_fn.fn, self._stats_suffix)
        capacity = _max_specializations()
        # The most recent compiled kernels, for inspection (the native records own theirs).
        self._compiled: collections.deque[Any] = collections.deque(maxlen=capacity or None)
        self._capacity = capacity
        # What each registered specialization was compiled from, for fastkernel.export.
        self._registrations: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()
        self._keepalive: dict[int, Any] = {}  # identity-keyed constexpr objects, by id
        self._arg_kinds: dict[int, set] = {}
        self._lock = _locks.rlock()
        self._fallback_reasons: dict[str, int] = {}
        # Fallbacks decided on the miss path (the native entry counts the rest), less the calls
        # counted as fallbacks that Triton then rejected.
        self._miss_fallbacks = 0
        self._refused_keys: dict[bytes, str] = {}  # keys whose cubin the driver would not load
        self._targets: dict[int, Any] = {}
        if options is None:
            # Option names come from the backend's options dataclass; they are the same for
            # every CUDA target, so any target serves to list them.
            options = abi.option_names(abi.cuda_target(9, 0))
        self._configure(
            jit_fn.__name__,
            params_spec,
            options,
            type(self)._on_miss,
            abi.allocate_scratch,
            pre_run_hooks,
        )
        self._set_capacity(capacity)
        _KERNELS.add(self)

    #: Appended to the kernel's name in :func:`stats` (the patch's autotuners and heuristics).
    _stats_suffix = ""

    def _stats_name(self) -> str:
        return self._stats_label

    def stats(self) -> dict[str, Any]:
        """Counters of the native path: ``hits``, ``misses``, ``fallbacks``, ``specializations``
        (registered now), ``evictions``, ``table_bytes`` (heap bytes of the native launch table:
        keys and launch records, the loaded modules excepted; ints) and ``fallback_reasons``
        (reason -> count)."""
        d: dict[str, Any] = self._counters()
        d["fallbacks"] += self._miss_fallbacks
        d["fallback_reasons"] = dict(self._fallback_reasons)
        return d

    # -- miss path ----------------------------------------------------------------------------

    def _target(self, device: int):
        target = self._targets.get(device)
        if target is None:
            import torch

            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability(device)
            else:  # no CUDA torch: ask the driver (the recording stand-in in CPU tests)
                major, minor = _C.device_capability(device)
            target = self._targets[device] = abi.cuda_target(major, minor)
        return target

    def _register_miss(
        self,
        grid,
        args: tuple,
        kwargs: dict,
        key: bytes,
        device: int,
        tuned_args: tuple | None = None,
        published: Any = None,
    ):
        """Compile (or load) the specialization of a call: returns its loaded launch record for
        the native entry to insert under ``key`` and launch, or the result of launching through
        Triton when the native path cannot take this specialization. ``tuned_args`` is what a
        tuned config gives the parameters the call leaves out (see ``_C.LaunchRecord``);
        ``published``, what a hit sets on the kernel's publish owner."""
        record = self._launch_record(args, kwargs, key, device, tuned_args, published)
        if isinstance(record, _C.LaunchRecord):
            return record
        self._miss_fallbacks += 1
        return self._fallback(grid, args, kwargs, record)

    def _tuned_args(self, merged: dict[str, Any], provided) -> tuple:
        """What a record gives the parameters in ``provided`` (set by a tuned config or a
        heuristic, absent from the call): their values in ``merged`` (the call's keywords with
        the config's), else their defaults; None for every other parameter."""
        params = self.jit_function.params
        values = {**{p.name: p.default for p in params if p.has_default}, **merged}
        return tuple(values.get(p.name) if p.name in provided else None for p in params)

    def _launch_record(
        self,
        args: tuple,
        kwargs: dict,
        key: bytes,
        device: int,
        tuned_args: tuple | None = None,
        published: Any = None,
        launched: Any = None,
    ) -> _C.LaunchRecord | str:
        """Compile (or load) the specialization of a call and load its launch record for
        ``key``, launching nothing: the loaded record (noted as registered under ``key``; the
        caller inserts it), or the reason the native path cannot take this specialization.
        ``published`` is what a hit on the record sets on the kernel's publish owner
        (``Kernel._set_publish``). ``launched``: what Triton's own run returned for this call,
        if it ran it; a CompiledKernel of the very cubin found is what hits return, as
        Triton's return it, rather than the disk cache's read-only copy."""
        refused = self._refused_keys.get(key)
        if refused is not None:  # registration failed before: straight to Triton
            return refused
        hook = abi.compile_hook_set()
        if hook is not None:  # not remembered: the next miss after the hook is unset registers
            return f"Triton's knobs.runtime.{hook} is set; Triton compiles and loads the kernel"
        with self._lock:
            target = self._target(device)
            # A warm process finds the specialization of a native key it has seen in the disk
            # cache's warm index and skips Triton's binder; a tuned kernel's index entry also
            # names its config's values (the key leaves them out). Keys holding object
            # addresses (per process) are not indexed.
            address_keyed = _address_keyed((*args, *kwargs.values()))
            indexable = not address_keyed
            tuned = None
            if tuned_args is not None:  # the config's values and options arrive as keywords
                import torch

                tuned = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
            warm = _cache.warm_lookup(self.jit_function, target, key, tuned) if indexable else None
            if warm is not None:
                spec, meta, compiled = warm
                problem = _warm_spec_problem(self.jit_function, spec, args, kwargs)
                if problem is not None:
                    log_once(
                        logging.WARNING,
                        ("warm-misfit", self._stats_name(), problem),
                        "fastkernel: %s: a warm index record does not fit the call "
                        "(%s); specializing with Triton's binder",
                        self.jit_function.__name__,
                        problem,
                    )
                    warm = None
            if warm is None:
                try:
                    spec = abi.specialize(
                        self.jit_function, target, args, kwargs, abi.key_knob_word(key)
                    )
                except abi.UnsupportedByNativePath as exc:
                    return str(exc)
                try:
                    meta, compiled = self._launch_artifact(target, spec)
                except abi.UnsupportedByNativePath as exc:
                    return str(exc)
                except Exception as exc:
                    self._raise_kind_mismatch(args, kwargs, exc)
                    raise
                if indexable:
                    _cache.warm_store(self.jit_function, target, key, spec, tuned)
            from_disk = isinstance(compiled, _cache.CachedKernel)
            if (
                from_disk
                and isinstance(launched, CompiledKernel)
                and launched.asm.get("cubin") == meta.cubin
            ):
                compiled = launched
            record = self._load_record(device, spec, meta, compiled, tuned_args, published)
            if (
                isinstance(record, str)
                and not isinstance(record, _ResourceRefusal)
                and isinstance(compiled, _cache.CachedKernel)
            ):
                # An entry that verifies but cannot become a registration is corrupt: removed
                # (with its warm index record), logged once, and compiled again. One this
                # device lacks the resources for is sound, and stays.
                _cache.discard(compiled, record)
                try:
                    meta, compiled = _cache.compile_and_store(self.jit_function, target, spec)
                except abi.UnsupportedByNativePath as exc:
                    return str(exc)
                from_disk = False
                record = self._load_record(device, spec, meta, compiled, tuned_args, published)
            if isinstance(record, str):
                self._refused_keys[key] = record
                while capacity_exceeded(self._refused_keys, self._capacity):  # oldest first
                    del self._refused_keys[next(iter(self._refused_keys))]
                return record
            if from_disk:
                cache_count("loaded")
                if warm is not None:
                    cache_count("warm")
            self._compiled.append(compiled)
            self._registrations[key] = (target, spec, meta)
            while capacity_exceeded(self._registrations, self._capacity):
                self._registrations.popitem(last=False)
            if address_keyed:
                self._keep_identity_keyed(address_keyed)
            self._remember_kinds(args, kwargs)
            log.debug(
                "fastkernel: registered %s on device %d (%d parameters)",
                meta.name,
                device,
                len(spec.plan),
            )
            return record

    def _hit_call_record(
        self, args: tuple, kwargs: dict, hit_call: Callable[..., Any]
    ) -> _C.LaunchRecord:
        """A record for the call's key whose hits call ``hit_call(grid, *args, **kwargs)``
        instead of launching (a tuned config's ``pre_hook``, then the launch through the kernel
        underneath, which keys the arguments as the hook left them): no binary is compiled or
        loaded for it and the warm index is not written, since the hook may change what the
        launch specializes on. A hit publishes nothing (``hit_call`` sets what it must). The
        call's identity-keyed constexprs are kept alive as for any registration."""
        with self._lock:
            address_keyed = _address_keyed((*args, *kwargs.values()))
            if address_keyed:
                self._keep_identity_keyed(address_keyed)
        return _C.LaunchRecord.for_hit_call(hit_call)

    def _keep_identity_keyed(self, values: list[Any]) -> None:
        """Keeps alive the identity-keyed constexpr objects (``_IDENTITY_TYPES``) of a key about
        to be registered, so that no other object can take an address a registered key holds.

        The native table evicts on its own, so which kept object a remaining key still holds is
        not known here. The set is bounded instead: once it would pass
        ``_KEEPALIVE_PER_SPECIALIZATION`` objects per specialization the table holds, every
        record is dropped, and with them (when no launch has one in flight) the kept objects;
        the specializations still in use register again at their next call."""
        if self._capacity and len(self._keepalive) + len(values) > (
            _KEEPALIVE_PER_SPECIALIZATION * self._capacity
        ):
            self._clear_records()
            if self._counters()["specializations"] == 0:
                self._keepalive.clear()
        for value in values:
            self._keepalive[id(value)] = value

    def _load_record(
        self,
        device: int,
        spec: abi.Specialization,
        meta,
        compiled,
        tuned_args: tuple | None,
        published: Any,
    ) -> _C.LaunchRecord | str:
        """``meta``'s binary loaded on ``device`` as a launch record, else why not. A binary
        Triton compiled here that the native path cannot load (or launch facts it rejects) is
        Triton's to launch; for one read from the disk cache, any error but a missing driver is
        a reason, so the caller can treat the entry as corrupt."""
        from_disk = isinstance(compiled, _cache.CachedKernel)
        try:
            plan, tensor_maps = abi.expand_descriptors(spec.plan, meta.tensordesc_meta)
        except abi.UnsupportedByNativePath as exc:
            return str(exc)
        except Exception as exc:
            if not from_disk:
                raise
            return f"its launch metadata does not fit the specialization: {exc!r}"
        try:
            facts = _registration_facts(meta, device, plan, tensor_maps)
            # Compiling filled used_global_vals (jit.py DependenciesFinder); a hit re-checks them.
            record = _C.LaunchRecord(
                facts,
                meta.cubin,
                compiled,
                tuned_args,
                published,
                global_checks=abi.global_checks(self.jit_function),
            )
            _set_function_attributes(compiled, record)
            return record
        except _C.DriverUnavailableError:
            raise
        except _C.CudaError as exc:
            if getattr(exc, "code", None) == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
                return _ResourceRefusal(f"the device cannot run the binary: {exc}")
            return f"registering the cubin failed: {exc}"
        except ValueError as exc:
            return f"registering the cubin failed: {exc}"
        except Exception as exc:
            if not from_disk:
                raise
            return f"registering the cubin failed: {exc!r}"

    def _launch_artifact(self, target, spec: abi.Specialization):
        """The cubin and launch metadata for a specialization: (LaunchMetadata, handle).

        Read from the on-disk kernel cache when it holds this exact binary (then ``handle`` is a
        read-only ``fastkernel.cache.CachedKernel`` and Triton's compiler is not called), else
        compiled by Triton and written there (``handle`` is Triton's CompiledKernel). ``handle``
        is what a launch returns. Raises ``abi.UnsupportedByNativePath`` for binaries the native
        launcher cannot call, and whatever Triton's compiler raises (see fastkernel/cache.py).
        """
        return _cache.load_or_compile(self.jit_function, target, spec)

    def _handle_launch(self, compiled: Any, grid: Any) -> Callable:
        """``compiled[grid]`` for a ``CompiledKernel`` of this kernel (Triton's fused-softmax
        tutorial launches ``kernel.warmup(...)[(n, 1, 1)](...)``; FlagGems' ``LibEntry`` and
        other launch caches keep what a launch returns and launch it so): the native launch of
        its binary (:class:`CompiledLaunch`) for a grid of three dims (a tuple or list) with no
        launch hook set; else Triton's runner (``CompiledKernel.__getitem__``), each launch
        counted as a fallback for :data:`COMPILED_LAUNCH_REASON`.

        A handle has one launcher, made on its first launch and remembered natively
        (``_C.remember_handle_launch``, csrc/python/handle_launch.cpp) while the handle lives or
        until :func:`fastkernel.unpatch`: its later launches of that kind go straight from the
        handle's native subscript to the launcher, without this method, and every dispatch of
        the kernel shares it (the binary is loaded once per device)."""
        launcher = self._handle_launcher(compiled)
        if (
            type(grid) in (tuple, list)
            and len(grid) == 3
            and not isinstance(launcher, str)
            and not _C.launch_hooks_active()
        ):
            return launcher[grid]
        counter = self if isinstance(launcher, str) else launcher
        runner = COMPILED_GETITEM(compiled, grid)
        signature = (
            HandleSignature.of(compiled) if isinstance(launcher, str) else launcher._signature
        )

        def counted(*args, **kwargs):
            if kwargs.keys() <= {"stream"}:  # else the runner raises its own TypeError first
                signature.check(args)  # raises for what Triton's launcher would read past
            with tritons_own_launches():
                result = runner(*args, **kwargs)
            counter._miss_fallbacks += 1
            counter._count_fallback(COMPILED_LAUNCH_REASON, logging.INFO)
            return result

        return counted

    def _count_fallback(
        self,
        reason: str,
        level: int = logging.WARNING,
        what: str = "goes through Triton's own launcher",
    ) -> None:
        """Count a call that took a Python path for ``reason``; log the first one."""
        count = self._fallback_reasons.get(reason, 0)
        if count == 0:
            log.log(level, "fastkernel: %s %s: %s", self._kernel_name, what, reason)
        self._fallback_reasons[reason] = count + 1

    def named_arguments(self, args: tuple, kwargs: dict, provided=()) -> dict[str, Any]:
        """The call bound to parameter names, with defaults (Triton's ``nargs``), except for
        the parameters in ``provided`` (set by a tuned config or a heuristic, not by the call).
        Raises TypeError for too many positional arguments or one given twice."""
        params = self.jit_function.params
        name = self.jit_function.__name__
        if len(args) > len(params):
            raise TypeError(f"{name} takes {len(params)} arguments but {len(args)} were given")
        named = {p.name: a for p, a in zip(params, args)}
        for key, value in kwargs.items():
            if key in named:
                raise TypeError(f"{name} got multiple values for argument '{key}'")
            named[key] = value
        for p in params:
            if p.name not in named and p.has_default and p.name not in provided:
                named[p.name] = p.default
        return named

    def _handle_launcher(self, compiled: Any) -> CompiledLaunch | str:
        """``compiled``'s launcher: the one remembered for it, else a new one (remembered), or
        why its launches take Triton's runner."""
        found = _C.handle_launcher(compiled)
        launcher = found if isinstance(found, CompiledLaunch) else CompiledLaunch.of(compiled, self)
        if launcher is not found and not isinstance(launcher, str):
            _C.remember_handle_launch(compiled, launcher)
        return launcher

    def _run_through_triton(self, run: Callable[[], Any], counted: bool) -> Any:
        """``run()``: a call going through Triton's own path. Returns its result (True for None:
        what the native entry takes as handled). ``counted``: the call was already counted as a
        fallback (natively, or in ``_miss_fallbacks``); a call Triton rejects raises Triton's own
        error and is not a fallback, so its count is taken back."""
        try:
            with tritons_own_launches():
                result = run()
        except BaseException:
            if counted:
                self._miss_fallbacks -= 1
            raise
        return result if result is not None else True

    def _fallback(self, grid, args, kwargs, reason: str):
        """Launch a call through Triton's own launcher; the call was already counted as a
        fallback (natively, or in ``_miss_fallbacks``)."""
        result = self._run_through_triton(
            lambda: triton_launch(self.jit_function, grid, args, kwargs), counted=True
        )
        self._count_fallback(reason)
        return result

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        """Called by the native entry on a miss (``key`` set) or a fallback (``key`` None).

        Returns the loaded launch record for ``key`` (the native entry inserts and launches
        it); otherwise the result of launching through Triton itself.
        """
        if key is None:  # counted as a fallback by the native entry
            return self._fallback(grid, args, kwargs, reason or "unsupported call")
        return self._register_miss(grid, args, kwargs, key, device)

    def _bound_kinds(self, args, kwargs) -> dict[int, str]:
        kinds = {}
        names = [p.name for p in self.jit_function.params]
        for i, v in enumerate(args):
            kinds[i] = _kind_of(v)
        for name, v in kwargs.items():
            if name in names:
                kinds[names.index(name)] = _kind_of(v)
        return kinds

    def _remember_kinds(self, args, kwargs) -> None:
        for i, kind in self._bound_kinds(args, kwargs).items():
            self._arg_kinds.setdefault(i, set()).add(kind)

    def _raise_kind_mismatch(self, args, kwargs, exc: Exception) -> None:
        """After a failed compile, name a parameter that was a tensor in earlier calls and is
        now a value of another kind, or the reverse. None is left out: an optional pointer
        passed None is Triton's usage, and the compile error itself is then the one to see."""
        for i, kind in self._bound_kinds(args, kwargs).items():
            seen = self._arg_kinds.get(i)
            if (
                seen
                and kind not in seen
                and kind != _KIND_NAMES[type(None)]
                and ("tensor" in seen) != (kind == "tensor")
            ):
                name = self.jit_function.params[i].name
                raise TypeError(
                    f"{self.jit_function.__name__}: argument '{name}' is {kind!s} but earlier "
                    f"calls passed {'/'.join(sorted(seen))}; Triton could not compile "
                    f"this specialization"
                ) from exc


class FastKernel(NativeDispatch, JITFunction):
    """A Triton kernel launched through fastkernel's native dispatch path.

    Use it exactly like the ``triton.jit`` function it wraps: ``kernel[grid](*args, **kwargs)``
    with ``grid`` a tuple of 1-3 ints or a callable taking the dict of bound arguments, and
    Triton's compile options (``num_warps``, ``num_stages``, ...) as keywords.

    It is also a ``triton.runtime.jit.JITFunction`` (sharing the wrapped function's state), so
    everything that accepts a Triton kernel accepts it: ``@triton.autotune`` and
    ``@triton.heuristics`` stacked above ``@fastkernel`` (their launches stay native),
    ``torch.compile`` (which captures it as a user-defined Triton kernel and launches it its
    own way), ``torch.library.wrap_triton``, and passing it as a constexpr to another kernel.

    Raises (per call)
    ------
    TypeError
        Wrong argument count, an unknown keyword, a value of the wrong kind for its parameter.
    OverflowError
        An int that does not fit its parameter's width (or 64 bits).
    ValueError
        A CPU tensor for a GPU launch, or a malformed grid.
    fastkernel.DriverUnavailableError
        No CUDA driver (raised at the first launch, never at import).
    RuntimeError
        The installed torch has no CUDA support (a CPU-only build; a call with a tensor
        argument gets the ValueError above first).
    fastkernel.CudaError
        A failed driver call; the message names the CUDA error and the kernel.
    """

    def __init__(self, jit_fn: JITFunction):
        if not isinstance(jit_fn, JITFunction) or isinstance(jit_fn, FastKernel):
            raise TypeError(
                f"fastkernel expects a triton.jit function, got {type(jit_fn).__name__}"
            )
        # Share the wrapped JITFunction's state (source, parameters, Triton's own caches): this
        # object is the same kernel, seen through a native launch path.
        self.__dict__.update((k, v) for k, v in jit_fn.__dict__.items() if k != PATCH_ATTR)
        self._init_native(jit_fn, _params_spec(jit_fn), self.pre_run_hooks)

    # -- Triton-compatible surface ------------------------------------------------------------

    def run(self, *args, grid, warmup: bool = False, **kwargs):
        """``JITFunction.run``: ``run(*args, grid=g, **kw)`` launches as ``self[g](*args, **kw)``
        (this is how ``triton.autotune`` and ``triton.heuristics`` call the kernel they wrap);
        ``warmup=True`` compiles through Triton without launching and returns a
        :class:`WarmupHandle` over Triton's ``CompiledKernel`` (``None`` when Triton returns
        none)."""
        if warmup:
            compiled = TRITON_RUN(self.jit_function, *args, grid=grid, warmup=True, **kwargs)
            return None if compiled is None else WarmupHandle(compiled, self)
        return self[grid](*args, **kwargs)

    @property
    def debug(self):
        """The wrapped ``triton.jit`` function's ``debug`` (one kernel, one option): setting it
        here sets it there, and the next call compiles (or loads) the binary of the new value,
        as with Triton."""
        return self.jit_function.debug

    @debug.setter
    def debug(self, value) -> None:
        self.jit_function.debug = value

    def __repr__(self) -> str:
        return f"FastKernel({self.module}:{self.fn.__qualname__})"


class CompiledLaunch(NativeDispatch):
    """The native launch of one ``CompiledKernel``'s binary: what ``compiled[grid](*args)``
    does (``CompiledKernel.__getitem__``'s runner, triton/compiler/compiler.py), as Triton's
    launcher does it. Triton's runner passes its arguments, constexprs included, to the
    launcher made for the binary's signature, which packs the non-constexpr ones by that
    signature whatever the arguments' own specialization, on the current device's current
    stream, and returns None; so does this launch: the arguments are bound and keyed as for the
    kernel itself (by position; every parameter required, except, from Triton 3.7, those after
    the last one the binary's signature reads, constexprs and ints of 1 or None specialized
    away, as its launcher takes calls that stop before them:
    :func:`fastkernel._handle_args.omissible_from`), and every key launches the one binary,
    loaded per device.
    No pre-run hook runs and no global is checked, as Triton's runner runs and checks none.

    A call given keywords (``stream=``, which Triton's runner takes, or parameters by name,
    which it rejects) goes to Triton's runner, counted as a fallback for
    :data:`COMPILED_KEYWORDS_REASON`; so does a call whose arguments the native key does not
    cover. Its counters are the kernel's name with `` [compiled handle]`` in :func:`stats`.

    One launcher serves a handle, whichever dispatch of its kernel made it, while the handle
    lives (remembered natively: csrc/python/handle_launch.cpp) or until
    :func:`fastkernel.unpatch`.
    """

    _stats_suffix = " [compiled handle]"

    @classmethod
    def of(cls, compiled: Any, kernel: NativeDispatch) -> CompiledLaunch | str:
        """``compiled``'s launcher, or why its launches take Triton's runner (a kernel with a
        parameter named ``stream``, which Triton's runner takes as its keyword)."""
        if any(p.name == "stream" for p in kernel.jit_function.params):
            return "a kernel with a parameter named 'stream', Triton's runner's own keyword"
        return cls(compiled, kernel)

    @property
    def jit_function(self) -> JITFunction | None:
        """The kernel's ``triton.jit`` function, or None once it is gone. Held weakly: the
        launcher is remembered natively (a root) while its handle lives, and the handle lives
        in the function's own cache, so a strong reference would keep the function, its
        handles and their modules alive for the life of the process."""
        return self._jit_function()

    @jit_function.setter
    def jit_function(self, jit_fn: JITFunction) -> None:
        self._jit_function = weakref.ref(jit_fn)

    def __init__(self, compiled: Any, kernel: NativeDispatch):
        self._serves_patch = kernel._serves_patch
        self._handle = weakref.ref(compiled)
        self._refusals: dict[int, str] = {}  # why the binary does not load, by device
        jit_fn = kernel.jit_function
        params = _params_spec(jit_fn)
        self._signature = HandleSignature.of(compiled, jit_fn)
        # A launch may leave out what Triton's launcher takes a call without (from 3.7): a
        # left-out parameter is keyed as None, as the binary's launch plan never reads it.
        required = self._signature.required
        spec = [(n, c, s, a, 0, i >= required, None) for i, (n, c, s, a, *_) in enumerate(params)]
        self._init_native(jit_fn, spec, None, options=["stream"])

    def _through_triton(
        self, grid, args: tuple, kwargs: dict, reason: str, checked: bool = False
    ) -> None:
        """Triton's runner for the handle's binary; the call was counted as a fallback. Returns
        None, as the runner does. ``checked``: whether ``args`` passed
        :meth:`HandleSignature.check <fastkernel._handle_args.HandleSignature.check>` already.

        Raises
        ------
        TypeError
            From that check, naming the parameter, as the native launch raises it, and not
            counted as a fallback: for arguments Triton's launcher would read past or abort on.
            (FlagGems' ``LibEntry`` makes calls that stop early from Triton 3.7 for kernels
            with constexprs between runtime parameters: it passes the runtime arguments
            only.)"""

        def run() -> None:
            if not checked and kwargs.keys() <= {"stream"}:  # else the runner raises first
                self._signature.check(args)
            compiled = self._handle()
            if compiled is None:
                raise ReferenceError("the CompiledKernel of this launch no longer exists")
            COMPILED_GETITEM(compiled, grid)(*args, **kwargs)

        self._run_through_triton(run, counted=True)
        self._count_fallback(reason, logging.INFO)

    def _count_run_fallback(self, reason: str) -> None:
        """Counts a call of the handle's ``run`` (under the patch) that Triton's own launcher
        object took, for ``reason``."""
        self._miss_fallbacks += 1
        self._count_fallback(f"{COMPILED_RUN_REASON}: {reason}", logging.INFO)

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        """A new key: the binary's record on ``device`` (the native entry inserts and launches
        it), or the result of Triton's runner."""
        checked = False
        if key is not None:  # else counted as a fallback by the native entry
            if kwargs:
                reason = COMPILED_KEYWORDS_REASON
            else:
                # Raises for what Triton's launcher would read past; a shape the native plan
                # would take otherwise than Triton's launcher goes to Triton's runner.
                reason, checked = self._signature.check(args), True
            if reason is None:
                # One record per key, as the table owns each (a module of its own); a binary
                # the device refused once is not loaded again.
                record = self._refusals.get(device) or self._load_binary(device)
                if not isinstance(record, str):
                    return record
                reason = self._refusals[device] = record
            self._miss_fallbacks += 1
        return self._through_triton(grid, args, kwargs, reason or "unsupported call", checked)

    def _load_binary(self, device: int) -> _C.LaunchRecord | str:
        """The handle's binary loaded on ``device`` as a launch record with the launch plan of
        its signature (``compiled.src.signature``), else why not."""
        compiled = self._handle()
        if compiled is None:
            return "the CompiledKernel of this launch no longer exists"
        try:
            meta = abi.launch_metadata(compiled)
            plan, tensor_maps = abi.expand_descriptors(
                abi.launch_plan(compiled.src.signature), meta.tensordesc_meta
            )
            facts = _registration_facts(meta, device, plan, tensor_maps)
            return _C.LaunchRecord(facts, meta.cubin, None, None, None, global_checks=None)
        except abi.UnsupportedByNativePath as exc:
            return str(exc)
        except _C.DriverUnavailableError:
            raise
        except (_C.CudaError, ValueError) as exc:
            return f"loading the binary failed: {exc}"


#: The CUresult the native loader gives a sound binary the device lacks the resources to run
#: (more shared memory than it allows, a larger block than the function allows), as the driver
#: answers such a launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, cuda.h).
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701


class _ResourceRefusal(str):
    """Why the native path cannot load a binary that is sound but needs more than the device
    offers: Triton raises OutOfResources for it (CompiledKernel._init_handles), and a disk cache
    entry holding it is not corrupt."""


def _registration_facts(meta: abi.LaunchMetadata, device: int, plan, tensor_maps) -> Any:
    """The ``_C.LaunchFacts`` of ``meta``'s binary registered on ``device`` with the launch
    ``plan`` and tensor maps :func:`abi.expand_descriptors` gave."""
    return abi.launch_facts(
        meta,
        device=device,
        plan=plan,
        num_scratch_params=abi.num_scratch_params(),
        tensor_maps=[_C.TensorMapFacts(*t) for t in tensor_maps],
    )


def _set_function_attributes(compiled: Any, record: _C.LaunchRecord) -> None:
    """Give what a native launch returns the attributes Triton's loader gives a
    ``CompiledKernel`` (``n_regs``, ``n_spills``, ``n_max_threads``: set by
    ``CompiledKernel._init_handles``, triton/compiler/compiler.py), as the driver reported them
    when ``record`` loaded the same cubin. A ``CompiledKernel`` Triton has loaded has them
    already and is left as it is; one it never loaded would have none."""
    if isinstance(compiled, _cache.CachedKernel):
        compiled._set_function_attributes(record.n_regs, record.n_spills, record.n_max_threads)
    elif isinstance(compiled, CompiledKernel) and getattr(compiled, "module", None) is None:
        compiled.n_regs = record.n_regs
        compiled.n_spills = record.n_spills
        compiled.n_max_threads = record.n_max_threads


class WarmupHandle:
    """What ``kernel.warmup(...)`` returns for a ``@fastkernel`` kernel: Triton's
    ``CompiledKernel`` for that call, seen through a wrapper that counts its launches.

    ``handle[grid](*args)`` (Triton's fused-softmax tutorial launches so, passing every argument,
    constexprs included) launches the binary the handle holds, natively
    (:class:`CompiledLaunch`) where it can and through Triton's own launcher, counted as a
    fallback, where it cannot. Every other attribute (``metadata``, ``asm``, ``n_regs``,
    ``n_spills``, ...) is the ``CompiledKernel``'s; :attr:`compiled` is the ``CompiledKernel``
    itself.
    """

    __slots__ = ("compiled", "_kernel")

    def __init__(self, compiled: Any, kernel: NativeDispatch):
        self.compiled = compiled
        self._kernel = kernel

    def _launch(self, grid):
        """``handle[grid]`` past the native subscript (a first launch, a grid of other than
        three dims, a launch hook set): :meth:`NativeDispatch._handle_launch`."""
        return self._kernel._handle_launch(self.compiled, grid)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)

    def __repr__(self) -> str:
        return f"WarmupHandle({self.compiled!r})"


# ``handle[grid]`` is native: the launcher of ``handle.compiled`` remembered on its first
# launch, else WarmupHandle._launch (csrc/python/handle_launch.cpp).
_C.install_handle_subscript(WarmupHandle, "compiled", WarmupHandle._launch)


class _InterpretedKernel:
    """What ``@fastkernel`` returns under ``TRITON_INTERPRET=1``: Triton's interpreter runs the
    kernel on CPU tensors, with no native launch (there is no GPU to launch on)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid):
        return self.fn[grid]

    def run(self, *args, **kwargs):
        return self.fn.run(*args, **kwargs)

    def stats(self) -> dict[str, Any]:
        return {
            "hits": 0,
            "misses": 0,
            "fallbacks": 0,
            "specializations": 0,
            "evictions": 0,
            "table_bytes": 0,
            "fallback_reasons": {"TRITON_INTERPRET=1": 1},
        }


def _is_interpreted(fn: object) -> bool:
    """Whether ``fn`` is Triton's ``InterpretedFunction``, what ``triton.jit`` makes under
    ``TRITON_INTERPRET=1``. Triton imports ``triton.runtime.interpreter`` when it makes one; until
    then none exists, so the module is looked up rather than imported (importing it costs about a
    third of ``import fastkernel``)."""
    interpreter = sys.modules.get("triton.runtime.interpreter")
    return interpreter is not None and isinstance(fn, interpreter.InterpretedFunction)


def fastkernel(fn: Callable | None = None, **jit_kwargs):
    """Decorate a Triton kernel so that ``kernel[grid](...)`` launches through native code.

    Parameters
    ----------
    fn : triton.jit function or plain Python function
        A ``@triton.jit`` function, or a plain function (``triton.jit`` is applied, with
        ``jit_kwargs`` such as ``do_not_specialize``).
    **jit_kwargs
        Passed to ``triton.jit`` when ``fn`` is a plain function.

    Returns
    -------
    FastKernel
        Or Triton's own ``JITFunction`` when ``FASTKERNEL_DISABLE=1``; under
        ``TRITON_INTERPRET=1`` a thin wrapper whose ``kernel[grid](...)`` runs in Triton's
        interpreter (``fn`` is Triton's kernel; ``fastkernel.autotune`` and
        ``fastkernel.heuristics`` go above it and give Triton's own tuners).

    Raises
    ------
    TypeError
        ``fn`` is not a function, a ``triton.jit`` function or a ``FastKernel``; it is a
        ``triton.autotune`` / ``triton.heuristics`` wrapper (``@fastkernel`` goes below them);
        ``jit_kwargs`` are given with anything but a plain function.

    Examples
    --------
    >>> @fastkernel
    ... @triton.jit
    ... def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr): ...
    >>> add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    """
    if fn is None:
        return lambda f: fastkernel(f, **jit_kwargs)
    if isinstance(fn, FastKernel):
        if jit_kwargs:  # its JITFunction is made: the options would be dropped
            raise TypeError("jit options can only be given with a plain function")
        return fn
    interpreted = _is_interpreted(fn)
    if isinstance(fn, KernelInterface) and not (isinstance(fn, JITFunction) or interpreted):
        # triton.autotune / triton.heuristics wrappers: they call fn.run, which is where the
        # native path must sit, so it goes under them.
        raise TypeError(
            f"fastkernel wraps a triton.jit function, got a {type(fn).__name__}: put @fastkernel "
            f"directly above @triton.jit, below @triton.autotune / @triton.heuristics, e.g.\n"
            f"    @triton.autotune(configs=..., key=...)\n    @fastkernel\n    @triton.jit\n"
            f"    def kernel(...): ..."
        )
    if not isinstance(fn, JITFunction):
        if jit_kwargs and interpreted:
            raise TypeError("jit options can only be given with a plain function")
        if not interpreted:
            if not inspect.isfunction(fn):
                raise TypeError(f"fastkernel decorates functions, got {type(fn).__name__}")
            fn = triton.jit(fn, **jit_kwargs)
    elif jit_kwargs:
        raise TypeError("jit options can only be given with a plain function")
    if _env.flag("FASTKERNEL_DISABLE"):
        return fn
    if not isinstance(fn, JITFunction):  # TRITON_INTERPRET=1 made it an InterpretedFunction
        return _InterpretedKernel(fn)
    return FastKernel(fn)
