"""Argument checks shared by the scheduler's entry points (all raise before any state changes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError, check_int

__all__ = ["check_count", "check_block_table", "check_block_ids", "check_scheduled", "parse_results"]


def check_count(value: object, name: str) -> int:
    """A non-negative int (bools rejected)."""
    return check_int(value, name, 0)


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
) -> tuple[list[tuple[Any, list[list[int]], int]], list[tuple[Any, Any, int, list[list[int]] | None]]]:
    """Validate the requests of one ``build_step`` call (nothing is changed).

    Returns ``[(new request, per-group block ids, tokens after the step)]`` and
    ``[(running request, its state, tokens after the step, appended block ids or None)]`` -- the
    latter only for running requests that append blocks or may store (the others need nothing).
    A running request must be known (scheduled as new before); every group's table must cover
    the tokens computed by the end of the step.
    """
    from kvoffload.scheduler.jobs import ScheduledRequest

    num_groups = len(groups)
    new_checked = []
    for i, sr in enumerate(new_requests):
        where = f"new_requests[{i}]"
        if type(sr) is not ScheduledRequest:
            raise InvalidTypeError(f"{where} must be a ScheduledRequest, got {type(sr).__name__}")
        tokens = _check_tokens(sr, where)
        blocks = check_block_table(sr.block_ids, num_groups, f"{where}.block_ids")
        for g, gcfg in enumerate(groups):
            _check_cover(len(blocks[g]), gcfg.gpu_block_size, tokens, where, g)
        new_checked.append((sr, blocks, tokens))
    run_checked = []
    for i, sr in enumerate(running_requests):
        if type(sr) is not ScheduledRequest:
            raise InvalidTypeError(f"running_requests[{i}] must be a ScheduledRequest, got {type(sr).__name__}")
        c, n = sr.num_computed_tokens, sr.num_scheduled_tokens
        req = sr.request
        if type(c) is int and type(n) is int and c >= 0 and n >= 0 and c + n <= req.num_tokens:
            tokens = c + n
        else:
            tokens = _check_tokens(sr, f"running_requests[{i}]")
        st = states.get(req.request_id)
        if st is None:
            raise InvalidArgumentError(
                f"running_requests[{i}]: request {req.request_id!r} is not running (schedule it as new first)"
            )
        bl = sr.block_ids
        blocks = None
        if bl and any(bl):
            blocks = check_block_table(bl, num_groups, f"running_requests[{i}].block_ids")
            for g, gcfg in enumerate(groups):
                _check_cover(
                    len(st.groups[g].block_ids) + len(blocks[g]),
                    gcfg.gpu_block_size,
                    tokens,
                    f"running_requests[{i}]",
                    g,
                )
        elif tokens > st.capacity_tokens:
            for g, gcfg in enumerate(groups):
                _check_cover(len(st.groups[g].block_ids), gcfg.gpu_block_size, tokens, f"running_requests[{i}]", g)
        elif tokens < st.next_store_tokens:
            continue  # nothing to record, nothing to store: the common decode step
        run_checked.append((sr, st, tokens, blocks))
    return new_checked, run_checked


def _check_tokens(sr: Any, where: str) -> int:
    n_comp = check_count(sr.num_computed_tokens, f"{where}.num_computed_tokens")
    tokens = n_comp + check_count(sr.num_scheduled_tokens, f"{where}.num_scheduled_tokens")
    if tokens > sr.request.num_tokens:
        raise InvalidArgumentError(
            f"{where}: computed + scheduled tokens ({tokens}) exceed num_tokens ({sr.request.num_tokens})"
        )
    return tokens


def _check_cover(have: int, block_size: int, tokens: int, where: str, g: int) -> None:
    if have * block_size < tokens:
        raise InvalidArgumentError(
            f"{where}: group {g} has {have} GPU blocks, {tokens} tokens need {-(-tokens // block_size)}"
        )
