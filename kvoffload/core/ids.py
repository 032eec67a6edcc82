"""Block id arrays of the load/store specs: checked once, kept as private read-only ``int64`` copies."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError, check_int

__all__ = ["INT64_MAX", "as_id_array"]

#: the largest block id a spec can hold (ids are ``int64``)
INT64_MAX = 2**63 - 1


def as_id_array(values: object, name: str) -> np.ndarray:
    """A private, read-only 1-D int64 copy of ``values``.

    Rejects non-sequences, bools, floats, negatives, values beyond int64 and >1-D input, naming
    the first offending item ``name[i]``.
    """
    if isinstance(values, np.ndarray):
        arr = values
        if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)):
            raise InvalidTypeError(f"{name} must hold integers, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise InvalidArgumentError(f"{name} must be 1-D, got shape {arr.shape}")
        if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > INT64_MAX:
            i = int(np.argmax(arr > INT64_MAX))
            raise InvalidArgumentError(f"{name}[{i}] must be <= 2**63 - 1, got {int(arr[i])}")
        arr = arr.astype(np.int64, copy=True)
    else:
        if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Iterable):
            raise InvalidTypeError(
                f"{name} must be a sequence of ints or a 1-D integer array, got {type(values).__name__} {values!r:.40}"
            )
        seq = list(values)
        if not all(type(v) is int for v in seq):  # slow path only to name the offending item
            seq = [check_int(v, f"{name}[{i}]") for i, v in enumerate(seq)]
        try:
            arr = np.array(seq, dtype=np.int64) if seq else np.zeros(0, dtype=np.int64)
        except OverflowError:
            i, v = next((i, v) for i, v in enumerate(seq) if not -INT64_MAX - 1 <= v <= INT64_MAX)
            if v < 0:
                raise InvalidArgumentError(f"{name}[{i}] must be non-negative, got {v}") from None
            raise InvalidArgumentError(f"{name}[{i}] must be <= 2**63 - 1, got {v}") from None
    if arr.size and int(arr.min()) < 0:
        i = int(np.argmax(arr < 0))
        raise InvalidArgumentError(f"{name}[{i}] must be non-negative, got {int(arr[i])}")
    arr.setflags(write=False)
    return arr
