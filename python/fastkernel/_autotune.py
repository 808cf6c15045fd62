"""``fastkernel.autotune``: Triton's autotuning, with the tuned call served natively.

The autotune key (the values of the named scalar arguments, every tensor's dtype and stride
pattern, the sizes of the named tensors) is built by the native key builder along with the
specialization, so once a key is tuned a call is one native hit: no Python runs. On a miss the
native entry calls :meth:`Autotuned._on_miss`, which picks the config for the call's key (from
memory, from the on-disk tuning record, or by benchmarking every config), compiles the kernel
with it and returns its launch record, which the native entry inserts under the call's key.

The meaning of each argument is Triton's (``triton.runtime.autotuner.Autotuner``); the
differences, all towards correctness, are listed in :func:`autotune`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import inspect
import json
import logging
import math
import os
import pathlib
import pickle
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import triton
from triton.runtime.autotuner import Autotuner, Config
from triton.runtime.autotuner import Heuristics as TritonHeuristics
from triton.runtime.jit import JITFunction, KernelInterface

from . import _C, _arguments, _env, _heuristic_code, _locks
from . import _triton_abi as abi
from . import cache as _cache
from .cache import files as _cache_files
from .cache.entry import canonical
from .cache.key import cache_env, check_target, render, target_dict, toolchain_dir
from .cache.settings import log_once, usable_root, warn_untrusted
from .cache.store import cross_process_lock
from .kernel import FastKernel, NativeDispatch, _params_spec

if TYPE_CHECKING:
    import torch

log = logging.getLogger("fastkernel")

# TuneFlag bits (csrc/include/fastkernel/specialization.h), as the native module exports them.
TUNE_CONFIG_PROVIDED: int = _C.TUNE_FLAGS["config_provided"]
TUNE_VALUE: int = _C.TUNE_FLAGS["value"]
TUNE_LAYOUT: int = _C.TUNE_FLAGS["layout"]
TUNE_SIZES: int = _C.TUNE_FLAGS["sizes"]
TUNE_STRIDES: int = _C.TUNE_FLAGS["strides"]
TUNE_MAY_BE_PROVIDED: int = _C.TUNE_FLAGS["may_be_provided"]

_thread_tuning = threading.local()


def _keys_tuning_in_this_thread() -> set:
    """The (autotuner id, tuning key) pairs this thread is tuning now."""
    keys = getattr(_thread_tuning, "keys", None)
    if keys is None:
        keys = _thread_tuning.keys = set()
    return keys


@contextlib.contextmanager
def _tuning(keys: set, mark: tuple):
    keys.add(mark)
    try:
        yield
    finally:
        keys.discard(mark)


#: Bumped when the tuning record's layout or key document changes.
TUNING_FORMAT_VERSION = 1

_QUANTILES = (0.5, 0.2, 0.8)


def stride_class(stride: int) -> int:
    """The autotune class of a stride: 0, 1, or 2 for anything else (matches the native key)."""
    return 0 if stride == 0 else 1 if stride == 1 else 2


def _is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    import torch

    return isinstance(value, torch.Tensor)


def _compile_workers(jobs: int) -> int:
    """Worker processes for compiling ``jobs`` configs (FASTKERNEL_COMPILE_WORKERS; 0 or 1 =
    compile in this process; default: one per CPU, at most one per job)."""
    return min(_env.count("FASTKERNEL_COMPILE_WORKERS", os.cpu_count() or 1), jobs)


def _progress(items: Sequence[Any], desc: str) -> Iterable[Any]:
    """``items`` with a progress bar on an interactive stderr (tqdm), else as they are."""
    if not sys.stderr.isatty():
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # installed with --no-deps: no bar, the log lines remain
        return items
    return tqdm(items, desc=desc, unit="config", leave=False)


def _config_doc(config: Config) -> dict[str, Any]:
    return {
        "kwargs": sorted([k, render(v)] for k, v in config.all_kwargs().items()),
        "pre_hook": config.pre_hook is not None,
    }


def _describe(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.all_kwargs().items())


class _PreHookHit:
    """A call of a key whose tuned config has a ``pre_hook`` (a hit calls it as
    ``hit_call(grid, *args, **kwargs)``): the config becomes ``best_config``, the hook gets the call's arguments by name (with
    defaults; Triton's ``nargs``) and the config's values and options, as on every launch of
    Triton's autotuner (``runtime/autotuner.py``, ``Autotuner.run``); then the kernel
    underneath launches with the config's values and options among the keywords, natively,
    keying the arguments as the hook left them (a heuristics underneath computes its values
    from them)."""

    __slots__ = ("autotuner", "config")

    def __init__(self, autotuner: Any, config: Config):
        self.autotuner = autotuner
        self.config = config

    def __call__(self, grid, *args, **kwargs):
        autotuner = self.autotuner
        autotuner.best_config = self.config
        tuned = self.config.all_kwargs()
        named = autotuner.named_arguments(args, kwargs, provided=autotuner._config_params)
        if self.config.pre_hook is not None:  # checked per call, as Triton's run checks it
            self.config.pre_hook({**named, **tuned})
        return autotuner.fn[grid](*args, **{**kwargs, **tuned})


class AutotuneError(RuntimeError):
    """No config of an autotuned kernel could run for a key: every one failed to compile or
    run, or ``early_config_prune`` returned none."""


# -- decoration arguments -------------------------------------------------------------------
# Checked when the decorator is made, kinds first (in parameter order), then values, so that a
# mistake is named at the decorator rather than at the first tuning, where the benchmark loop
# would report it as every config failing.

_PRUNE_KEYS = ("perf_model", "top_k", "early_config_prune")


def _check_names_kind(who: str, name: str, value: Any, optional: bool) -> None:
    """``value`` is a list or tuple of argument names (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, str):
        raise TypeError(
            f"{who}: argument '{name}' must be a list of argument names, got the string {value!r}"
        )
    if not isinstance(value, (list, tuple)):
        raise _arguments.kind_error(who, name, "a list of argument names", value)
    for item in value:
        if not isinstance(item, str):
            raise TypeError(
                f"{who}: argument '{name}' must hold argument names (str), not "
                f"{type(item).__name__} ({item!r})"
            )


