"""Host calls of Triton's constexpr functions at native speed.

``triton.cdiv``, ``triton.next_power_of_2`` and every ``@triton.constexpr_function`` are
``triton.runtime.jit.ConstexprFunction`` objects. Their ``__call__`` (Triton's
``runtime/jit.py``) imports from ``triton.language.core``, unwraps every argument and builds a
list and a dict on each call, about 2 us from host code, where grid functions and library
wrappers call them on every launch. :func:`install` gives ``ConstexprFunction`` a native
``__call__`` that calls the wrapped function directly when the call is a plain host call (no
``tl.constexpr`` argument, no ``_semantic`` keyword), which is what Triton's own ``__call__``
does then; any other call, including every call from Triton's code generator, runs Triton's
own ``__call__``. Results and exceptions are those of the wrapped function in both cases.
``triton.cdiv`` and ``triton.next_power_of_2`` on exact ints below 2**62 in magnitude are
computed natively (their bodies in ``triton/__init__.py``; no overflow is possible there), the
rest by their Python bodies; a function assigned in their place before fastkernel's import is
not taken for them (:func:`tritons_own`).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language
from triton.runtime import jit as _triton_jit

from . import _C, _locks

_lock = _locks.lock()
_saved_call: Any | None = None


def tritons_own(name: str) -> Any:
    """``triton.<name>`` (``"cdiv"``, ``"next_power_of_2"``) while it is still the function
    ``triton/__init__.py`` defines, else a new object that no callee is.

    The native paths compute these functions' bodies in place of calling them, recognising
    them by identity, so they must never take a replacement for Triton's own: SGLang, on
    import, assigns its own Python ``next_power_of_2`` (which differs from Triton's at 0), and
    a process that imported it before fastkernel must still call that function."""
    obj = getattr(triton, name, None)
    fn = getattr(obj, "fn", obj)  # a ConstexprFunction wraps the function; older Tritons' is plain
    if getattr(fn, "__module__", None) == "triton" and getattr(fn, "__qualname__", None) == name:
        return obj
    return object()


#: Triton's ``cdiv`` and ``next_power_of_2`` as fastkernel's import found them (see
#: :func:`tritons_own`).
CDIV = tritons_own("cdiv")
NEXT_POWER_OF_2 = tritons_own("next_power_of_2")


def _constexpr_function_type() -> type | None:
    return getattr(_triton_jit, "ConstexprFunction", None)


def installed() -> bool:
    """Whether the native ``ConstexprFunction.__call__`` is installed."""
    return _saved_call is not None


def install() -> bool:
    """Install the native host-call path (idempotent). Returns False where the installed Triton
    has no ``ConstexprFunction`` (its helpers are plain functions, fast already)."""
    global _saved_call
    with _lock:
        cls = _constexpr_function_type()
        if cls is None:
            return False
        if _saved_call is None:
            original = cls.__dict__["__call__"]
            _C.install_host_helpers(cls, triton.language.constexpr, original, CDIV, NEXT_POWER_OF_2)
            _saved_call = original
        return True


def uninstall() -> None:
    """Give ``ConstexprFunction`` back Triton's own ``__call__`` (the same function object)."""
    global _saved_call
    with _lock:
        if _saved_call is not None:
            type.__setattr__(_constexpr_function_type(), "__call__", _saved_call)
            _saved_call = None
