"""Loads from the host pool: the part of :class:`~kvoffload.cache.manager.CPUOffloadingManager`
that pins ready blocks (``prepare_load``) and unpins them (``complete_load``; a block unpinned to
zero is evictable again). Slots come resolved by the manager: a list (a few keys: scalar code) or
an ``int64`` array (numpy operations)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvoffload.cache.keytable import PENDING, SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.cache.stats import Counters
from kvoffload.core.base import CPULoadStoreSpec, OffloadKey
from kvoffload.errors import KeyStateError

__all__ = ["Loads"]


class Loads:
    """Pin and unpin steps over the manager's ``table``, ``policy`` and ``counters``."""

    def __init__(self, table: SlotTable, policy: CachePolicy, counters: Counters) -> None:
        self.table = table
        self.policy = policy
        self.counters = counters

    def _pinned(self, newly: int, n: int) -> None:
        t = self.table
        t.num_evictable -= newly
        t.num_pinned += newly
        self.counters.loads += n

    def prepare(self, keys: Sequence[OffloadKey], slots: list[int] | np.ndarray) -> CPULoadStoreSpec:
        """Pin the distinct ``keys`` (slots ``slots``); :class:`KeyStateError` if one is absent or
        pending (nothing pinned then)."""
        if slots.__class__ is list:
            ref = self.table.ref_buf
            if not slots or (min(slots) >= 0 and min(map(ref.__getitem__, slots)) >= 0):  # C-level passes
                newly = 0
                for s in slots:
                    r = ref[s]
                    newly += r == 0
                    ref[s] = r + 1
                self._pinned(newly, len(slots))
                return CPULoadStoreSpec(slots)
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
            self._pinned(int(np.count_nonzero(states == 0)), len(slots))
            self.table.ref[slots] = states + 1
        return CPULoadStoreSpec(slots)

    def complete(self, keys: Sequence[OffloadKey], slots: list[int] | np.ndarray, unique: bool) -> None:
        """Unpin ``keys`` once per occurrence (repeats allowed unless ``unique``);
        :class:`KeyStateError` if one is absent, pending or not pinned that often (nothing unpinned)."""
        t = self.table
        if slots.__class__ is list:
            ref = t.ref_buf
            if not slots:
                return
            if len(set(slots)) == len(slots) and min(slots) >= 0 and min(map(ref.__getitem__, slots)) >= 1:
                freed = []
                for s in slots:
                    r = ref[s] - 1
                    ref[s] = r
                    if r == 0:
                        freed.append(s)
                if freed:
                    self._pinned(-len(freed), 0)
                    self.policy.on_evictable(freed if self.policy.takes_lists else np.array(freed, dtype=np.int64))  # type: ignore[arg-type]
                return
            slots, unique = np.array(slots, dtype=np.int64), False  # repeats, or the array path names the bad key
        assert isinstance(slots, np.ndarray)
        if len(slots) == 0:
            return
        if int(slots.min()) < 0:
            i = int(np.argmax(slots < 0))  # type: ignore[operator]
            raise KeyStateError(f"complete_load: keys[{i}] {keys[i]!r} is not stored")
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