def _check_callable_kind(who: str, name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise _arguments.kind_error(who, name, "callable or None", value)


def _check_autotune_arguments(
    configs, key, prune_configs_by, reset_to_zero, restore_value, pre_hook, post_hook, warmup,
    rep, do_bench, cache_results,
) -> None:  # fmt: skip
    """TypeError for an argument of :func:`autotune` of the wrong kind, then ValueError for one
    of the right kind and a wrong value; each names the argument."""
    who = "fastkernel.autotune"
    if configs is not None and not isinstance(configs, (list, tuple)):
        raise _arguments.kind_error(who, "configs", "a list of triton.Config", configs)
    _check_names_kind(who, "key", key, optional=False)
    if prune_configs_by is not None:
        if not isinstance(prune_configs_by, dict):
            raise _arguments.kind_error(who, "prune_configs_by", "a dict or None", prune_configs_by)
        for name in ("perf_model", "early_config_prune"):
            _check_callable_kind(who, f"prune_configs_by['{name}']", prune_configs_by.get(name))
        top_k = prune_configs_by.get("top_k")
        if top_k is not None and not _arguments.is_number(top_k):
            raise _arguments.kind_error(
                who, "prune_configs_by['top_k']", "an int or a float", top_k
            )
    _check_names_kind(who, "reset_to_zero", reset_to_zero, optional=True)
    _check_names_kind(who, "restore_value", restore_value, optional=True)
    _check_callable_kind(who, "pre_hook", pre_hook)
    _check_callable_kind(who, "post_hook", post_hook)
    for name, value in (("warmup", warmup), ("rep", rep)):
        if not _arguments.is_number(value):
            raise _arguments.kind_error(who, name, "a number of milliseconds", value)
    _check_callable_kind(who, "do_bench", do_bench)
    if not isinstance(cache_results, bool):
        raise _arguments.kind_error(who, "cache_results", "a bool", cache_results)
    if prune_configs_by is not None:
        unknown = [k for k in prune_configs_by if k not in _PRUNE_KEYS]
        if unknown:
            raise ValueError(
                f"{who}: argument 'prune_configs_by' has {', '.join(map(repr, unknown))}; it "
                f"takes {', '.join(map(repr, _PRUNE_KEYS))}"
            )
        # Triton's own rule (triton/runtime/autotuner.py, prune_configs): a fraction of the
        # configs as a float <= 1.0, else a count as an int.
        top_k = prune_configs_by.get("top_k")
        if isinstance(top_k, float) and top_k > 1.0:
            raise ValueError(
                f"{who}: argument prune_configs_by['top_k'] must be an int or a float <= 1.0 "
                f"(a fraction of the configs), not {top_k!r}"
            )
    for name, value in (("warmup", warmup), ("rep", rep)):
        if _arguments.finite_nonnegative(value) is None:
            raise ValueError(f"{who}: argument '{name}' must be finite and >= 0 ms, not {value!r}")


def _check_heuristics_arguments(values: Any, key: Any) -> None:
    """TypeError for an argument of :func:`heuristics` of the wrong kind, naming it."""
    who = "fastkernel.heuristics"
    if not isinstance(values, dict):
        raise _arguments.kind_error(who, "values", "a dict of parameter name to function", values)
    for name, fn in values.items():
        if not isinstance(name, str):
            raise TypeError(
                f"{who}: argument 'values' must map parameter names (str), not "
                f"{type(name).__name__} ({name!r})"
            )
        if not callable(fn):
            raise TypeError(
                f"{who}: argument 'values': the heuristic for {name!r} must be callable, not "
                f"{type(fn).__name__}"
            )
    _check_names_kind(who, "key", key, optional=True)


class Autotuned(NativeDispatch, Autotuner):
    """A ``@fastkernel`` kernel under ``@fastkernel.autotune``; see :func:`autotune`.

    It is also a ``triton.runtime.autotuner.Autotuner`` (built by Triton's own constructor, with
    ``fn`` the FastKernel), so torch.compile captures it as a user-defined autotuned Triton
    kernel, and Triton's attributes (``configs``, ``keys``, ``cache``, ``best_config``,
    ``configs_timings``, ``bench_time``) mean what they mean there.
    """

    def __init__(
        self,
        kernel: FastKernel,
        configs: Sequence[Config],
        key: Sequence[str],
        prune_configs_by: dict[str, Any] | None = None,
        reset_to_zero: Sequence[str] | None = None,
        restore_value: Sequence[str] | None = None,
        pre_hook: Callable | None = None,
        post_hook: Callable | None = None,
        warmup: float = 25,
        rep: float = 100,
        do_bench: Callable | None = None,
        cache_results: bool = True,
    ):
        jit_fn = kernel.jit_function
        arg_names = [p.name for p in jit_fn.params]
        # Under it, a keyed fastkernel.heuristics: its values join each tuned config's.
        self._heuristics: Heuristics | None = kernel if isinstance(kernel, Heuristics) else None
        configs = list(configs) if configs else [Config({}, num_warps=4, num_stages=3)]
        for c in configs:
            if not isinstance(c, Config):
                raise TypeError(
                    f"fastkernel.autotune: configs must be triton.Config objects, got "
                    f"{type(c).__name__}"
                )
        for what, names in (
            ("key", key),
            ("reset_to_zero", reset_to_zero or ()),
            ("restore_value", restore_value or ()),
        ):
            if isinstance(names, str):
                raise TypeError(
                    f"fastkernel.autotune: {what} must be a list of argument names, "
                    f"got the string {names!r}"
                )
            unknown = [n for n in names if n not in arg_names]
            if unknown:
                raise ValueError(
                    f"fastkernel.autotune: {what} names {', '.join(map(repr, unknown))}, "
                    f"which {'is' if len(unknown) == 1 else 'are'} not arguments of "
                    f"{jit_fn.__name__} ({', '.join(arg_names)})"
                )
        by_name = {p.name: p for p in jit_fn.params}
        option_names = set(abi.option_names(abi.cuda_target(9, 0)))
        self._config_params: list[str] = []
        for c in configs:
            for name in c.kwargs:
                if name not in by_name:
                    if name in option_names:
                        continue
                    raise ValueError(
                        f"fastkernel.autotune: a config sets {name!r}, which is not an "
                        f"argument of {jit_fn.__name__} ({', '.join(arg_names)})"
                    )
                if not by_name[name].is_constexpr:
                    raise TypeError(
                        f"fastkernel.autotune: a config sets {name!r}, which is not a tl.constexpr "
                        f"parameter of {jit_fn.__name__}; tuned values are compiled in, so "
                        f"annotate it '{name}: tl.constexpr'"
                    )
                if name not in self._config_params:
                    self._config_params.append(name)
        if self._heuristics is not None:
            for name in self._heuristics.values:
                if name in self._config_params:
                    raise ValueError(
                        f"fastkernel.autotune: {name!r} is set both by configs and "
                        f"by fastkernel.heuristics"
                    )
            self._config_params.extend(self._heuristics.values)
        # Triton's constructor: validation, hooks, prune settings, and every attribute that
        # torch.compile reads. Its own disk cache and deprecated warmup/rep are not used.
        init_kwargs = dict(
            fn=kernel,
            arg_names=arg_names,
            configs=configs,
            key=list(key),
            reset_to_zero=reset_to_zero,
            restore_value=restore_value,
            pre_hook=pre_hook,
            post_hook=post_hook,
            prune_configs_by=prune_configs_by,
            cache_results=False,
        )
        accepted = Autotuner.__init__.__code__.co_varnames
        Autotuner.__init__(self, **{k: v for k, v in init_kwargs.items() if k in accepted})
        self.__name__ = jit_fn.__name__
        self.warmup_ms = warmup
        self.rep_ms = rep
        self._timer = do_bench
        self.cache_results = cache_results
        self.best_config: Config | None = None
        self.configs_timings: dict[Config, Any] | None = None
        self.bench_time: float | None = None
        self._user_pre_hook = pre_hook
        self._user_post_hook = post_hook
        # One tuning per key at a time; other keys tune meanwhile (a launch hook of one tuning
        # may wait for another thread tuning another key).
        self._tune_lock = _locks.lock()  # guards _key_locks
        self._key_locks: dict[Any, threading.Lock] = {}
        # Everything a config can set, for Triton's conflict error.
        self._config_names = set()
        for c in configs:
            self._config_names.update(c.all_kwargs())
        heuristic_keys = self._heuristics.keys if self._heuristics is not None else []
        tune = {}
        for p in jit_fn.params:
            flags = TUNE_LAYOUT
            if p.name in self._config_params:
                flags |= TUNE_CONFIG_PROVIDED
            if p.name in self.keys or p.name in heuristic_keys:
                flags |= TUNE_VALUE | TUNE_SIZES
            tune[p.name] = flags
        self._init_native(jit_fn, _params_spec(jit_fn, tune), jit_fn.pre_run_hooks)
        # Triton's Autotuner.run sets best_config on every call, hits included.
        self._set_publish(self, "best_config")

    # -- Triton-compatible surface ------------------------------------------------------------

    def run(self, *args, grid, warmup: bool = False, **kwargs):
        """``Autotuner.run``: ``run(*args, grid=g, **kw)`` launches as ``self[g](*args, **kw)``
        (how ``triton.heuristics`` stacked above calls it) and returns what that returns.
        Raises NotImplementedError for ``warmup=True`` (a first call tunes and compiles), and
        what the launch raises."""
        if warmup:
            raise NotImplementedError(
                "fastkernel.autotune: warmup=True is not supported; call "
                "the kernel once to tune and compile it"
            )
        return self[grid](*args, **kwargs)

    def __repr__(self) -> str:
        return f"Autotuned({self.fn!r}, {len(self.configs)} configs, key={self.keys})"

    # -- the tuning key -----------------------------------------------------------------------

    def tuning_key(self, named: dict[str, Any]) -> tuple[Any, ...]:
        """The autotune key of a bound call: each named argument's value (a tensor's sizes), then
        every tensor's dtype and stride classes (0, 1, other). Equal native keys give equal
        tuning keys (the native key holds every part). TypeError naming ``named`` when it is
        not a mapping."""
        _arguments.instance("tuning_key", "named", named, Mapping, "a mapping")
        parts: list[Any] = []
        for name in self.keys:
            value = named.get(name)
            parts.append(tuple(value.shape) if _is_tensor(value) else value)
        for p in self.jit_function.params:
            value = named.get(p.name)
            if _is_tensor(value):
                parts.append((str(value.dtype), tuple(stride_class(s) for s in value.stride())))
        return tuple(parts)

    # -- the miss path ------------------------------------------------------------------------

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        conflicts = [k for k in kwargs if k in self._config_names]
        if conflicts:
            # Triton's error (runtime/autotuner.py, Autotuner.run).
            raise ValueError(
                f"Conflicting meta-parameters: {', '.join(conflicts)}. Make sure "
                f"that you don't re-define auto-tuned symbols."
            )
        if self._heuristics is not None:
            self._heuristics.check_conflicts(kwargs)
        named = self.named_arguments(args, kwargs, provided=self._config_params)
        config = self._config_for(named, grid, args, kwargs, device)
        self.best_config = config
        merged = {**kwargs, **config.all_kwargs()}
        if self._heuristics is not None:
            merged.update(self._heuristics.values_for({**named, **config.all_kwargs()}))
        if config.pre_hook is not None:
            if key is not None:
                return self._pre_hook_miss(grid, args, kwargs, key, config)
            # Triton runs a config's pre_hook before every launch.
            config.pre_hook({**named, **config.all_kwargs()})
        if key is None:
            return self._fallback(grid, args, merged, reason or "unsupported call")
        tuned_args = self._tuned_args(merged, self._config_params)
        return self._register_miss(grid, args, merged, key, device, tuned_args, published=config)

    def _pre_hook_miss(self, grid, args, kwargs, key: bytes, config):
        """The miss of a key whose config has a ``pre_hook``, which Triton runs before every
        launch: the call is made as each hit of the key makes it (:class:`_PreHookHit`: the
        hook, then the launch through the kernel underneath, keyed as the hook left the
        arguments), then the key is registered with that hit."""
        hit = _PreHookHit(self, config)
        result = hit(grid, *args, **kwargs)
        self._insert(key, self._hit_call_record(args, kwargs, hit))
        return result if result is not None else True

    def _config_for(self, named, grid, args, kwargs, device: int) -> Config:
        tuning_key = self.tuning_key(named)
        config = self.cache.get(tuning_key)
        if config is not None:
            return config
        tuning_now = _keys_tuning_in_this_thread()
        if (id(self), tuning_key) in tuning_now:
            raise RuntimeError(
                f"{self.__name__}: a launch made while tuning autotune key {tuning_key!r} (from a "
                f"prune, hook or timer) needs that key tuned: it cannot be tuned inside itself"
            )
        with self._tune_lock:
            key_lock = self._key_locks.get(tuning_key)
            if key_lock is None:
                key_lock = self._key_locks[tuning_key] = _locks.lock()
        mark = (id(self), tuning_key)
        if tuning_now and not key_lock.acquire(blocking=False):
            # This thread is tuning another key, and the thread tuning this one may be waiting
            # for that key (each one's timer launching the other's): waiting here could
            # deadlock, so the key is tuned here too, in memory only (the tuning record's file
            # lock is the other thread's).
            with _tuning(tuning_now, mark):
                return self._tune_once(tuning_key, named, grid, args, kwargs, device, False)
        if not tuning_now:
            key_lock.acquire()
        try:
            with _tuning(tuning_now, mark):
                return self._tune_once(tuning_key, named, grid, args, kwargs, device, True)
        finally:
            key_lock.release()

    def _tune_once(
        self, tuning_key, named, grid, args, kwargs, device: int, with_record: bool
    ) -> Config:
        """The config of ``tuning_key``, tuned unless another thread did meanwhile; called with
        the key's lock held, or, without ``with_record``, where that lock cannot be waited for
        (then the tuning record on disk is neither read nor written)."""
        config = self.cache.get(tuning_key)
        if config is not None:
            return config
        # Pruned first, as Triton prunes: a record holds a choice among the configs this
        # call's pruning leaves (its document lists them), and one left needs no record.
        configs = self.prune(named, kwargs)
        target = self._target(device)
        path = (
            self._record_path(tuning_key, target, configs)
            if with_record and len(configs) > 1
            else None
        )
        if path is None:
            config = self._tune(configs, named, grid, args, kwargs, device)
        else:
            # One process benchmarks a key at a time (timings taken side by side on one GPU
            # would disturb each other); the others wait and read its record. A lock that
            # cannot be taken (a read-only cache) is logged, not raised.
            lock_path = path.with_name(path.name + ".lock")
            with cross_process_lock(lambda: lock_path, f"tuning {self.__name__}"):
                config = self._read_record(path, configs)
                if config is None:
                    config = self._tune(configs, named, grid, args, kwargs, device)
                    self._write_record(path, tuning_key, configs, config)
        self.cache[tuning_key] = config
        return config

    # -- tuning -------------------------------------------------------------------------------

    def prune(self, named: dict[str, Any], kwargs: dict[str, Any]) -> list[Config]:
        """The configs to benchmark: ``early_config_prune(configs, named_args, **kwargs)``, then
        the ``top_k`` best by ``perf_model(**named_args, **kwargs, **config.all_kwargs())``
        (Triton's ``prune_configs_by``; ``top_k`` a count, or a fraction of the configs).
        TypeError naming ``named`` or ``kwargs`` when one is not a mapping."""
        _arguments.instance("prune", "named", named, Mapping, "a mapping")
        _arguments.instance("prune", "kwargs", kwargs, Mapping, "a mapping")
        configs = list(self.configs)
        # Triton passes the positional arguments by name (Autotuner.nargs) and the keywords apart.
        named = {k: v for k, v in named.items() if k not in kwargs}
        if self.early_config_prune is not None:
            configs = list(self.early_config_prune(configs, named, **kwargs))
            if not configs:
                raise AutotuneError(f"{self.__name__}: early_config_prune returned no configs")
        if self.perf_model is not None:
            top_k = self.configs_top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = int(len(configs) * top_k)
            elif not isinstance(top_k, int):
                raise TypeError("prune_configs_by['top_k'] must be an int or a float <= 1.0")
            if len(configs) > top_k > 0:
                estimates = {
                    c: self.perf_model(**named, **kwargs, **c.all_kwargs()) for c in configs
                }
                configs = sorted(configs, key=lambda c: estimates[c])[:top_k]
        return configs

    def _tune(self, configs: list[Config], named, grid, args, kwargs, device: int) -> Config:
        """The fastest of ``configs`` (this call's pruned configs) for this call."""
        import time

        if len(configs) == 1:
            return configs[0]
        start = time.perf_counter()
        self._precompile(configs, args, kwargs, device)
        snapshot = {
            name: named[name].clone() for name in self.restore_value if named.get(name) is not None
        }
        timings: dict[Config, Any] = {}
        failures: list[str] = []
        try:
            for config in _progress(configs, f"autotuning {self.__name__}"):
                try:
                    timings[config] = self._bench_config(
                        config, named, snapshot, grid, args, kwargs
                    )
                except Exception as exc:  # compile errors, out of resources, launch failures
                    message = f"{_describe(config)}: {type(exc).__name__}: {exc}"
                    log.info("fastkernel: %s: skipping config %s", self.__name__, message)
                    failures.append(message)
        finally:
            # The real launch after tuning sees what one clean run would: restored inputs and
            # zeroed accumulators.
            self._restore_and_reset(named, snapshot)
        if not timings:
            raise AutotuneError(
                f"{self.__name__}: every config failed for key "
                f"{self.tuning_key(named)}:\n  " + "\n  ".join(failures)
            )
        best = min(timings, key=lambda c: _median(timings[c]))
        self.configs_timings = timings
        self.bench_time = time.perf_counter() - start
        log.info(
            "fastkernel: %s tuned for key %s: %s (%.4f ms; %d configs in %.1f s)",
            self.__name__,
            self.tuning_key(named),
            _describe(best),
            _median(timings[best]),
            len(configs),
            self.bench_time,
        )
        return best

    def _restore_and_reset(self, named, snapshot) -> None:
        for name, saved in snapshot.items():
            named[name].copy_(saved)
        for name in self.reset_to_zero:
            if named.get(name) is not None:
                named[name].zero_()

    def _bench_config(self, config: Config, named, snapshot, grid, args, kwargs):
        merged = {**kwargs, **config.all_kwargs()}
        full = {**named, **config.all_kwargs()}

        def kernel_call():
            self._restore_and_reset(named, snapshot)
            if self._user_pre_hook is not None:
                self._user_pre_hook(full)
            if config.pre_hook is not None:
                config.pre_hook(full)
            try:
                self.fn[grid](*args, **merged)
            except Exception as exc:
                if self._user_post_hook is not None:
                    self._user_post_hook(full, exception=exc)
                raise
            if self._user_post_hook is not None:
                self._user_post_hook(full, exception=None)

        bench = self._timer
        if bench is None:
            import triton.testing

            def bench(fn, quantiles):
                return triton.testing.do_bench(
                    fn, warmup=self.warmup_ms, rep=self.rep_ms, quantiles=quantiles
                )

        return bench(kernel_call, quantiles=_QUANTILES)

    def _precompile(self, configs: list[Config], args, kwargs, device: int) -> None:
        """Compile the configs in worker processes (``python -m fastkernel._compile_worker``) into
        the on-disk kernel cache, so that the benchmarks that follow load them instead of
        compiling one after another. Whatever a worker could not compile is compiled here."""
        workers = _compile_workers(len(configs))
        if workers <= 1 or not _cache.enabled() or _cache.always_compile():
            return
        fn = self.jit_function.fn
        module, qualname = fn.__module__, fn.__qualname__
        if module == "__main__" or "<locals>" in qualname:
            log.debug(
                "fastkernel: %s is not importable by a worker; compiling in this process",
                self.__name__,
            )
            return
        target = self._target(device)
        specs = []
        for config in configs:
            try:
                spec = abi.specialize(
                    self.jit_function, target, args, {**kwargs, **config.all_kwargs()}
                )
                if not _cache.is_cached(self.jit_function, target, spec):
                    specs.append(spec)
            except Exception:  # the benchmark reports this config's error
                continue
        if len(specs) < 2:
            return
        workers = min(workers, len(specs))
        log.info(
            "fastkernel: %s: compiling %d configs in %d worker processes",
            self.__name__,
            len(specs),
            workers,
        )
        try:
            batches = [
                pickle.dumps(
                    {
                        "sys_path": sys.path,
                        "jobs": [(module, qualname, target, spec) for spec in specs[i::workers]],
                    }
                )
                for i in range(workers)
            ]
        except Exception as exc:  # a constexpr that does not pickle: compile here
            log.info("fastkernel: %s: configs compile in this process (%s)", self.__name__, exc)
            return

        # A worker only compiles into the disk cache: it never patches Triton, even where
        # FASTKERNEL_PATCH is set for the whole process tree (`python -m fastkernel run`),
        # which would cost it the patch and a --stats table on its stderr.
        env = {**os.environ, "FASTKERNEL_PATCH": "0"}

        def run(batch: bytes) -> None:
            done = subprocess.run(
                [sys.executable, "-m", "fastkernel._compile_worker"],
                input=batch,
                capture_output=True,
                check=False,
                env=env,
            )
            if done.returncode != 0 or done.stderr:
                log.debug(
                    "fastkernel: compile worker (exit %d): %s",
                    done.returncode,
                    done.stderr.decode(errors="replace")[-2000:],
                )

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, batches))

    # -- the tuning record on disk ------------------------------------------------------------

    def record_document(
        self, tuning_key: tuple[Any, ...], target, configs: Sequence[Config] | None = None
    ) -> dict[str, Any]:
        """What decides a tuning result, as JSON data: the kernel (Triton's ``cache_key``: its
        source, the jit functions it calls and the constexpr globals it reads), the configs
        benchmarked (``configs``, the call's pruned ones; default all), the key names and the
        key, the target, the toolchain fingerprint (fastkernel/cache/key.py) and Triton's
        cache-invalidating environment variables. Raises ``cache.Uncacheable``; TypeError naming
        the argument when ``tuning_key`` is not a tuple, ``target`` not a GPUTarget or
        ``configs`` not a sequence of triton.Config (or None)."""
        who = "record_document"
        _arguments.instance(who, "tuning_key", tuning_key, tuple, "a tuple")
        check_target(who, target)
        if configs is not None and not (
            isinstance(configs, Sequence) and all(isinstance(c, Config) for c in configs)
        ):
            raise _arguments.kind_error(
                f"{who}()", "configs", "a sequence of triton.Config or None", configs
            )
        try:
            kernel_key = self.jit_function.cache_key
        except Exception as exc:
            raise _cache.Uncacheable(
                f"its source cannot be hashed ({type(exc).__name__}: {exc})"
            ) from exc
        return {
            "format": TUNING_FORMAT_VERSION,
            "kernel": kernel_key,
            "configs": [_config_doc(c) for c in (self.configs if configs is None else configs)],
            "key_names": list(self.keys),
            "key": render(tuning_key),
            "target": target_dict(target),
            "toolchain": _cache.toolchain_fingerprint(target, toolchain_dir(_cache.cache_dir())),
            "env": cache_env(),
        }

    def _record_path(
        self, tuning_key, target, configs: Sequence[Config] | None = None
    ) -> pathlib.Path | None:
        """Where the tuning record of ``tuning_key`` lives, its directory created private to
        the user; None when results are not kept (``cache_results=False``, the cache off or not
        trusted, or the kernel uncacheable)."""
        if not self.cache_results:
            return None
        root = usable_root()
        if root is None:
            return None
        try:
            doc = self.record_document(tuning_key, target, configs)
        except _cache.Uncacheable as exc:
            log_once(
                logging.WARNING,
                ("autotune-uncacheable", self.__name__, str(exc)),
                "fastkernel: tuning results of %s are not kept on disk: %s",
                self.__name__,
                exc,
            )
            return None
        digest = hashlib.sha256(canonical(doc)).hexdigest()
        try:
            directory = _cache_files.ensure_dir(root, "autotune", digest[:2])
        except OSError as exc:
            warn_untrusted(root / "autotune" / digest[:2], exc)
            return None
        return directory / f"{digest}.json"

    def _read_record(self, path: pathlib.Path, configs: Sequence[Config]) -> Config | None:
        """The config a tuning record chose among ``configs`` (its index there), checked against
        the config it describes; None when there is none or it does not fit (logged)."""
        if _cache.always_compile():
            return None
        try:
            record = json.loads(_cache_files.read_file(path, 1 << 20)[0])
            index = record["config_index"]
            if type(index) is not int or not 0 <= index < len(configs):
                raise IndexError(f"config_index {index!r} outside the {len(configs)} configs")
            config = configs[index]
            if record["config"] != _config_doc(config):
                raise ValueError("the config at its index differs")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            log.warning("fastkernel: ignoring the tuning record %s (%r); tuning again", path, exc)
            return None
        log.info(
            "fastkernel: %s: tuned config read from %s: %s", self.__name__, path, _describe(config)
        )
        return config

    def _write_record(
        self, path: pathlib.Path, tuning_key, configs: Sequence[Config], config: Config
    ) -> None:
        timings = self.configs_timings or {}
        record = {
            "kernel": f"{self.jit_function.fn.__module__}.{self.jit_function.fn.__qualname__}",
            "key": repr(tuning_key),
            "config_index": list(configs).index(config),
            "config": _config_doc(config),
            "timings_ms": [[_describe(c), _median(t)] for c, t in timings.items()],
        }
        try:
            _cache_files.write_file(path, json.dumps(record, indent=1).encode())
        except OSError as exc:
            log.warning("fastkernel: cannot write the tuning record %s: %s", path, exc)


