"""Argument checks shared by the scheduler's entry points (all raise before any state changes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvoffload.checks import check_bool, check_int, id_list
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "check_count",
    "check_block_table",
    "check_block_ids",
    "check_block_hashes",
    "check_request",
    "check_request_id",
    "check_preempted",
    "check_finished",
    "check_scheduled",
    "parse_results",
]

#: what the scheduler reads from a request (duck-typed; ``kv_transfer_params`` is optional)
_REQUEST_ATTRS = ("request_id", "num_tokens", "block_hashes")


def check_count(value: object, name: str) -> int:
    """A non-negative int (bools rejected)."""
    return check_int(value, name, 0)


def check_block_ids(ids: object, name: str) -> list[int]:
    """A list copy of a sequence of non-negative int block ids (each at most ``2**63 - 1``)."""
    return id_list(ids, name)


def check_block_table(tables: object, num_groups: int, name: str) -> list[list[int]]:
    """Per-group lists of block ids, one per group."""
    if isinstance(tables, (str, bytes)) or not isinstance(tables, Sequence):
        raise InvalidTypeError(f"{name} must be a sequence of per-group block id sequences")
    if len(tables) != num_groups:
        raise InvalidArgumentError(f"{name} must have one entry per group ({num_groups}), got {len(tables)}")
    return [check_block_ids(t, f"{name}[{g}]") for g, t in enumerate(tables)]


def check_block_hashes(hashes: object, name: str, start: int = 0) -> None:
    """``hashes`` must be a sequence (a list, as engines keep it) of exactly-``bytes`` block hashes.

    Items from ``start`` on are checked, in one C-level pass (the scheduler passes the first
    index it has not turned into keys yet: hashes only grow). A ``str`` (its characters would be
    taken as hashes), a ``bytes`` and a numpy array are refused -- numpy's fixed-width bytes drop
    trailing NUL bytes, so ``numpy.bytes_`` items are refused too: the keys built from them would
    not be the engine's.
    """
    if isinstance(hashes, (str, bytes, bytearray, memoryview)) or not isinstance(hashes, Sequence):
        extra = ""
        if isinstance(hashes, np.ndarray):
            extra = " (a numpy array: numpy drops trailing NUL bytes of its bytes items; use a list of bytes)"
        raise InvalidTypeError(f"{name} must be a sequence of bytes block hashes, got {type(hashes).__name__}{extra}")
    tail = hashes[start:] if start else hashes
    if tail and set(map(type, tail)) != {bytes}:
        i, h = next((i, h) for i, h in enumerate(hashes) if i >= start and h.__class__ is not bytes)
        extra = " (numpy drops trailing NUL bytes: use plain bytes)" if isinstance(h, np.bytes_) else ""
        raise InvalidTypeError(f"{name}[{i}] must be exactly bytes, got {type(h).__name__} {h!r:.40}{extra}")


def check_request_id(request: object, name: str) -> str:
    """``request.request_id``, which must exist and be a str."""
    try:
        rid = request.request_id  # type: ignore[attr-defined]
    except AttributeError:
        raise InvalidTypeError(
            f"{name} must be a request (an object with request_id, block_hashes, num_tokens), "
            f"got {type(request).__name__} without a request_id"
        ) from None
    if not isinstance(rid, str):
        raise InvalidTypeError(f"{name}.request_id must be a str, got {type(rid).__name__} {rid!r}")
    return rid


def keyed_hashes(st: Any, config: OffloadingSchedulerConfig) -> int:
    """How many of a running request's block hashes the scheduler has turned into keys in every
    group (its hashes only grow while it runs: a store never reads those again)."""
    tokens = -1
    for gs, g in zip(st.groups, config.groups, strict=True):
        t = len(gs.keys) * g.offloaded_block_size
        if tokens < 0 or t < tokens:
            tokens = t
    return tokens // config.effective_hash_block_size


def _hashes_ok(hashes: object, start: int) -> bool:
    """The common case of :func:`check_block_hashes` (a list of bytes), without building a message."""
    if hashes.__class__ is not list:
        return False
    tail = hashes[start:]  # type: ignore[index]
    return not tail or set(map(type, tail)) == {bytes}


def check_request(request: object, name: str) -> int:
    """Check what the scheduler reads from a request; return its ``num_tokens``.

    A request needs ``request_id`` (str), ``num_tokens`` (int >= 0) and ``block_hashes`` (see
    :func:`check_block_hashes`; all of them: a re-admitted request's keys follow its current
    hashes); a missing one is an :class:`InvalidTypeError` naming it.
    """
    for attr in _REQUEST_ATTRS:
        if not hasattr(request, attr):
            raise InvalidTypeError(
                f"{name} has no attribute {attr!r}: a request needs {', '.join(_REQUEST_ATTRS)} "
                f"(got {type(request).__name__})"
            )
    check_request_id(request, name)
    num_tokens = check_count(request.num_tokens, f"{name}.num_tokens")  # type: ignore[attr-defined]
    hashes = request.block_hashes  # type: ignore[attr-defined]
    if not _hashes_ok(hashes, 0):
        check_block_hashes(hashes, f"{name}.block_hashes")
    return num_tokens


def check_preempted(preempted_req_ids: object, states: Mapping[str, Any]) -> list[str]:
    """The preempted request ids as a list: an iterable of ids (not a bare str) of known requests."""
    name = "preempted_req_ids"
    if isinstance(preempted_req_ids, (str, bytes)) or not isinstance(preempted_req_ids, Iterable):
        raise InvalidTypeError(
            f"{name} must be an iterable of request id strs, not a single {type(preempted_req_ids).__name__} "
            f"{preempted_req_ids!r:.40}"
        )
    out = list(preempted_req_ids)
    for i, rid in enumerate(out):
        if not isinstance(rid, str):
            raise InvalidTypeError(f"{name}[{i}] must be a str request id, got {type(rid).__name__} {rid!r}")
        if rid not in states:
            raise InvalidArgumentError(
                f"{name}[{i}]: request {rid!r} is not known to the scheduler (never scheduled, or already finished)"
            )
    return out


def check_finished(request: object) -> str:
    """The id of a finished request: a request object (with a str ``request_id``) or its id str.

    Whether the scheduler knows the request is not checked here: an engine finishes requests
    the scheduler never tracked (aborted while waiting) and may finish one twice.
    """
    return request if isinstance(request, str) else check_request_id(request, "request")


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
        out.append((check_int(jid, f"results[{i}].job_id"), check_bool(ok, f"results[{i}].success")))
    return out


def check_scheduled(
    new_requests: Sequence[Any],
    running_requests: Sequence[Any],
    config: OffloadingSchedulerConfig,
    states: Mapping[str, Any],
) -> tuple[list[tuple[Any, list[list[int]], int]], list[tuple[Any, Any, int, list[list[int]] | None]]]:
    """Validate the requests of one ``build_step`` call (nothing is changed).

    Returns ``[(new request, per-group block ids, tokens after the step)]`` and
    ``[(running request, its state, tokens after the step, appended block ids or None)]`` -- the
    latter only for running requests that append blocks or may store (the others need nothing).
    A running request must be known (scheduled as new before); every group's table must cover
    the tokens computed by the end of the step; a request whose load job is still pending or in
    flight must not compute; a request that may store has valid ``block_hashes``.
    """
    from kvoffload.engine.scheduler.jobs import ScheduledRequest

    groups = config.groups
    num_groups = len(groups)
    new_checked: list[tuple[Any, list[list[int]], int]] = []
    for i, sr in enumerate(new_requests):
        where = f"new_requests[{i}]"
        if type(sr) is not ScheduledRequest:
            raise InvalidTypeError(f"{where} must be a ScheduledRequest, got {type(sr).__name__}")
        check_request(sr.request, f"{where}.request")
        tokens = _check_tokens(sr, where)
        blocks = check_block_table(sr.block_ids, num_groups, f"{where}.block_ids")
        for g, gcfg in enumerate(groups):
            _check_cover(len(blocks[g]), gcfg.gpu_block_size, tokens, where, g)
        _check_not_loading(states.get(sr.request.request_id), sr, where)
        new_checked.append((sr, blocks, tokens))
    run_checked: list[tuple[Any, Any, int, list[list[int]] | None]] = []
    for i, sr in enumerate(running_requests):
        if type(sr) is not ScheduledRequest:
            raise InvalidTypeError(f"running_requests[{i}] must be a ScheduledRequest, got {type(sr).__name__}")
        c, n = sr.num_computed_tokens, sr.num_scheduled_tokens
        req = sr.request
        try:
            if type(c) is int and type(n) is int and c >= 0 and n >= 0 and c + n <= req.num_tokens:
                tokens = c + n
            else:
                tokens = _check_tokens(sr, f"running_requests[{i}]")
            st = states.get(req.request_id)
        except (AttributeError, TypeError):  # not a request: name what is wrong
            check_request(req, f"running_requests[{i}].request")
            raise
        if st is None:
            raise InvalidArgumentError(
                f"running_requests[{i}]: request {req.request_id!r} is not running (schedule it as new first)"
            )
        if st.load_job_id is not None:
            _check_not_loading(st, sr, f"running_requests[{i}]")
        bl = sr.block_ids
        appended: list[list[int]] | None = None
        if bl and any(bl):
            where = f"running_requests[{i}]"
            appended = check_block_table(bl, num_groups, f"{where}.block_ids")
            for g, gcfg in enumerate(groups):
                _check_cover(len(st.groups[g].block_ids) + len(appended[g]), gcfg.gpu_block_size, tokens, where, g)
        elif tokens > st.capacity_tokens:
            for g, gcfg in enumerate(groups):
                _check_cover(len(st.groups[g].block_ids), gcfg.gpu_block_size, tokens, f"running_requests[{i}]", g)
        elif tokens < st.next_store_tokens:
            continue  # nothing to record, nothing to store: the common decode step
        if tokens >= st.next_store_tokens:  # a store may read the hashes appended since the last one
            start = keyed_hashes(st, config)
            if not _hashes_ok(st.request.block_hashes, start):
                check_block_hashes(st.request.block_hashes, f"running_requests[{i}].request.block_hashes", start)
        run_checked.append((sr, st, tokens, appended))
    return new_checked, run_checked


def _check_not_loading(st: Any, sr: Any, where: str) -> None:
    """A request must not compute while its own load job is pending or in flight (the load writes
    the GPU blocks the compute reads)."""
    if st is not None and st.load_job_id is not None and sr.num_scheduled_tokens:
        raise InvalidArgumentError(
            f"{where}: request {st.req_id!r} has its load job {st.load_job_id} pending or in flight; it must not "
            "compute before that job completes (complete_jobs)"
        )


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
