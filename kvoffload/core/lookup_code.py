"""The lookup codes: one type, :class:`LookupCode`, for every answer to "is this key here?".

The manager's ``lookup_batch`` answers one ``np.int8`` code per key, a tier's ``lookup`` too, the
scheduler reads them, and the vLLM adapter converts them to vLLM's ``LookupResult`` in one place
(``kvoffload.integrations.vllm.manager.VLLM_LOOKUP``). ``LOOKUP_MISS`` ... are the same values as
plain ints, for numpy arrays and fast comparisons. kvoffload's per-key
:meth:`~kvoffload.core.base.OffloadingManager.lookup` answers ``True`` / ``False`` / ``None``
(ready / absent / pending): :func:`lookup_code` converts.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["LookupCode", "LOOKUP_MISS", "LOOKUP_HIT", "LOOKUP_PENDING", "LOOKUP_RETRY", "lookup_code"]


class LookupCode(IntEnum):
    """MISS: absent. HIT: stored and ready. PENDING: stored, its store (or its promotion from a
    tier) still in flight: the scheduler defers the request. RETRY: unknown yet (a tier's probe
    is outstanding), ask again next step."""

    MISS = 0
    HIT = 1
    PENDING = 2
    RETRY = 3


#: :class:`LookupCode` values as plain ints (``np.int8`` arrays hold them).
LOOKUP_MISS = int(LookupCode.MISS)
LOOKUP_HIT = int(LookupCode.HIT)
LOOKUP_PENDING = int(LookupCode.PENDING)
LOOKUP_RETRY = int(LookupCode.RETRY)


def lookup_code(answer: bool | None) -> LookupCode:
    """The code of a :meth:`~kvoffload.core.base.OffloadingManager.lookup` answer:
    ``True`` -> HIT, ``False`` -> MISS, ``None`` -> PENDING."""
    if answer is None:
        return LookupCode.PENDING
    return LookupCode.HIT if answer else LookupCode.MISS