class _KeyedArgs(dict):
    """The arguments a keyed heuristic may read: reading any other raises, so a value never
    depends on something the native key does not hold."""

    def __init__(
        self,
        visible: dict[str, Any],
        kernel: str,
        value: str,
        key: Sequence[str],
        params: Sequence[str],
    ):
        super().__init__(visible)
        self._where = (kernel, value, list(key))
        self._params = frozenset(params)

    def __missing__(self, name):
        kernel, value, key = self._where
        raise KeyError(
            f"{kernel}: the heuristic for {value!r} read argument {name!r}, which is "
            f"not in its key {key}; add it to fastkernel.heuristics(key=...)"
        )

    def get(self, name, default=None):
        return self[name]

    def __contains__(self, name):
        # Triton's mapping holds every argument the call passed; this one only the key's, so
        # `name in args` can be answered only for those.
        if super().__contains__(name):
            return True
        if name in self._params:
            self[name]  # a parameter outside the key: raises KeyError naming it
        return False  # not a parameter: what the call passed is all here (keyed compile options)

    def _whole(self, *args, **kwargs):
        kernel, value, key = self._where
        raise KeyError(
            f"{kernel}: the heuristic for {value!r} reads its arguments as a whole, which "
            f"its key {key} does not hold; read them by name"
        )

    __iter__ = keys = values = items = __len__ = _whole


