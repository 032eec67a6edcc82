"""Lookups of :class:`~kvoffload.cache.manager.CPUOffloadingManager`: its per-key closure and its
batch answers (:class:`~kvoffload.core.lookup_code.LookupCode` values)."""

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

__all__ = ["LOOKUP_CODES", "lookup_codes", "make_lookup"]

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
    """A ``lookup(key, req_context)`` closure (:meth:`CPUOffloadingManager.lookup`'s contract;
    closure cells make a miss cost a ``dict.get`` and one call) answering ``answers`` for a ready,
    an absent and a pending key; ``context_cls`` contexts pass unchecked; ``count``: called with
    each answered key and the request id (a reuse filter counting lookups), or None."""
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


def lookup_codes(
    table: SlotTable, counters: Counters | None, small: list[int] | None, r: Resolved | None
) -> np.ndarray:
    """``np.int8`` code per key from the keys' ``small`` slots (a few keys) or their resolved
    batch ``r``; counted in ``counters`` unless None."""
    if small is not None:
        ref = table.ref_buf
        codes = [LOOKUP_MISS if s < 0 else (LOOKUP_HIT if ref[s] >= 0 else LOOKUP_PENDING) for s in small]
        if counters is not None:
            hits, pend = codes.count(LOOKUP_HIT), codes.count(LOOKUP_PENDING)
            counters.hits += hits
            counters.pending_hits += pend
            counters.misses += len(codes) - hits - pend
        return np.array(codes, dtype=np.int8)
    assert r is not None
    if not r.keys:
        return np.zeros(0, dtype=np.int8)
    st = table.ref[r.slots] if table.num_blocks else np.zeros(len(r.slots), dtype=np.int32)
    np.minimum(st, 0, out=st)  # class: 3 ready, 2 pending (a present key is never FREE), 0 absent
    st += 3
    st[r.slots < 0] = 0
    if counters is not None:
        counts = np.bincount(st, minlength=4)
        counters.hits += int(counts[3])
        counters.pending_hits += int(counts[2])
        counters.misses += int(counts[0])
    return LOOKUP_CODES[st]  # type: ignore[no-any-return]
