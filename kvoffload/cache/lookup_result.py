"""Lookup answers: the four-valued result of vLLM's current manager contract, the per-key
lookup closure of :class:`~kvoffload.cache.manager.CPUOffloadingManager` and its code table.

kvoffload's :meth:`~kvoffload.core.base.OffloadingManager.lookup` answers ``True`` / ``False``
/ ``None`` (ready / absent / store in flight). vLLM's manager contract has a fourth answer,
``RETRY`` ("ask again later": e.g. a lower tier is still being searched). :class:`LookupResult`
carries all four; its values equal the ``LOOKUP_*`` codes of ``lookup_batch`` where they exist.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import numpy as np

from kvoffload.cache.stats import Counters
from kvoffload.core.base import (
    LOOKUP_HIT,
    LOOKUP_MISS,
    LOOKUP_PENDING,
    OffloadKey,
    ReqContext,
    check_req_context,
    validate_keys,
)

__all__ = ["LookupResult", "LOOKUP_RETRY", "LOOKUP_CODES", "as_lookup_result", "make_lookup"]

#: lookup code by slot class (0 absent, 1 unused, 2 pending, 3 ready)
LOOKUP_CODES = np.array([LOOKUP_MISS, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_HIT], dtype=np.int8)

#: Code for "look again later" (never produced by kvoffload's own CPU manager).
LOOKUP_RETRY = 3


class LookupResult(IntEnum):
    """MISS: absent. HIT: stored and ready. HIT_PENDING: stored, its store still in flight
    (the scheduler defers the request). RETRY: unknown yet, ask again next step."""

    MISS = LOOKUP_MISS
    HIT = LOOKUP_HIT
    HIT_PENDING = LOOKUP_PENDING
    RETRY = LOOKUP_RETRY


def as_lookup_result(value: bool | None) -> LookupResult:
    """Map a seed-API lookup answer (True / False / None) to a :class:`LookupResult`."""
    if value is None:
        return LookupResult.HIT_PENDING
    return LookupResult.HIT if value else LookupResult.MISS


def make_lookup(
    index: dict[bytes, int],
    ref: array,
    counters: Counters,
    answers: tuple[Any, Any, Any] = (True, False, None),
    context_cls: type = ReqContext,
) -> Callable[[OffloadKey, Any], Any]:
    """A per-instance ``lookup`` closure (same contract as :meth:`CPUOffloadingManager.lookup`):
    closure cells instead of attribute loads make a miss cost a ``dict.get`` plus one call.

    Args:
        answers: what it returns for a ready, an absent and a pending key (e.g. vLLM's
            ``LookupResult`` members for an engine adapter).
        context_cls: the context class taken without a check (others go through
            :func:`~kvoffload.core.base.check_req_context`).
    """
    get = index.get
    hit, miss, pending = answers

    def lookup(key: OffloadKey, req_context: Any) -> Any:
        if req_context.__class__ is not context_cls:
            check_req_context(req_context)
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

    return lookup
