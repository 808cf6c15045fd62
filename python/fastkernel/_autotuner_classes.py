"""Subclasses of Triton's ``Autotuner`` with a ``run`` of their own that ``fastkernel.patch()``
serves natively: those registered with ``fastkernel.register_autotuner``, and the library classes
known here whose ``run`` was read and verified.

For a call whose autotune key is in ``self.cache``, Triton's ``Autotuner.run``
(``runtime/autotuner.py``) sets ``best_config`` and launches ``self.fn`` with the cached config;
a native hit of ``fastkernel.patch.PatchedAutotuner`` does exactly that. A subclass's ``run`` may
do anything before or instead, so the patch keeps such a class on its own ``run`` unless it is
known to do, for a key it has launched before, what Triton's does.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from triton.runtime.autotuner import Autotuner

log = logging.getLogger("fastkernel")


class Registration(NamedTuple):
    """A served ``Autotuner`` subclass: the functions that must stay as they were verified (by
    attribute name, ``run`` first) and the predicate asked of each autotuner object."""

    cls: type
    functions: tuple[tuple[str, Any], ...]
    when: Callable[[Any], bool] | None

    def current(self, cls: type, run: Any) -> bool:
        """Whether the class's ``run`` (the function its ``__dict__`` holds, read through the
        patch's watch on it) is still ``run`` as registered, and ``cls`` (the class itself or a
        subclass) still finds the other functions verified (none replaced on the class, nor
        overridden below it)."""
        if run is not self.functions[0][1]:
            return False
        return all(_lookup(cls, name) is function for name, function in self.functions[1:])

    def allows(self, autotuner: Any) -> bool:
        """The predicate's answer for ``autotuner`` (no predicate: yes). One that raises says no,
        logged."""
        if self.when is None:
            return True
        try:
            return bool(self.when(autotuner))
        except Exception as exc:  # noqa: BLE001 - a failing predicate keeps the class's own run
            log.warning(
                "fastkernel: the predicate registered for %s raised %r: its own run is kept",
                self.cls.__qualname__,
                exc,
            )
            return False


def _lookup(cls: type, name: str) -> Any:
    """``name`` as ``cls``'s MRO holds it (the plain function, no descriptor called)."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    return None


_registered: dict[type, Registration] = {}
# Library classes checked against _KNOWN: their registration, or None (not as verified).
_known_checked: weakref.WeakKeyDictionary[type, Registration | None] = weakref.WeakKeyDictionary()


def register(cls: Any, when: Any) -> None:
    """Registers ``cls`` (``fastkernel.register_autotuner``, which documents it), after checking
    the arguments: kinds first, then values."""
    if not isinstance(cls, type) or not issubclass(cls, Autotuner):
        raise TypeError(
            f"register_autotuner: argument 'cls' must be a subclass of Triton's Autotuner, "
            f"not {cls!r}"
        )
    if when is not None and not callable(when):
        raise TypeError(
            f"register_autotuner: argument 'when' must be callable or None, not "
            f"{type(when).__name__}"
        )
    if cls is Autotuner:
        raise ValueError(
            "register_autotuner: argument 'cls' is Triton's Autotuner itself, which the patch "
            "serves without registering"
        )
    if "run" not in cls.__dict__:
        raise ValueError(
            f"register_autotuner: argument 'cls' ({cls.__qualname__}) defines no run of its "
            f"own; register the class whose run its objects call"
        )
    run = cls.__dict__["run"]
    if not isinstance(run, types.FunctionType):
        raise ValueError(
            f"register_autotuner: argument 'cls' ({cls.__qualname__}) has a run that is not a "
            f"function ({type(run).__name__})"
        )
    _registered[cls] = Registration(cls, (("run", run),), when)


def registration(cls: type) -> Registration | None:
    """The registration of ``cls`` (a class holding ``run`` in its own ``__dict__``): registered
    with ``fastkernel.register_autotuner``, or a library class known here and found as
    verified."""
    found = _registered.get(cls)
    if found is not None:
        return found
    try:
        return _known_checked[cls]
    except KeyError:
        pass
    known = _known_registration(cls)
    _known_checked[cls] = known
    return known


