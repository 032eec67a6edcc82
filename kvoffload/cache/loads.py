"""Loads from the host pool: the pin/unpin side of the CPU offloading manager.

:class:`Loads` is the part of :class:`~kvoffload.cache.manager.CPUOffloadingManager` that runs
``prepare_load`` (pin ready blocks, return their slots) and ``complete_load`` (unpin them; a
block unpinned to zero becomes evictable again for the cache policy), each one method whose
slots are a list (a few keys: scalar code) or an ``int64`` array (numpy operations). The manager
checks the arguments and resolves the keys first; this class shares its table, policy and counters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from kvoffload.cache.keytable import PENDING, SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.cache.stats import Counters
from kvoffload.core.base import CPULoadStoreSpec, OffloadKey
from kvoffload.errors import KeyStateError

logger = logging.getLogger(__name__)

__all__ = ["Loads"]


class Loads:
    """Pin and unpin steps over ``table`` (ref counts: ``>= 0`` ready, pinned while ``> 0``).

    Args:
        table, policy, counters: the manager's.
    """

    def __init__(self, table: SlotTable, policy: CachePolicy, counters: Counters) -> None:
        self.table = table
        self.policy = policy
        self.counters = counters

    def prepare(self, keys: Sequence[OffloadKey], slots: list[int] | np.ndarray) -> CPULoadStoreSpec:
        """Pin the distinct ``keys`` with their ``slots`` (a list: scalar code; an array: numpy).

        Raises:
            KeyStateError: a key is absent or pending (nothing is pinned then).
        """
        t = self.table
        if slots.__class__ is list:
            ref = t.ref_buf
            if not slots or (min(slots) >= 0 and min(map(ref.__getitem__, slots)) >= 0):  # C-level passes
                newly = 0
                for s in slots:
                    r = ref[s]
                    newly += r == 0
                    ref[s] = r + 1
                t.num_evictable -= newly
                t.num_pinned += newly
                self.counters.loads += len(slots)
                return CPULoadStoreSpec(slots)
            slots = np.array(slots, dtype=np.int64)  # the array path names the bad key
        assert isinstance(slots, np.ndarray)
        if len(slots):
            if int(slots.min()) < 0:
                i = int(np.argmax(slots < 0))  # type: ignore[operator]
                raise KeyStateError(f"prepare_load: keys[{i}] {keys[i]!r} is not stored")
            states = t.ref[slots]
            if int(states.min()) < 0:
                i = int(np.argmax(states < 0))
                raise KeyStateError(f"prepare_load: keys[{i}] {keys[i]!r} is not ready (its store is in flight)")
            newly = int(np.count_nonzero(states == 0))
            states += 1
            t.ref[slots] = states
            t.num_evictable -= newly
            t.num_pinned += newly
            self.counters.loads += len(slots)
        return CPULoadStoreSpec(slots)

    def complete(self, keys: Sequence[OffloadKey], slots: list[int] | np.ndarray, unique: bool) -> None:
        """Unpin ``keys`` (ref count -1 per occurrence; repeats allowed unless ``unique``).

        Raises:
            KeyStateError: a key is absent, pending, or not pinned (often enough, counting
                repeats); nothing is unpinned then.
        """
        t = self.table
        if slots.__class__ is list:
            freed = self._unpin_few(slots)  # type: ignore[arg-type]
            if freed is not None:
                if freed:
                    t.num_evictable += len(freed)
                    t.num_pinned -= len(freed)
                    lists = self.policy.takes_lists
                    self.policy.on_evictable(freed if lists else np.array(freed, dtype=np.int64))  # type: ignore[arg-type]
                return
            slots = np.array(slots, dtype=np.int64)  # the array path names the bad key
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
            s = int(uniq[j])
            what = "pending" if states[j] == PENDING else f"pinned {int(states[j])} time(s)"
            c = 1 if cnt is None else int(cnt[j])
            raise KeyStateError(f"complete_load: key {t.keys[s]!r} is {what}, cannot unpin it {c} time(s)")
        states -= 1 if cnt is None else cnt.astype(np.int32)
        t.ref[uniq] = states
        freed_a = uniq[states == 0]  # type: ignore[index]
        if len(freed_a):
            t.num_evictable += len(freed_a)
            t.num_pinned -= len(freed_a)
            self.policy.on_evictable(freed_a)

    def _unpin_few(self, slots: list[int]) -> list[int] | None:
        """Unpin ``slots`` (once per occurrence) with scalar code; the slots that reached ref 0,
        or None (nothing changed) when one is not pinned often enough."""
        ref = self.table.ref_buf
        freed: list[int] = []
        if len(set(slots)) == len(slots):  # distinct (the engine's case): C-level checks
            if slots and (min(slots) < 0 or min(map(ref.__getitem__, slots)) < 1):
                return None
            for s in slots:
                r = ref[s] - 1
                ref[s] = r
                if r == 0:
                    freed.append(s)
            return freed
        counts: dict[int, int] = {}
        for s in slots:
            counts[s] = counts.get(s, 0) + 1
        if not all(s >= 0 and ref[s] >= c for s, c in counts.items()):
            return None
        for s, c in counts.items():
            ref[s] -= c
            if ref[s] == 0:
                freed.append(s)
        return freed