class Heuristics(NativeDispatch, TritonHeuristics):
    """A ``@fastkernel`` kernel under ``@fastkernel.heuristics(values, key=...)``: each value is
    computed once per key and compiled into the launch record, so a call is one native hit.
    It is also a ``triton.runtime.autotuner.Heuristics`` (torch.compile applies its values)."""

    def __init__(self, kernel: FastKernel, values: dict[str, Callable], key: Sequence[str]):
        jit_fn = kernel.jit_function
        arg_names = [p.name for p in jit_fn.params]
        by_name = {p.name: p for p in jit_fn.params}
        if isinstance(key, str):
            raise TypeError(
                f"fastkernel.heuristics: key must be a list of argument names, got "
                f"the string {key!r}"
            )
        unknown = [n for n in key if n not in by_name]
        if unknown:
            raise ValueError(
                f"fastkernel.heuristics: key names {', '.join(map(repr, unknown))}, "
                f"not arguments of {jit_fn.__name__} ({', '.join(arg_names)})"
            )
        for name in values:
            if name not in by_name or not by_name[name].is_constexpr:
                raise TypeError(
                    f"fastkernel.heuristics: {name!r} is not a tl.constexpr parameter "
                    f"of {jit_fn.__name__}; computed values are compiled in"
                )
            if name in key:
                raise ValueError(f"fastkernel.heuristics: {name!r} is both computed and in the key")
        for name, fn in values.items():
            # A value is computed once per key: a function that can read anything else (a
            # global, a closure variable, a helper) would leave it stale.
            if isinstance(fn, types.FunctionType):
                outside = _heuristic_code.analyze(fn).outside
            else:
                outside = f"is a {type(fn).__name__}, whose code cannot be read"
            if outside is not None:
                raise TypeError(
                    f"fastkernel.heuristics: the heuristic for {name!r} {outside}; with a key "
                    f"each value is computed once per key, so it may read only the key's "
                    f"arguments (and min, max, math, triton.cdiv, triton.next_power_of_2, and "
                    f"Python functions whose own code reads only theirs). "
                    f"Without a key the functions run on every call"
                )
        TritonHeuristics.__init__(self, kernel, arg_names, dict(values))
        self.__name__ = jit_fn.__name__
        self.keys = list(key)
        self._constexprs = [
            p.name for p in jit_fn.params if p.is_constexpr and p.name not in values
        ]
        # A keyed tensor is keyed by its sizes and exact strides (and, as every tensor, its
        # dtype, device and 16-byte alignment): what a heuristic can read from its layout.
        tune = {
            p.name: (TUNE_CONFIG_PROVIDED if p.name in values else 0)
            | (TUNE_VALUE | TUNE_SIZES | TUNE_STRIDES if p.name in self.keys else 0)
            for p in jit_fn.params
        }
        self._init_native(jit_fn, _params_spec(jit_fn, tune), jit_fn.pre_run_hooks)

    def run(self, *args, grid, warmup: bool = False, **kwargs):
        """``Heuristics.run``: ``run(*args, grid=g, **kw)`` launches as ``self[g](*args, **kw)``
        and returns what that returns. Raises NotImplementedError for ``warmup=True``, and what
        the launch raises."""
        if warmup:
            raise NotImplementedError("fastkernel.heuristics: warmup=True is not supported")
        return self[grid](*args, **kwargs)

    def __repr__(self) -> str:
        return f"Heuristics({self.fn!r}, {sorted(self.values)}, key={self.keys})"

    def check_conflicts(self, kwargs: dict[str, Any]) -> None:
        """Raise ValueError naming each computed parameter the call's keywords ``kwargs``
        pass: a value this decorator computes cannot also be passed. TypeError naming
        ``kwargs`` when it is not a mapping."""
        _arguments.instance("check_conflicts", "kwargs", kwargs, Mapping, "a mapping")
        conflicts = [k for k in kwargs if k in self.values]
        if conflicts:
            raise ValueError(
                f"{self.__name__}: {', '.join(conflicts)} computed by "
                f"fastkernel.heuristics cannot be passed too"
            )

    def values_for(self, named: dict[str, Any]) -> dict[str, Any]:
        """The computed values for a bound call, each function seeing the key's arguments, the
        constexprs, the tuned config's values and the values computed before it. TypeError
        naming ``named`` when it is not a mapping."""
        _arguments.instance("values_for", "named", named, Mapping, "a mapping")
        visible = {k: named[k] for k in (*self.keys, *self._constexprs) if k in named}
        visible.update(
            {k: v for k, v in named.items() if k not in self.arg_names}
        )  # config options
        for name, fn in self.values.items():
            visible[name] = fn(_KeyedArgs(visible, self.__name__, name, self.keys, self.arg_names))
        return {name: visible[name] for name in self.values}

    def _on_miss(
        self, grid, args: tuple, kwargs: dict, key: bytes | None, device: int, reason: str | None
    ):
        self.check_conflicts(kwargs)
        named = self.named_arguments(args, kwargs, provided=self.values)
        merged = {**kwargs, **self.values_for(named)}
        if key is None:
            return self._fallback(grid, args, merged, reason or "unsupported call")
        # values_for sets every heuristic's parameter, so no default is ever taken here.
        tuned_args = self._tuned_args(merged, self.values)
        return self._register_miss(grid, args, merged, key, device, tuned_args)