def defined_by(cls: type, name: str, function: Any) -> bool:
    """Whether ``function`` is the one ``cls``'s own module defines as ``cls.name``: its
    module and qualified name say so and its code is in that module's source, so not a
    replacement another library assigned on the class, nor a wrapper over the original
    (``functools.wraps`` copies the names and sets ``__wrapped__``, which
    ``inspect.getsource`` follows)."""
    code = getattr(function, "__code__", None)
    return (
        getattr(function, "__module__", None) == cls.__module__
        and getattr(function, "__qualname__", None) == f"{cls.__qualname__}.{name}"
        and not hasattr(function, "__wrapped__")
        and _same_source(getattr(code, "co_filename", None), sys.modules.get(cls.__module__))
    )


def _same_source(code_file: str | None, module: Any) -> bool:
    """Whether a function's code file (``co_filename``) is ``module``'s source (its
    ``__file__``, which may name the compiled file)."""
    module_file = getattr(module, "__file__", None)
    if not code_file or not module_file:
        return False
    return os.path.splitext(code_file)[0] == os.path.splitext(module_file)[0]


def _source_digest(functions: tuple[tuple[str, Any], ...]) -> str | None:
    """The SHA-256 of the functions' source text, concatenated; None without source."""
    try:
        text = "".join(inspect.getsource(function.__code__) for _, function in functions)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _fla_cache_mode_allows(module_name: str) -> Callable[[Any], bool]:
    def allows(_autotuner: Any) -> bool:
        # FLA_CACHE_MODE=always re-reads the config file on every call, for editing configs
        # while a process runs: every call then goes through the class's run. (fla reads the
        # variable when imported; the module attribute is read when a dispatch is built.)
        module = sys.modules[module_name]
        return module.FLA_CACHE_MODE is not module.FlaCacheMode.ALWAYS

    return allows


# Library classes whose `run` (and what it calls that decides a hit) was read, by module and
# qualified name: the attributes verified, the SHA-256 of their source as read, and the
# predicate. flash-linear-attention's CachedAutotuner (`fla/ops/utils/cache.py`, made by its
# `fla_cache_autotune` decorator; fla-core 0.6.0): `run` builds Triton's autotune key
# (`AutotuneKey.build` is `Autotuner.run`'s key) and, when `should_check_fla_cache` says so,
# loads a config from fla's config files into `self.cache` under that key, then calls
# `super().run`. `should_check_fla_cache` says no for a key in `self.cache`, except with
# FLA_CACHE_MODE=always (the predicate). Its `__init__` replaces `pre_hook` and `post_hook`,
# which Triton's run calls only while tuning (a miss here). The functions must be the plain
# ones fla's module defines (no wrapper) and their source as verified.
_KNOWN: dict[tuple[str, str], tuple[tuple[str, ...], frozenset[str], Callable[[str], Any]]] = {
    ("fla.ops.utils.cache", "CachedAutotuner"): (
        ("run", "should_check_fla_cache"),
        frozenset({"77c4129a720bf9e7851b6a2fcc793ee984d7c0bfe8184acc3661bbc06fd59f76"}),
        _fla_cache_mode_allows,
    ),
}


def _known_registration(cls: type) -> Registration | None:
    known = _KNOWN.get((getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")))
    if known is None or not issubclass(cls, Autotuner):
        return None
    names, digests, make_when = known
    functions = tuple((name, cls.__dict__.get(name)) for name in names)
    if not all(
        isinstance(function, types.FunctionType) and defined_by(cls, name, function)
        for name, function in functions
    ):
        log.info(
            "fastkernel: %s.%s's functions are not the ones its module defines: its own run is "
            "kept",
            cls.__module__,
            cls.__qualname__,
        )
        return None
    digest = _source_digest(functions)
    if digest not in digests:
        log.info(
            "fastkernel: %s.%s is not the code verified (source digest %s): its own run is kept",
            cls.__module__,
            cls.__qualname__,
            digest,
        )
        return None
    return Registration(cls, functions, make_when(cls.__module__))
