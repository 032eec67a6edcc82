"""The four-valued lookup result of vLLM's current manager contract.

kvoffload's :meth:`~kvoffload.core.base.OffloadingManager.lookup` answers ``True`` / ``False``
/ ``None`` (ready / absent / store in flight). vLLM's manager contract has a fourth answer,
``RETRY`` ("ask again later": e.g. a lower tier is still being searched). :class:`LookupResult`
carries all four; its values equal the ``LOOKUP_*`` codes of ``lookup_batch`` where they exist.
"""

from __future__ import annotations

from enum import IntEnum

from kvoffload.core.base import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING

__all__ = ["LookupResult", "LOOKUP_RETRY", "as_lookup_result"]

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
