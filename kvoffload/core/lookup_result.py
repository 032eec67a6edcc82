"""The lookup codes: one type, :class:`LookupResult`, and one conversion, :func:`lookup_code`.

kvoffload's :meth:`~kvoffload.core.base.OffloadingManager.lookup` answers ``True`` / ``False``
/ ``None`` (ready / absent / store in flight); ``lookup_batch`` answers one ``np.int8`` code per
key. The codes are the values of :class:`LookupResult` (``LOOKUP_MISS`` ... are the same values as
plain ints, for numpy arrays). vLLM's manager contract has a fourth answer, ``RETRY`` ("ask again
later": e.g. a lower tier is still being searched), which kvoffload's own CPU manager never gives.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["LookupResult", "LOOKUP_MISS", "LOOKUP_HIT", "LOOKUP_PENDING", "LOOKUP_RETRY", "lookup_code"]


class LookupResult(IntEnum):
    """MISS: absent. HIT: stored and ready. HIT_PENDING: stored, its store still in flight
    (the scheduler defers the request). RETRY: unknown yet, ask again next step."""

    MISS = 0
    HIT = 1
    HIT_PENDING = 2
    RETRY = 3


#: The codes of ``lookup_batch`` arrays (``np.int8``): :class:`LookupResult` values as plain ints.
LOOKUP_MISS = int(LookupResult.MISS)
LOOKUP_HIT = int(LookupResult.HIT)
LOOKUP_PENDING = int(LookupResult.HIT_PENDING)
#: Code for "look again later" (never produced by kvoffload's own CPU manager).
LOOKUP_RETRY = int(LookupResult.RETRY)


def lookup_code(answer: bool | None) -> LookupResult:
    """The code of a :meth:`~kvoffload.core.base.OffloadingManager.lookup` answer:
    ``True`` -> HIT, ``False`` -> MISS, ``None`` -> HIT_PENDING."""
    if answer is None:
        return LookupResult.HIT_PENDING
    return LookupResult.HIT if answer else LookupResult.MISS
