"""The manager's ``prepare_store`` (room made by evicting the policy's victims), ``complete_store``
and ``discard``, on slots the manager resolved: a list (a few keys: scalar code) or an ``int64`` array
(``complete_store`` of a few keys resolves them itself, in the same pass)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from kvoffload.cache.batch import Resolved, StorePlan
from kvoffload.cache.keytable import PENDING, SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.cache.stats import OffloadingStats
from kvoffload.core.base import CPULoadStoreSpec, OffloadingEvent, OffloadKey

__all__ = ["CPU_MEDIUM", "Stores"]

CPU_MEDIUM = CPULoadStoreSpec.medium()
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


class Stores:
    """Store and eviction steps over the manager's ``table``, ``policy``, ``counters`` and
    ``events`` (a list, or None without events)."""

    def __init__(
        self, table: SlotTable, policy: CachePolicy, counters: OffloadingStats, events: list[OffloadingEvent] | None
    ) -> None:
        self.table = table
        self.policy = policy
        self.counters = counters
        self.events = events
        self._lists = policy.takes_lists

    def prepare(
        self,
        keys: Sequence[OffloadKey],
        slots: list[int] | np.ndarray,
        r: Resolved | None = None,
        absent: list[OffloadKey] | None = None,
    ) -> StorePlan:
        """``prepare_store`` of the distinct ``keys`` with their ``slots`` (-1 = absent); ``r``: their
        resolution (the memo learns the new slots); ``absent``: the keys of slot -1 (given with a
        list of slots; with an array, found here)."""
        if slots.__class__ is list:
            assert absent is not None
            to_store = absent
            positions = None
        else:
            absent_mask = slots < 0  # type: ignore[operator]
            positions = absent_mask.nonzero()[0]
            to_store = list(keys) if len(positions) == len(keys) else [keys[i] for i in positions.tolist()]
        c, t, n_present = self.counters, self.table, len(keys) - len(to_store)
        if not to_store:
            c.stores_skipped += n_present
            return StorePlan([], slots[:0], [])
        evicted: list[OffloadKey] = []
        if len(to_store) + len(t.index) > t.num_blocks:  # > num_free; the present keys spared: only then needed
            protected: list[int] | np.ndarray
            if positions is None:
                protected = [s for s in slots if s >= 0] if n_present else []
            else:
                protected = slots[~absent_mask] if n_present else _EMPTY_I64  # type: ignore[index,call-overload,assignment]
            made = self.make_room(len(to_store), protected, len(keys))
            if made is None:
                return StorePlan(to_store, None, [])
            evicted = made
        count_before = t.insert_count
        new_slots = t.allocate(to_store, positions is None and self._lists)  # as the policy takes them
        if r is not None and r.batch is not None:  # the memo learns the new slots
            t.memo.note_insert(r.batch, r.offset + positions, new_slots, count_before, t.insert_count)  # type: ignore[operator,arg-type]
        self.policy.insert(new_slots, to_store)
        c.stores_started += len(to_store)
        c.stores_skipped += n_present
        return StorePlan(to_store, new_slots, evicted)

    def _arg(self, slots: list[int] | np.ndarray) -> Any:
        """``slots`` as the policy takes them (a list only if it ``takes_lists``)."""
        if slots.__class__ is list and not self._lists:
            return np.array(slots, dtype=np.int64)
        return slots

    def complete(self, keys: Collection[OffloadKey], slots: np.ndarray | None, success: bool, unique: bool) -> bool:
        """``complete_store`` of ``keys`` (repeats unless ``unique``): the pending ones become ready
        (``success``) or are removed; ``slots``: their ``int64`` slots (-1 = absent), or None for
        a few keys (a list or set) resolved here, in the same pass. Without ``slots``: False, nothing
        changed, if one is not a key or an absent one is not exactly ``bytes`` (the caller resolves
        them, which raises)."""
        t = self.table
        pend: Any
        if slots is None:
            get, ref = t.index.get, t.ref_buf
            pend, bad = [], False
            try:
                for k in keys:
                    s = get(k)
                    if s is None:
                        if k.__class__ is not bytes:  # an absent key must be exactly bytes
                            bad = True
                            break
                    elif ref[s] == PENDING:
                        pend.append(s)
                        if success:  # made ready in this one pass (a repeat is no longer pending)
                            ref[s] = 0
            except TypeError:  # an unhashable item: not a key
                bad = True
            if bad:
                if success:
                    for s in pend:
                        ref[s] = PENDING
                return False
            if not success and not unique and len(pend) > 1 and len(set(pend)) != len(pend):
                pend = list(dict.fromkeys(pend))  # each once, first occurrences
        else:
            pend = slots[slots >= 0]
            pend = pend[t.ref[pend] == PENDING]
            if not unique and len(pend) > 1:
                first = np.unique(pend, return_index=True)[1]
                if len(first) != len(pend):
                    pend = pend[np.sort(first)]
        if not len(pend):
            return True
        if not success:
            self.policy.remove(self._arg(pend))
            t.release(pend)
            self.counters.stores_aborted += len(pend)
            return True
        if pend.__class__ is not list:  # a list's slots were made ready above
            t.ref[pend] = 0
        self.policy.on_evictable(pend if self._lists else self._arg(pend))
        t.num_pending -= len(pend)
        t.num_evictable += len(pend)
        self.counters.stores_completed += len(pend)
        if self.events is not None:  # the keys of the slots made ready (equal keys, equal slots)
            done = [t.keys[s] for s in pend] if pend.__class__ is list else t.keys[pend].tolist()
            self.events.append(OffloadingEvent(keys=done, medium=CPU_MEDIUM, removed=False))  # type: ignore[arg-type]
        return True

    def make_room(self, n_new: int, protected: np.ndarray | list[int], n_keys: int) -> list[OffloadKey] | None:
        """Evict so that ``n_new`` slots are free, sparing the slots ``protected``; the evicted keys
        in eviction order (one event), or None (nothing changed, ``n_keys`` stores failed)."""
        t = self.table
        need = n_new - t.num_free
        if n_new == 0 or need <= 0:
            return []
        if protected.__class__ is list:
            prot_ev = list(map(t.ref_buf.__getitem__, protected)).count(0) if protected else 0
        else:
            prot_ev = int(np.count_nonzero(t.ref[protected] == 0)) if len(protected) else 0
        victims: np.ndarray | list[int] | None = None
        if need <= t.num_evictable - prot_ev:  # else hopeless: fail in O(1)
            if not len(protected):  # nothing to mark (the common case)
                victims = self.policy.evict(need, self._arg(protected))
            else:
                self._mark(protected, 1)
                try:
                    victims = self.policy.evict(need, self._arg(protected))
                finally:
                    self._mark(protected, 0)
        if victims is None:
            self.counters.stores_failed += n_keys
            return None
        if len(victims) != need:  # pragma: no cover - policy contract violation
            raise RuntimeError(f"policy {type(self.policy).__name__} returned {len(victims)} victims, expected {need}")
        self.counters.evictions += need
        evicted = t.release(victims, ready=True)
        self._record(evicted)
        return evicted

    def discard(self, slots: np.ndarray) -> list[OffloadKey]:
        """Free the ready, unpinned ``slots`` (others left alone); their keys, first occurrences."""
        arr = np.array([s for s in dict.fromkeys(slots.tolist()) if s >= 0], dtype=np.int64)
        arr = arr[self.table.ref[arr] == 0] if len(arr) else arr
        if not len(arr):
            return []
        self.policy.remove(arr)
        removed = self.table.release(arr, ready=True)
        self._record(removed)
        return removed

    def _record(self, keys: list[OffloadKey]) -> None:
        if self.events is not None:
            self.events.append(OffloadingEvent(keys=list(keys), medium=CPU_MEDIUM, removed=True))

    def _mark(self, protected: np.ndarray | list[int], value: int) -> None:
        """Set the protected slots' ``table.prot_mark`` (the policy's membership test)."""
        if protected.__class__ is list:
            mark = self.table.prot_mv
            for s in protected:
                mark[s] = value
        else:
            self.table.prot_mark[protected] = value
