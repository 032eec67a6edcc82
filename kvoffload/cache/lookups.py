"""Lookups of :class:`~kvoffload.cache.manager.CPUOffloadingManager`: its per-key closure and its
batch codes (:class:`~kvoffload.core.lookup_code.LookupCode` values)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from kvoffload.cache.batch import Resolved
from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.stats import Counters
from kvoffload.core.base import OffloadKey, ReqContext, check_req_context, validate_keys
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING

__all__ = ["LOOKUP_CODES", "lookup_codes", "make_lookup", "slot_classes", "small_codes"]

#: lookup code by slot class (0 absent, 1 unused, 2 pending, 3 ready)
LOOKUP_CODES = np.array([LOOKUP_MISS, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_HIT], dtype=np.int8)


def make_lookup(
    index: dict[bytes, int],
    ref: array,
    counters: Counters,
    answers: tuple[Any, Any, Any] = (True, False, None),
    context_cls: type = ReqContext,
    count: Callable[[tuple[OffloadKey], str], None] | None = None,
) -> Callable[[OffloadKey, Any], Any]:
    """A per-instance ``lookup`` closure (same contract as :meth:`CPUOffloadingManager.lookup`):
    closure cells instead of attribute loads make a miss cost a ``dict.get`` plus one call.

    Args:
        answers: what it returns for a ready, an absent and a pending key (e.g. vLLM's
            ``LookupResult`` members for an engine adapter).
        context_cls: the context class taken without a check (others go through
            :func:`~kvoffload.core.base.check_req_context`).
        count: called with each (checked) key and the request id once answered (a reuse filter
            counting lookups), or None.
    """
    get = index.get
    hit, miss, pending = answers

    def lookup(key: OffloadKey, req_context: Any) -> Any:
        if req_context.__class__ is not context_cls:
            check_req_context(req_context)
        if count is not None:
            if key.__class__ is not bytes:
                validate_keys([key], "key")
            out = counted(key, req_context)  # type: ignore[misc]
            count((key,), req_context.req_id)
            return out
        try:
            s = get(key)
        except TypeError:  # unhashable
            validate_keys([key], "key")
            raise
        if s is None:
            if key.__class__ is not bytes:
                validate_keys([key], "key")
            counters.misses += 1
            return miss
        if ref[s] >= 0:
            counters.hits += 1
            return hit
        counters.pending_hits += 1
        return pending

    counted = make_lookup(index, ref, counters, answers, context_cls) if count is not None else None
    return lookup


def small_codes(ref: array, slots: list[int]) -> list[int]:
    """Lookup code per slot of a few keys (``-1``: absent), from the table's ref counts ``ref``."""
    return [LOOKUP_MISS if s < 0 else (LOOKUP_HIT if ref[s] >= 0 else LOOKUP_PENDING) for s in slots]


def slot_classes(ref: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Per slot (``-1``: absent key), its class: 0 absent, 2 pending, 3 ready (a new array);
    ``ref``: the table's ref counts (``PENDING`` < 0 for a store in flight)."""
    st = ref[slots] if len(ref) else np.zeros(len(slots), dtype=np.int32)
    np.minimum(st, 0, out=st)
    st += 3
    st[slots < 0] = 0
    return st


def lookup_codes(
    table: SlotTable, counters: Counters | None, small: list[int] | None, r: Resolved | None
) -> np.ndarray:
    """``np.int8`` lookup code per key, from the keys' ``small`` slots (a few keys) or their
    resolved batch ``r``; counted in ``counters`` unless None."""
    if small is not None:
        codes = small_codes(table.ref_buf, small)
        if counters is not None:
            hits, pend = codes.count(LOOKUP_HIT), codes.count(LOOKUP_PENDING)
            counters.hits += hits
            counters.pending_hits += pend
            counters.misses += len(codes) - hits - pend
        return np.array(codes, dtype=np.int8)
    assert r is not None
    if not r.keys:
        return np.zeros(0, dtype=np.int8)
    st = slot_classes(table.ref, r.slots)  # FREE never occurs for a present key
    if counters is not None:
        counts = np.bincount(st, minlength=4)
        counters.hits += int(counts[3])
        counters.pending_hits += int(counts[2])
        counters.misses += int(counts[0])
    return LOOKUP_CODES[st]  # type: ignore[no-any-return]