def heuristics(values: dict[str, Callable], key: Sequence[str] | None = None):
    """Compute tl.constexpr parameters from the arguments; stack it above ``@fastkernel``
    (and below ``@fastkernel.autotune``).

    Parameters
    ----------
    values : dict of str to callable
        ``{name: fn(args) -> value}`` as for ``triton.heuristics``: ``args`` maps argument names
        to values (and, under an autotuner, the tuned config's values; later functions also see
        earlier results).
    key : list of str, optional
        The arguments the functions read. Given, each value is computed once per key (ints,
        floats and bools by value, tuples by their elements, tensors by sizes, exact strides,
        dtype and alignment) and compiled into the launch record: a call is one native hit. A
        function reading an argument outside the key raises KeyError naming it; one whose code
        can read anything but its arguments (``fastkernel._heuristic_code``) is refused with
        TypeError here. Without a key this is
        ``triton.heuristics``: the functions run in Python on every call and the launch is
        native.

    Raises
    ------
    TypeError
        When the decorator is made: ``values`` not a dict of names to callables, ``key`` not
        a list of names (used bare, ``@fastkernel.heuristics`` without arguments). At
        decoration: the decorated object is not a kernel; with a key, a computed name that is
        not a tl.constexpr parameter, or a function that can read outside its arguments.
    ValueError
        With a key: at decoration, a key name that is not an argument, or a name both
        computed and in the key; at a call, the call passes a computed parameter.
    KeyError
        With a key, at a miss: a function reads an argument outside the key. (Without a key
        the checks after decoration are ``triton.heuristics``'s own.)
    """

    if callable(values) and not isinstance(values, dict):
        raise TypeError(
            "fastkernel.heuristics takes arguments: @fastkernel.heuristics(values={...}, key=[...])"
        )
    _check_heuristics_arguments(values, key)

    def decorator(kernel):
        from .kernel import _InterpretedKernel, _is_interpreted

        if isinstance(kernel, _InterpretedKernel):  # Triton's interpreter runs the kernel
            kernel = kernel.fn
        # Triton 3.5's InterpretedFunction is no KernelInterface (3.8's and later are).
        if not (isinstance(kernel, KernelInterface) or _is_interpreted(kernel)):
            raise TypeError(
                f"fastkernel.heuristics wraps a @fastkernel kernel, got {type(kernel).__name__}"
            )
        if key is None or not isinstance(kernel, FastKernel):
            if (
                isinstance(kernel, JITFunction)
                and not isinstance(kernel, FastKernel)
                and not _env.native_path_off()
            ):
                raise TypeError("fastkernel.heuristics goes above @fastkernel")
            return triton.heuristics(values)(kernel)
        return Heuristics(kernel, values, key)

    return decorator


