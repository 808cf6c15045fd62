"""Checks of public functions' arguments that several modules share, so that the same kind of
argument is checked, and its error worded, one way: a TypeError naming the argument for a wrong
kind, and for numbers a test of the value that callers turn into their ValueError."""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (a bool is neither here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_nonnegative(value: int | float) -> float | None:
    """``value`` (a number, :func:`is_number`) as a float when it is finite and >= 0, else None
    (an int too large for a float counts as infinite)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0 <= number < math.inf else None


def kind_error(who: str, name: str, what: str, value: Any) -> TypeError:
    """The TypeError for argument ``name`` of ``who`` (as the message names the callable:
    ``"entry_path()"``, ``"fastkernel.autotune"``) given ``value``, where it takes ``what`` (the
    kinds in words: ``"a bool"``)."""
    return TypeError(f"{who}: argument '{name}' must be {what}, not {type(value).__name__}")


def path(who: str, name: str, value: Any, or_none: str = "") -> pathlib.Path:
    """Argument ``name`` of ``who()``, a str or os.PathLike, as a path; TypeError naming the
    argument for any other kind (``or_none``: what the message adds when None is allowed)."""
    if isinstance(value, pathlib.Path):  # before the os.PathLike ABC test, the costlier one
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise kind_error(f"{who}()", name, f"a str or os.PathLike{or_none}", value)
    return pathlib.Path(value)


def instance(who: str, name: str, value: Any, kinds: type | tuple[type, ...], what: str) -> None:
    """TypeError naming argument ``name`` of ``who()`` unless ``value`` is an instance of
    ``kinds`` (``what``: the kinds in words, "a GPUTarget")."""
    if not isinstance(value, kinds):
        raise kind_error(f"{who}()", name, what, value)
