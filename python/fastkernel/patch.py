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
- Each kernel gets its dispatch (a :class:`PatchedKernel`) at its first launch, kept in the
  kernel's ``__dict__`` under ``kernel.PATCH_ATTR``; :func:`unpatch` removes it again.

What stays on Triton's path: a ``JITFunction`` subclass that defines its own ``run`` (its own
behaviour is kept), ``warmup=True`` (compile only), and every call the native key does not cover
(counted in ``fastkernel.stats()`` with its reason, as for ``@fastkernel``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from typing import Any, Dict, Iterator, Optional

import triton
from triton.runtime.jit import JITFunction, KernelInterface

from . import SUPPORTED_TRITON, _C
from . import _triton_abi as abi
from .kernel import PATCH_ATTR, TRITON_RUN, NativeDispatch, _params_spec

log = logging.getLogger("fastkernel")


_lock = threading.RLock()
_saved: Optional[Dict[str, Any]] = None  # Triton's attributes as they were, while patched
# Every JITFunction given a dispatch, by id (JITFunctions need not be hashable).
_served: Dict[int, "weakref.ref[JITFunction]"] = {}


class PatchedKernel(NativeDispatch):
    """The native dispatch of one Triton ``JITFunction`` under :func:`patch`.

    It is not a ``JITFunction`` itself: the kernel object a library holds stays exactly
    Triton's, so ``isinstance`` checks, ``torch.compile`` capture and pickling see no change.
    ``stats()`` and ``fastkernel.stats()`` report it under the kernel's ``module.qualname``.
    """

    def __init__(self, jit_fn: JITFunction):
        self._init_native(jit_fn, _params_spec(jit_fn), jit_fn.pre_run_hooks)

    def __repr__(self) -> str:
        return f"PatchedKernel({self._stats_name()})"


def _dispatch_for(jit_fn: JITFunction) -> Optional[PatchedKernel]:
    """The patch factory (called natively at a kernel's first launch): its dispatch, or None
    when the kernel keeps Triton's own path."""
    if not getattr(type(jit_fn).run, "_fastkernel_patched", False):
        return None  # a subclass with its own run: its behaviour is its own
    with _lock:  # not while unpatch() runs in another thread
        if _saved is None:
            return None
        dispatch = jit_fn.__dict__.get(PATCH_ATTR)
        if dispatch is None:
            dispatch = PatchedKernel(jit_fn)
            jit_fn.__dict__[PATCH_ATTR] = dispatch
            key = id(jit_fn)
            _served[key] = weakref.ref(jit_fn, lambda _ref, key=key: _served.pop(key, None))
        return dispatch


def _patched_run(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` under the patch: a launch goes through the kernel's native dispatch;
    ``warmup=True`` (compile only) and kernels that keep Triton's path go to Triton's ``run``."""
    if not warmup:
        dispatch = _C.patched_dispatch(self)
        if dispatch is not None:
            return dispatch[grid](*args, **kwargs)
    return TRITON_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)


_patched_run._fastkernel_patched = True  # type: ignore[attr-defined]


def _disabled_reason() -> Optional[str]:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET=1 (Triton's interpreter runs kernels on CPU tensors)"
    if os.environ.get("FASTKERNEL_DISABLE", "0") not in ("", "0"):
        return "FASTKERNEL_DISABLE=1"
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
        True when the patch is in effect; False when ``TRITON_INTERPRET=1`` or
        ``FASTKERNEL_DISABLE=1`` make it a no-op (logged on the ``fastkernel`` logger).

    Raises
    ------
    RuntimeError
        The installed Triton is outside ``SUPPORTED_TRITON``; nothing is patched.
    """
    global _saved
    with _lock:
        if _saved is not None:
            return True
        reason = _disabled_reason()
        if reason is not None:
            log.info("fastkernel.patch(): not patching Triton: %s", reason)
            return False
        low, high = SUPPORTED_TRITON
        if not low <= abi.TRITON_VERSION <= high:
            raise RuntimeError(
                f"fastkernel.patch(): Triton {triton.__version__} is not supported (supported: "
                f"{low[0]}.{low[1]} to {high[0]}.{high[1]}); nothing was patched")
        from . import _host_helpers
        saved = {name: JITFunction.__dict__[name] for name in ("__getitem__", "run")
                 if name in JITFunction.__dict__}
        triton_getitem = KernelInterface.__dict__["__getitem__"]
        _C.install_patch(JITFunction, _dispatch_for, triton_getitem)
        JITFunction.run = _patched_run
        _host_helpers.install()
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
        for name in ("__getitem__", "run"):
            if name in _saved:
                setattr(JITFunction, name, _saved[name])
            else:
                delattr(JITFunction, name)
        _host_helpers.uninstall()
        _C.uninstall_patch()
        for ref in list(_served.values()):
            jit_fn = ref()
            if jit_fn is not None:
                jit_fn.__dict__.pop(PATCH_ATTR, None)
        _served.clear()
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
