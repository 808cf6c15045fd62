"""fastkernel's environment variables, read one way.

``flag`` reads an on/off variable (``FASTKERNEL_DISABLE``, ``FASTKERNEL_PATCH``,
``FASTKERNEL_CACHE``, ...): unset or empty gives the default; ``0``, ``false``, ``off`` and ``no``
(any case, surrounding blanks ignored) turn it off; any other value turns it on. ``count`` reads a
non-negative int. ``triton_interpret`` asks Triton's own knob (``triton.knobs.runtime.interpret``,
``TRITON_INTERPRET`` as Triton parses it), since that is what decides whether ``@triton.jit``
gives an interpreted function.
"""

from __future__ import annotations

import os

_OFF = ("0", "false", "off", "no")


def flag(name: str, default: bool = False) -> bool:
    """The on/off value of environment variable ``name``; ``default`` when unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in _OFF


def count(name: str, default: int) -> int:
    """An int >= 0 from environment variable ``name`` (``default`` when unset or empty).

    Raises
    ------
    ValueError
        Naming the variable, when the value is not an int >= 0.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an int >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {raw!r}")
    return value


def triton_interpret() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET``, read by Triton)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def native_path_off() -> bool:
    """Whether fastkernel's decorators hand kernels to Triton unchanged: ``FASTKERNEL_DISABLE``
    is on, or Triton runs kernels in its interpreter."""
    return flag("FASTKERNEL_DISABLE") or triton_interpret()
