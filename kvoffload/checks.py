"""Argument checks shared by every subpackage: ints, bools and id arrays.

Each check returns the value in its canonical form (a Python ``int``/``bool``, an ``int64``
array, a list of ints) or raises a typed error from :mod:`kvoffload.errors` naming the argument
(``name``, or ``name[i]`` for the first offending item) and what was expected. The same fault
gets the same message whichever part of the package checks it.

This module imports only :mod:`kvoffload.errors` and numpy (no torch), so the scheduler side,
the cache side and the transfer side can all use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["INT64_MAX", "check_int", "check_bool", "check_int_array", "id_array", "id_list"]

#: the largest id an ``int64`` id array can hold
INT64_MAX = 2**63 - 1


def check_int(value: object, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python int, or a typed error naming ``name``.

    Accepts ``int`` and numpy integers; rejects ``bool`` (``True`` is not 1 here), floats and
    strings with :class:`InvalidTypeError`, and values below ``minimum`` with
    :class:`InvalidArgumentError`.
    """
    if type(value) is int:  # the common case, ~10x cheaper than the ABC check below
        v = value
    elif isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    else:
        v = int(value)
    if minimum is not None and v < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_bool(value: object, name: str) -> bool:
    """``value`` as a Python bool (``bool`` or ``numpy.bool_``); anything else, ``0``/``1``
    included, is an :class:`InvalidTypeError` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_int_array(values: object, name: str) -> np.ndarray:
    """``values`` (a sequence of ints or an integer array) as a 1-D ``int64`` array, no copy
    when it already is one; negative values are kept (callers check their own ranges).

    Rejects non-sequences, strings, bools, floats, >1-D input and values beyond ``int64``,
    naming the first offending item ``name[i]``.
    """
    if isinstance(values, np.ndarray):
        arr = values
        if arr.dtype == np.int64 and arr.ndim == 1:  # the common case, no dtype walk
            return arr
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidTypeError(f"{name} must hold integers, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise InvalidArgumentError(f"{name} must be 1-D, got shape {arr.shape}")
        if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > INT64_MAX:
            i = int(np.argmax(arr > INT64_MAX))
            raise InvalidArgumentError(f"{name}[{i}] must be <= 2**63 - 1, got {int(arr[i])}")
        return arr.astype(np.int64, copy=False)
    if values.__class__ is not list and (
        isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Iterable)
    ):
        raise InvalidTypeError(
            f"{name} must be a sequence of ints or a 1-D integer array, got {type(values).__name__} {values!r:.40}"
        )
    seq = list(values)
    if seq and set(map(type, seq)) != {int}:  # slow path only to name the offending item
        seq = [check_int(v, f"{name}[{i}]") for i, v in enumerate(seq)]
    try:
        return np.array(seq, dtype=np.int64) if seq else np.zeros(0, dtype=np.int64)
    except OverflowError:
        i, v = next((i, v) for i, v in enumerate(seq) if not -INT64_MAX - 1 <= v <= INT64_MAX)
        if v < 0:
            raise InvalidArgumentError(f"{name}[{i}] must be non-negative, got {v}") from None
        raise InvalidArgumentError(f"{name}[{i}] must be <= 2**63 - 1, got {v}") from None


def _check_non_negative(arr: np.ndarray, name: str) -> None:
    if arr.size and int(arr.min()) < 0:
        i = int(np.argmax(arr < 0))
        raise InvalidArgumentError(f"{name}[{i}] must be non-negative, got {int(arr[i])}")


def id_array(values: object, name: str) -> np.ndarray:
    """A private, read-only 1-D ``int64`` copy of ``values`` (:func:`check_int_array`'s rules;
    the ids' ranges, negatives included, are checked by whoever uses them)."""
    arr = check_int_array(values, name)
    if arr is values or arr.base is values:
        arr = arr.copy()
    arr.setflags(write=False)
    return arr


def id_list(values: object, name: str) -> list[int]:
    """``values`` as a new list of Python ints, every id ``>= 0`` (:func:`check_int_array`'s rules)."""
    if type(values) is list and all(type(v) is int and v >= 0 for v in values):
        if not values or max(values) <= INT64_MAX:
            return list(values)
    arr = check_int_array(values, name)
    _check_non_negative(arr, name)
    out: list[int] = arr.tolist()
    return out
