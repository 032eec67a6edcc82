"""Argument checks shared by the tiers: typed errors naming the argument, before any state change."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "MAX_KEY_BYTES",
    "check_records",
    "check_keys",
    "check_slots",
    "check_tier_options",
    "tier_options_from_query",
    "redact_query",
]

#: Longest key a tier accepts (a block hash plus a group index is ~36 bytes).
MAX_KEY_BYTES = 1024


def check_records(records: object) -> np.ndarray:
    """``records`` as a writable C-contiguous 2-D ``np.uint8`` view (never a copy)."""
    if isinstance(records, memoryview):
        if records.readonly:
            raise InvalidArgumentError("records must be writable, got a read-only memoryview")
        records = np.asarray(records)
    if not isinstance(records, np.ndarray):
        raise InvalidTypeError(f"records must be a numpy uint8 array or memoryview, got {type(records).__name__}")
    if records.dtype != np.uint8 or records.ndim != 2:
        raise InvalidArgumentError(
            f"records must have dtype uint8 and shape (num_slots, record_bytes), got {records.dtype} {records.shape}"
        )
    if records.shape[0] < 1 or records.shape[1] < 1:
        raise InvalidArgumentError(f"records must have at least one slot of at least one byte, got {records.shape}")
    if not records.flags.c_contiguous or not records.flags.writeable:
        raise InvalidArgumentError("records must be C-contiguous and writable")
    return records


def check_keys(keys: Sequence[bytes], name: str) -> list[bytes]:
    """``keys`` as a list of non-empty ``bytes`` of at most :data:`MAX_KEY_BYTES`."""
    if isinstance(keys, (bytes, str)) or not isinstance(keys, Sequence):
        raise InvalidTypeError(f"{name} must be a sequence of bytes, got {type(keys).__name__}")
    out = list(keys)
    for i, k in enumerate(out):
        if k.__class__ is not bytes:
            raise InvalidTypeError(f"{name}[{i}] must be bytes, got {type(k).__name__}")
        if not 0 < len(k) <= MAX_KEY_BYTES:
            raise InvalidArgumentError(f"{name}[{i}] must be 1..{MAX_KEY_BYTES} bytes long, got {len(k)}")
    return out


def check_slots(slots: Sequence[int] | np.ndarray, name: str, n: int, num_slots: int) -> np.ndarray:
    """``slots`` as an int64 array of ``n`` slot indices in ``[0, num_slots)``."""
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidTypeError(f"{name} must be a 1-D sequence of ints, got {arr.dtype} shape {arr.shape}")
    if arr.size != n:
        raise InvalidArgumentError(f"{name} must have one slot per key ({n}), got {arr.size}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= num_slots):
        raise InvalidArgumentError(f"{name} must be in [0, {num_slots}), got min {arr.min()} max {arr.max()}")
    return arr


def check_tier_options(
    io_threads: int,
    batch_keys: int,
    max_pending_write_bytes: int,
    lookup_ttl_steps: int,
    backoff_initial: float,
    backoff_max: float,
    probe_wait: float,
    defer_hit_rate: float,
) -> None:
    """The generic tier options (see :class:`kvoffload.tiers.Tier`)."""
    check_int(io_threads, "io_threads", 1)
    check_int(batch_keys, "batch_keys", 1)
    check_int(max_pending_write_bytes, "max_pending_write_bytes", 0)
    check_int(lookup_ttl_steps, "lookup_ttl_steps", 1)
    for name, v in (("backoff_initial", backoff_initial), ("backoff_max", backoff_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidTypeError(f"{name} must be a number of seconds, got {type(v).__name__}")
        if not v > 0:
            raise InvalidArgumentError(f"{name} must be > 0 seconds, got {v}")
    if backoff_max < backoff_initial:
        raise InvalidArgumentError(f"backoff_max ({backoff_max}) must be >= backoff_initial ({backoff_initial})")
    for name, v, unit in (("probe_wait", probe_wait, " seconds"), ("defer_hit_rate", defer_hit_rate, "")):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidTypeError(f"{name} must be a number{unit and ' of' + unit}, got {type(v).__name__}")
        if not 0 <= v <= 1:
            raise InvalidArgumentError(f"{name} must be in [0, 1]{unit}, got {v}")


def redact_query(spec: str) -> str:
    """``spec`` with the values of its ``password=`` and ``integrity_key=`` options masked."""
    return re.sub(r"((?:password|integrity_key)=)[^&]*", r"\1***", spec)


_QUERY_INTS = ("io_threads", "batch_keys", "max_pending_write_bytes", "lookup_ttl_steps")
_QUERY_FLOATS = ("backoff_initial", "backoff_max", "probe_wait", "defer_hit_rate")


def tier_options_from_query(spec: str, pairs: list[tuple[str, str]]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The options of every tier (:class:`~kvoffload.tiers.Tier`) found in a tier spec's query
    ``pairs``, converted, and the pairs left for the backend.

    ``integrity_key`` may repeat (the first signs, all are accepted); ``integrity_key_file``
    names a file of keys, one per line (the first signs), read now.
    """
    spec = redact_query(spec)  # errors never show secrets
    opts: dict[str, Any] = {}
    keys: list[str] = []
    rest = []
    for k, v in pairs:
        if k in _QUERY_INTS:
            if not v.isdigit():
                raise InvalidArgumentError(f"tier spec {spec!r}: {k} must be a non-negative integer, got {v!r}")
            opts[k] = int(v)
        elif k in _QUERY_FLOATS:
            try:
                opts[k] = float(v)
            except ValueError:
                raise InvalidArgumentError(f"tier spec {spec!r}: {k} must be a number, got {v!r}") from None
        elif k == "name":
            opts[k] = v
        elif k == "integrity_key":
            keys.append(v)
        elif k == "integrity_key_file":
            try:
                lines = Path(v).read_text().splitlines()
            except OSError as exc:
                raise InvalidArgumentError(f"integrity_key_file {v!r} cannot be read: {exc}") from None
            keys.extend(line.strip() for line in lines if line.strip())
        else:
            rest.append((k, v))
    if keys:
        opts["integrity_key"] = keys
    return opts, rest
