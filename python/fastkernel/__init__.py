"""fastkernel: launch Triton kernels at the cost of ``cuLaunchKernel``.

>>> from fastkernel import fastkernel
>>> @fastkernel
... @triton.jit
... def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr): ...
>>> add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
"""

from __future__ import annotations

import os

import torch


def _check_torch_version() -> None:
    # The extension links against torch's C++ ABI; another torch would crash, not fail cleanly.
    from importlib import util

    spec = util.find_spec("fastkernel._build_info")
    if spec is None:
        return
    from ._build_info import TORCH_VERSION as built_with

    if built_with != torch.__version__:
        raise ImportError(
            f"fastkernel was built against torch {built_with} but torch {torch.__version__} is "
            f"installed; rebuild it with: pip install --no-build-isolation ."
        )


_check_torch_version()

#: The Triton versions whose launch ABI fastkernel mirrors (python/fastkernel/_triton_abi.py).
SUPPORTED_TRITON = ((3, 5), (3, 9))


def _check_triton_version(version: str) -> None:
    """Raise ImportError naming the supported range when ``version`` (a Triton version string)
    is outside it: the native launcher packs parameters as those versions' launchers do."""
    parts = version.split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise ImportError(f"fastkernel: cannot read Triton's version {version!r}") from None
    low, high = SUPPORTED_TRITON
    if not low <= major_minor <= high:
        raise ImportError(
            f"fastkernel supports Triton {low[0]}.{low[1]} to {high[0]}.{high[1]}, but Triton "
            f"{version} is installed"
        )


import triton as _triton

_check_triton_version(_triton.__version__)

# The native module loads first: it refuses a torch other than the one it was built against.
from . import _C as _C
from . import _env, _host_helpers
from ._autotune import Autotuned, AutotuneError, Heuristics, autotune, heuristics
from ._C import BundleError, CudaError, DriverUnavailableError
from .bundle import check_bundle, export
from .kernel import FastKernel, fastkernel, stats
from .patch import is_patched, patch, patched, register_autotuner, unpatch


def patch_host_helpers() -> bool:
    """Make host calls of Triton's constexpr functions (``triton.cdiv``,
    ``triton.next_power_of_2``, any ``@triton.constexpr_function``) native, without patching
    kernel launches; :func:`patch` does this too. Results, exceptions and calls from Triton's
    code generator are unchanged (see ``fastkernel/_host_helpers.py``). Returns False where
    the installed Triton's helpers are plain functions already. Undone by
    :func:`unpatch_host_helpers`."""
    return _host_helpers.install()


def unpatch_host_helpers() -> None:
    """Undo :func:`patch_host_helpers`: ``ConstexprFunction.__call__`` is Triton's own again.
    (While :func:`patch` is in effect, :func:`unpatch` undoes both.)"""
    _host_helpers.uninstall()


# ``from fastkernel import fastkernel`` users write ``@fastkernel.autotune(...)`` too.
fastkernel.autotune = autotune  # type: ignore[attr-defined]
fastkernel.heuristics = heuristics  # type: ignore[attr-defined]

__version__ = "0.1.0"
__all__ = [
    "fastkernel",
    "FastKernel",
    "autotune",
    "Autotuned",
    "AutotuneError",
    "heuristics",
    "Heuristics",
    "CudaError",
    "patch",
    "unpatch",
    "patched",
    "is_patched",
    "register_autotuner",
    "patch_host_helpers",
    "unpatch_host_helpers",
    "DriverUnavailableError",
    "get_include",
    "get_cmake_dir",
    "export",
    "check_bundle",
    "BundleError",
    "stats",
    "__version__",
]


def get_cmake_dir() -> str:
    """Directory holding ``fastkernelConfig.cmake``: pass it as ``-Dfastkernel_DIR=...`` (or put
    it on ``CMAKE_PREFIX_PATH``) and ``find_package(fastkernel)`` gives ``fastkernel::fastkernel``.

    Raises
    ------
    FileNotFoundError
        When fastkernel is not installed from a wheel (a source checkout has no built package).
    """
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake", "fastkernel")
    if not os.path.isfile(os.path.join(path, "fastkernelConfig.cmake")):
        raise FileNotFoundError(f"no fastkernelConfig.cmake under {path}: install the wheel")
    return path


def get_include() -> str:
    """Directory holding ``fastkernel/fastkernel.h`` (the exported C++ API), for C++ builds:
    the installed package's ``include/``, or a source checkout's ``csrc/include`` when the
    package runs from one.

    Raises
    ------
    FileNotFoundError
        When neither holds ``fastkernel/fastkernel.h``.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (
        os.path.join(here, "include"),
        os.path.join(os.path.dirname(os.path.dirname(here)), "csrc", "include"),
    ):
        if os.path.isfile(os.path.join(path, "fastkernel", "fastkernel.h")):
            return path
    raise FileNotFoundError(f"no fastkernel/fastkernel.h under {here}: install the wheel")


if _env.flag("FASTKERNEL_PATCH"):
    patch()
