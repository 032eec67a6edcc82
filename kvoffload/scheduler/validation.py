"""Argument checks shared by the scheduler's entry points (all raise before any state changes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["check_count", "check_block_table", "check_block_ids", "check_scheduled", "parse_results"]


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


def check_scheduled(
    new_requests: Sequence[Any], running_requests: Sequence[Any], groups: Sequence[Any], states: Mapping[str, Any]
) -> list[tuple[Any, bool, list[list[int]], int]]:
    """Validate the requests of one ``build_step`` call.

    Returns ``(scheduled_request, is_new, per-group block id lists, tokens after the step)``.
    A running request must be known (scheduled as new before); every group's table must cover
    the tokens computed by the end of the step.
    """
    from kvoffload.scheduler.jobs import ScheduledRequest

    num_groups = len(groups)
    checked = []
    for is_new, items in ((True, new_requests), (False, running_requests)):
        for i, sr in enumerate(items):
            where = f"{'new' if is_new else 'running'}_requests[{i}]"
            if not isinstance(sr, ScheduledRequest):
                raise InvalidTypeError(f"{where} must be a ScheduledRequest, got {type(sr).__name__}")
            n_comp = check_count(sr.num_computed_tokens, f"{where}.num_computed_tokens")
            tokens = n_comp + check_count(sr.num_scheduled_tokens, f"{where}.num_scheduled_tokens")
            if tokens > sr.request.num_tokens:
                raise InvalidArgumentError(
                    f"{where}: computed + scheduled tokens ({tokens}) exceed num_tokens ({sr.request.num_tokens})"
                )
            if is_new or len(sr.block_ids):
                blocks = check_block_table(sr.block_ids, num_groups, f"{where}.block_ids")
            else:
                blocks = [[] for _ in range(num_groups)]
            st = None
            if not is_new:
                st = states.get(sr.request.request_id)
                if st is None:
                    raise InvalidArgumentError(
                        f"{where}: request {sr.request.request_id!r} is not running (schedule it as new first)"
                    )
            for g, gcfg in enumerate(groups):
                have = len(blocks[g]) + (len(st.groups[g].block_ids) if st is not None else 0)
                if have * gcfg.gpu_block_size < tokens:
                    raise InvalidArgumentError(
                        f"{where}: group {g} has {have} GPU blocks, {tokens} tokens need "
                        f"{-(-tokens // gcfg.gpu_block_size)}"
                    )
            checked.append((sr, is_new, blocks, tokens))
    return checked
