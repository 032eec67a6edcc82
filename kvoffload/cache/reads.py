"""The manager's lookups (a per-key closure; batch answers as ``LookupCode`` values) and loads (pin
ready blocks, unpin them), on slots the manager resolved: a list (a few keys) or an ``int64`` array
(unpinning a few keys resolves them itself, in the same pass)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from itertools import islice
from typing import Any

import numpy as np

from kvoffload.cache.keytable import PENDING, SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.cache.stats import OffloadingStats
from kvoffload.core.base import OffloadKey, ReqContext, check_req_context, validate_keys
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.errors import KeyStateError

__all__ = ["LOOKUP_CODES", "Loads", "lookup_codes", "make_lookup"]

#: lookup code by slot class (0 absent, 1 unused, 2 pending, 3 ready)
LOOKUP_CODES = np.array([LOOKUP_MISS, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_HIT], dtype=np.int8)


def make_lookup(
    table: SlotTable,
    counters: OffloadingStats,
    answers: tuple[Any, Any, Any] = (True, False, None),
    context_cls: type = ReqContext,
    count: Callable[[tuple[OffloadKey], str], None] | None = None,
) -> Callable[[OffloadKey, Any], Any]:
    """A ``lookup(key, req_context)`` closure over ``table`` answering ``answers`` for a ready, an absent
    and a pending key; ``context_cls`` contexts pass unchecked; ``count``: called with each answered
    key and the request id (a reuse filter counting lookups), or None."""
    get, ref = table.index.get, table.ref_buf
    hit, miss, pending = answers

    def lookup(key: OffloadKey, req_context: Any) -> Any:
        if req_context.__class__ is not context_cls:
            check_req_context(req_context)
        try:
            s = get(key)
        except TypeError:  # unhashable: not a key
            s = None
        if s is None or count is not None:
            if key.__class__ is not bytes:
                validate_keys([key], "key")  # raises
            if count is not None:
                count((key,), req_context.req_id)
            if s is None:
                counters.misses += 1
                return miss
        if ref[s] >= 0:
            counters.hits += 1
            return hit
        counters.pending_hits += 1
        return pending

    return lookup


def lookup_codes(table: SlotTable, counters: OffloadingStats | None, slots: list[int] | np.ndarray) -> np.ndarray:
    """``np.int8`` code per key of ``slots`` (-1 = absent; a list: scalar code), counted in
    ``counters`` unless None."""
    if slots.__class__ is list:
        ref = table.ref_buf
        codes = [LOOKUP_MISS if s < 0 else (LOOKUP_HIT if ref[s] >= 0 else LOOKUP_PENDING) for s in slots]
        if counters is not None:
            hits, pend = codes.count(LOOKUP_HIT), codes.count(LOOKUP_PENDING)
            counters.hits += hits
            counters.pending_hits += pend
            counters.misses += len(codes) - hits - pend
        return np.array(codes, dtype=np.int8)
    st = table.ref[slots] if table.num_blocks else np.zeros(len(slots), dtype=np.int32)
    np.minimum(st, 0, out=st)  # class: 3 ready, 2 pending (a present key is never FREE), 0 absent
    st += 3
    st[slots < 0] = 0  # type: ignore[operator]
    if counters is not None:
        counts = np.bincount(st, minlength=4)
        counters.hits += int(counts[3])
        counters.pending_hits += int(counts[2])
        counters.misses += int(counts[0])
    return LOOKUP_CODES[st]  # type: ignore[no-any-return]


class Loads:
    """Pin and unpin steps over the manager's ``table``, ``policy`` and ``counters``."""

    def __init__(self, table: SlotTable, policy: CachePolicy, counters: OffloadingStats) -> None:
        self.table = table
        self.policy = policy
        self.counters = counters
        self._lists = policy.takes_lists
        self._tells_pins = type(policy).on_pinned is not CachePolicy.on_pinned

    def _pinned(self, newly: int, n: int) -> None:
        t = self.table
        t.num_evictable -= newly
        t.num_pinned += newly
        self.counters.loads += n

    def prepare(self, keys: Sequence[OffloadKey], slots: list[int] | np.ndarray) -> list[int] | np.ndarray:
        """Pin the distinct ``keys`` (slots ``slots``) and return their slots (the list or array
        given); :class:`KeyStateError` if one is absent or pending (nothing pinned then)."""
        if slots.__class__ is list:
            ref = self.table.ref_buf
            newly = 0
            for s in slots:  # one pass (the keys are distinct); a bad key stops it and undoes it
                if s < 0:
                    break
                r = ref[s]
                if r < 0:
                    break
                newly += r == 0
                ref[s] = r + 1
            else:
                self._pinned(newly, len(slots))
                if newly and self._tells_pins:  # distinct keys: a slot at 1 was at 0
                    self.policy.on_pinned(np.array([s for s in slots if ref[s] == 1], dtype=np.int64))
                return slots
            for done in slots[: slots.index(s)]:
                ref[done] -= 1
            slots = np.array(slots, dtype=np.int64)  # the array path names the bad key
        assert isinstance(slots, np.ndarray)
        if len(slots):
            if int(slots.min()) < 0:
                i = int(np.argmax(slots < 0))  # type: ignore[operator]
                raise KeyStateError(f"prepare_load: keys[{i}] {keys[i]!r} is not stored")
            states = self.table.ref[slots]
            if int(states.min()) < 0:
                i = int(np.argmax(states < 0))
                raise KeyStateError(f"prepare_load: keys[{i}] {keys[i]!r} is not ready (its store is in flight)")
            newly = states == 0
            self._pinned(int(np.count_nonzero(newly)), len(slots))
            self.table.ref[slots] = states + 1
            if self._tells_pins and newly.any():
                self.policy.on_pinned(slots[newly])
        return slots

    def complete(self, keys: Collection[OffloadKey], slots: np.ndarray | None, unique: bool) -> bool:
        """Unpin ``keys`` once per occurrence (repeats allowed unless ``unique``); ``slots``: their
        ``int64`` slots, or None for a few keys (a list or set) resolved here, in the same pass.
        With ``slots``: :class:`KeyStateError` if one is absent, pending or not pinned that often
        (nothing unpinned). Without: False, nothing changed, if one is not a key pinned that often
        (the caller resolves them and calls again, which names it)."""
        t = self.table
        if slots is None:
            get, ref, freed = t.index.get, t.ref_buf, []
            try:
                for i, k in enumerate(keys):  # noqa: B007 - i: where a bad key stops it (undone)
                    s = get(k)
                    if s is None:
                        break
                    r = ref[s]
                    if r < 1:
                        break
                    ref[s] = r - 1
                    if r == 1:
                        freed.append(s)
                else:
                    if freed:
                        self._pinned(-len(freed), 0)
                        self.policy.on_evictable(freed if self._lists else np.array(freed, dtype=np.int64))  # type: ignore[arg-type]
                    return True
            except TypeError:  # an unhashable item: not a key
                pass
            for k in islice(keys, i):
                ref[t.index[k]] += 1
            return False
        if len(slots) == 0:
            return True
        if int(slots.min()) < 0:
            i = int(np.argmax(slots < 0))
            raise KeyStateError(f"complete_load: keys[{i}] {keys[i]!r} is not stored")  # type: ignore[index]
        uniq, cnt = (slots, None) if unique else np.unique(slots, return_counts=True)
        states = t.ref[uniq]
        bad = states < (1 if cnt is None else cnt)
        if bad.any():
            j = int(np.argmax(bad))
            what = "pending" if states[j] == PENDING else f"pinned {int(states[j])} time(s)"
            c = 1 if cnt is None else int(cnt[j])
            raise KeyStateError(f"complete_load: key {t.keys[int(uniq[j])]!r} is {what}, cannot unpin it {c} time(s)")
        states -= 1 if cnt is None else cnt.astype(np.int32)
        t.ref[uniq] = states
        freed_a = uniq[states == 0]  # type: ignore[index]
        if len(freed_a):
            self._pinned(-len(freed_a), 0)
            self.policy.on_evictable(freed_a)
        return True
