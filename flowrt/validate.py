"""Checks of the public API's arguments, shared so that every entry point words them alike.

Each check returns the value as flowrt uses it (an int, a float, a ``Priority``) or raises
:class:`~flowrt.errors.ArgumentError` naming the argument, what was expected and what was
found, after the entry point that took it::

    ArgumentError: Runtime: cpu_workers must be a positive int, got 1.5 (float)

Checks are made where an argument is given (the constructor or the call), never later where
it is used: a NaN that reaches a scheduler's arithmetic makes runs hang instead of fail.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from flowrt.errors import ArgumentError
from flowrt.types import Priority

# How much of a found value a message shows.
_SHOWN_CHARS = 60


def _found(value: Any) -> str:
    text = repr(value)
    if text.startswith("<"):  # an object's default repr: its type says more than its address
        return f"a {type(value).__name__}"
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    # The type too, unless the value is None or a plain number: '2' (str), True (bool), 1.5.
    return text if value is None or type(value) in (int, float) else f"{text} ({type(value).__name__})"


def argument_error(name: str, expected: str, value: Any, where: str | None = None) -> ArgumentError:
    """The error for argument ``name`` of ``where`` (e.g. "Runtime"): ``expected`` is what it
    must be ("a positive int"), ``value`` what was given."""
    prefix = f"{where}: " if where else ""
    return ArgumentError(f"{prefix}{name} must be {expected}, got {_found(value)}")


def check_int(
    name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, where: str | None = None
) -> int:
    """``value`` as an int in [``minimum``, ``maximum``]; numpy integers are taken, bools and
    floats (even 2.0) are not."""
    if minimum == 1 and maximum is None:
        expected = "a positive int"
    elif maximum is None:
        expected = f"an int >= {minimum}"
    else:
        expected = f"an int from {minimum} to {maximum}"
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise argument_error(name, expected, value, where)
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        raise argument_error(name, expected, value, where)
    return number


def check_seconds(
    name: str,
    value: Any,
    *,
    allow_zero: bool = False,
    maximum: float | None = None,
    where: str | None = None,
) -> float:
    """``value`` as a finite float of seconds, > 0 (or >= 0 with ``allow_zero``), at most
    ``maximum``. NaN and infinity are refused: a wait of either never ends, or never begins."""
    expected = "a finite number of seconds >= 0" if allow_zero else "a positive finite number of seconds"
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise argument_error(name, expected, value, where)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise argument_error(name, expected, value, where)
    if maximum is not None and seconds > maximum:
        raise argument_error(name, f"{expected} at most {maximum:g}", value, where)
    return seconds


def check_bool(name: str, value: Any, *, where: str | None = None) -> bool:
    """``value`` as a bool; a numpy bool is taken, 0, 1 and strings are not."""
    if not isinstance(value, bool | np.bool_):
        raise argument_error(name, "True or False", value, where)
    return bool(value)


def check_priority(value: Any, *, name: str = "priority", where: str | None = None) -> Priority:
    """``value`` as a :class:`~flowrt.types.Priority`: a member, its int value (0 HIGH, 1
    MEDIUM, 2 LOW) or its name in any case ("high", "HIGH", "normal")."""
    if type(value) is Priority:  # the common case, first: runs check their priority
        return value
    if isinstance(value, str):
        member = Priority.__members__.get(value.strip().upper())
        if member is not None:
            return member
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        try:
            return Priority(int(value))
        except ValueError:
            pass
    raise argument_error(
        name, "a flowrt.Priority (HIGH, MEDIUM or LOW), its value 0-2 or its name", value, where
    )


def check_choice(name: str, value: Any, choices: Iterable[str], *, where: str | None = None) -> str:
    """``value`` as one of ``choices`` (lower-case names), matched in any case."""
    names = list(choices)
    if isinstance(value, str) and value.lower() in names:
        return value.lower()
    raise argument_error(name, f"one of {', '.join(repr(c) for c in names)}", value, where)


def check_instance(
    name: str, value: Any, types: type | tuple[type, ...], expected: str, *, where: str | None = None
):
    """``value`` itself when it is an instance of ``types``; ``expected`` says what they are."""
    if not isinstance(value, types):
        raise argument_error(name, expected, value, where)
    return value


def check_path(name: str, value: Any, *, where: str | None = None) -> str:
    """``value`` (a str or an ``os.PathLike`` of one) as a str path."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str) or not path:
        raise argument_error(name, "a path (a non-empty str or os.PathLike)", value, where)
    return path


def check_paths(name: str, value: Any, *, where: str | None = None) -> list[str]:
    """``value`` (a path, or a list or tuple of paths) as a list of str paths."""
    if isinstance(value, str | os.PathLike):
        return [check_path(name, value, where=where)]
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise argument_error(name, "a path or a list of paths", value, where)
    return [check_path(f"{name}[{i}]", path, where=where) for i, path in enumerate(value)]


__all__ = [
    "argument_error",
    "check_bool",
    "check_choice",
    "check_instance",
    "check_int",
    "check_path",
    "check_paths",
    "check_priority",
    "check_seconds",
]