def _median(timing: Any) -> float:
    """The median of a ``do_bench`` result: a float, or a list of quantiles (median first)."""
    if isinstance(timing, (list, tuple)):
        return float(timing[0])
    value = float(timing)
    return value if not math.isnan(value) else float("inf")


def _interpreter_timer() -> Callable | None:
    """Under TRITON_INTERPRET=1, a do_bench of wall-clock milliseconds per call (Triton's needs a
    GPU driver); otherwise None (Triton's own)."""
    if not _env.triton_interpret():
        return None

    def wall_clock(kernel_call, quantiles=None, **_):
        import time

        times = []
        for _repeat in range(3):
            start = time.perf_counter()
            kernel_call()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return [times[1]] * len(quantiles) if quantiles else times[1]

    return wall_clock


def tuning_dir() -> pathlib.Path:
    """Where tuning records live: ``autotune/`` under the kernel cache directory
    (FASTKERNEL_CACHE_DIR)."""
    return _cache.cache_dir() / "autotune"


def autotune(
    configs: Sequence[Config],
    key: Sequence[str],
    prune_configs_by: dict[str, Any] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    pre_hook: Callable | None = None,
    post_hook: Callable | None = None,
    warmup: float = 25,
    rep: float = 100,
    do_bench: Callable | None = None,
    cache_results: bool = True,
):
    """Autotune a ``@fastkernel`` kernel over ``configs``; stack it above ``@fastkernel``.

    Arguments mean what they mean for ``triton.autotune`` (triton/runtime/autotuner.py):

    Parameters
    ----------
    configs : list of triton.Config
        Meta-parameter values (tl.constexpr parameters) and compile options to choose from.
    key : list of str
        Argument names whose change re-tunes. A scalar is keyed by value; a tensor by its sizes.
        Beyond the names, every tensor's dtype and stride pattern (each stride classed as 0, 1
        or other) is part of the key, so a transposed or broadcast input is tuned apart.
    prune_configs_by : dict, optional
        ``early_config_prune(configs, named_args, **kwargs) -> configs``, ``perf_model(**args)
        -> estimate`` and ``top_k`` (an int, or a fraction of the configs).
    reset_to_zero : list of str, optional
        Tensors zeroed before every benchmark repetition and before the real launch that
        follows tuning (accumulating kernels then return what one clean run returns).
    restore_value : list of str, optional
        Tensors snapshotted once before tuning, restored before every benchmark repetition and
        after tuning (in-place kernels then return what one clean run returns).
    pre_hook, post_hook : callable, optional
        Run before and after every benchmark repetition (``pre_hook(args)``, ``post_hook(args,
        exception=...)``), in addition to the reset and restore (Triton's replace them).
    warmup, rep : float
        Milliseconds of warm-up and of timed repetitions per config (triton.testing.do_bench).
    do_bench : callable, optional
        ``do_bench(kernel_call, quantiles) -> ms or [ms, ...]`` replacing Triton's timer.
    cache_results : bool
        Keep tuning results on disk under ``FASTKERNEL_CACHE_DIR/autotune`` (also off with
        FASTKERNEL_CACHE=0), keyed by the kernel's source, configs, key, device arch,
        toolchain and Triton's cache-invalidating environment variables. A new process reads
        them without benchmarking.

    Returns
    -------
    callable
        A decorator turning a ``FastKernel`` into an :class:`Autotuned`. Launch it as
        ``kernel[grid](...)`` without the tuned parameters; a callable grid receives them.

    Raises
    ------
    TypeError
        When the decorator is made: an argument of the wrong kind (``configs`` not a list,
        ``key`` not a list of names, a hook, ``do_bench`` or a ``prune_configs_by`` function
        not callable, ``warmup`` / ``rep`` not numbers, ``cache_results`` not a bool). At
        decoration: a config that is not a ``triton.Config`` or sets a non-constexpr
        parameter; not stacked above ``@fastkernel``.
    ValueError
        When the decorator is made: ``prune_configs_by`` with another key or a ``top_k``
        float above 1.0; ``warmup`` / ``rep`` negative or not finite. At decoration: a name in
        ``key`` / ``reset_to_zero`` / ``restore_value`` that is not an argument; a config
        setting an unknown parameter. At a call: Triton's "Conflicting meta-parameters" when
        the call passes a tuned parameter.
    RuntimeError
        A launch made while tuning a key (from a prune function, hook or timer) needs that
        same key tuned.
    AutotuneError
        Every config failed to compile or run (the message lists each failure), or
        ``early_config_prune`` returned no config.

    Notes
    -----
    Configs compile in parallel worker processes before benchmarking when there are several
    (FASTKERNEL_COMPILE_WORKERS: count, 0 = in this process). Progress shows on an interactive
    terminal; the winner is logged on the ``fastkernel`` logger at INFO.
    """
    if callable(configs) and not isinstance(configs, (list, tuple)):
        raise TypeError(
            "fastkernel.autotune takes arguments: @fastkernel.autotune(configs=[...], key=[...])"
        )
    _check_autotune_arguments(
        configs, key, prune_configs_by, reset_to_zero, restore_value, pre_hook, post_hook,
        warmup, rep, do_bench, cache_results,
    )  # fmt: skip

    def decorator(kernel):
        if _env.native_path_off() and not isinstance(kernel, (FastKernel, Heuristics)):
            # @fastkernel returned Triton's own object: tune with Triton's autotuner (in the
            # interpreter, timed by the wall clock: there is no GPU to time on).
            from .kernel import _InterpretedKernel

            inner = kernel.fn if isinstance(kernel, _InterpretedKernel) else kernel
            options = dict(
                prune_configs_by=prune_configs_by,
                reset_to_zero=reset_to_zero,
                restore_value=restore_value,
                pre_hook=pre_hook,
                post_hook=post_hook,
                do_bench=do_bench or _interpreter_timer(),
            )
            accepted = inspect.signature(triton.autotune).parameters
            return triton.autotune(
                configs, key, **{k: v for k, v in options.items() if k in accepted}
            )(inner)
        if isinstance(kernel, TritonHeuristics) and not isinstance(kernel, Heuristics):
            raise TypeError(
                "fastkernel.autotune over @triton.heuristics: put @triton.heuristics "
                "above @fastkernel.autotune, or use @fastkernel.heuristics(values, "
                "key=[...]) below it"
            )
        if isinstance(kernel, JITFunction) and not isinstance(kernel, FastKernel):
            raise TypeError(
                "fastkernel.autotune goes above @fastkernel:\n"
                "    @fastkernel.autotune(configs=..., key=...)\n    @fastkernel\n"
                "    @triton.jit\n    def kernel(...): ..."
            )
        if not isinstance(kernel, (FastKernel, Heuristics)):
            raise TypeError(
                f"fastkernel.autotune wraps a @fastkernel kernel, got {type(kernel).__name__}; "
                f"@triton.heuristics goes above @fastkernel.autotune (its values are then passed "
                f"to the tuned kernel, and keyed natively)"
            )
        return Autotuned(
            kernel,
            configs,
            key,
            prune_configs_by=prune_configs_by,
            reset_to_zero=reset_to_zero,
            restore_value=restore_value,
            pre_hook=pre_hook,
            post_hook=post_hook,
            warmup=warmup,
            rep=rep,
            do_bench=do_bench,
            cache_results=cache_results,
        )

    return decorator
