"""Argument checks shared by the scheduler's entry points (all raise before any state changes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["check_count", "check_block_table", "check_block_ids", "parse_results"]


def check_count(value: object, name: str) -> int:
    """A non-negative int (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if v < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {v}")
    return v


def check_block_ids(ids: object, name: str) -> list[int]:
    """A list copy of a sequence of non-negative int block ids."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidTypeError(f"{name} must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        out = ids.tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidTypeError(f"{name} must be a sequence of ints, got {type(ids).__name__}")
    else:
        out = list(ids)
        for i, b in enumerate(out):
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
                raise InvalidTypeError(f"{name}[{i}] must be an int, got {type(b).__name__} {b!r}")
        out = [int(b) for b in out]
    if out and min(out) < 0:
        raise InvalidArgumentError(f"{name} must hold non-negative block ids, got {min(out)}")
    return out


def check_block_table(tables: object, num_groups: int, name: str) -> list[list[int]]:
    """Per-group lists of block ids, one per group."""
    if isinstance(tables, (str, bytes)) or not isinstance(tables, Sequence):
        raise InvalidTypeError(f"{name} must be a sequence of per-group block id sequences")
    if len(tables) != num_groups:
        raise InvalidArgumentError(f"{name} must have one entry per group ({num_groups}), got {len(tables)}")
    return [check_block_ids(t, f"{name}[{g}]") for g, t in enumerate(tables)]


def parse_results(results: Iterable[Any]) -> list[tuple[int, bool]]:
    """``(job_id, success)`` pairs from worker results (objects with ``job_id``/``success`` or pairs)."""
    out = []
    for i, r in enumerate(results):
        if hasattr(r, "job_id"):
            jid, ok = r.job_id, r.success
        elif isinstance(r, tuple) and len(r) == 2:
            jid, ok = r
        else:
            raise InvalidTypeError(f"results[{i}] must have job_id/success or be a (job_id, success) pair, got {r!r}")
        if isinstance(jid, bool) or not isinstance(jid, (int, np.integer)):
            raise InvalidTypeError(f"results[{i}].job_id must be an int, got {type(jid).__name__}")
        if not isinstance(ok, (bool, np.bool_)):
            raise InvalidTypeError(f"results[{i}].success must be a bool, got {type(ok).__name__}")
        out.append((int(jid), bool(ok)))
    return out
