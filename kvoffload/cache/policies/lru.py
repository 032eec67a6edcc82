"""Exact LRU over the manager's blocks (vLLM's ``lru`` policy semantics)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy, Slots
from kvoffload.cache.policies.order import SlotOrder

logger = logging.getLogger(__name__)

__all__ = ["LRUPolicy", "first_occurrences"]


def first_occurrences(slots: np.ndarray) -> np.ndarray:
    """``slots`` without repeats, keeping each slot's first occurrence, in order."""
    if len(slots) < 2:
        return slots
    srt = np.sort(slots)
    if not (srt[1:] == srt[:-1]).any():
        return slots
    _, first = np.unique(slots, return_index=True)
    return slots[np.sort(first)]


class LRUPolicy(CachePolicy):
    """Least-recently-used order over every present block.

    * New (pending) blocks go to the most-recent end, in call order (the last key of a
      ``prepare_store`` call is the most recent).
    * ``touch(keys)`` moves the present keys to the most-recent end so that ``keys[0]``
      ends up most recent (keys come in prefix order: tails age first). Pending blocks move
      too. Absent keys are ignored.
    * Eviction takes the least recent blocks that are ready, unpinned and not protected.

    Storage: one :class:`~kvoffload.cache.policies.order.SlotOrder` (``int8`` membership,
    ``int64`` position per slot, ``int32`` log of ``2 * capacity + 64`` entries). Touching
    ``k`` keys and evicting ``k`` blocks cost O(k) amortised, independent of capacity and of
    pinned blocks at the old end (they are parked, see ``order.py``).
    """

    name = "lru"
    takes_lists = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.order = SlotOrder(1, self.member, self.pos, capacity)

    def insert(self, slots: Slots, keys: Sequence[bytes]) -> None:
        self.order.push_back(slots, fresh=True)

    def remove(self, slots: Slots) -> None:
        self.order.discard(slots)

    def touch(self, keys: Sequence[bytes], slots: Slots, unique: bool = False) -> None:
        if isinstance(slots, list):  # the last key first
            if unique:
                few = slots[::-1] if slots and min(slots) >= 0 else [s for s in reversed(slots) if s >= 0]
            else:
                seen: set[int] = set()
                few = [s for s in slots if s >= 0 and not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]
                few.reverse()
            self.order.push_back(few, members=True)
            return
        present = slots[slots >= 0]
        if len(present):
            if not unique:
                present = first_occurrences(present)
            self.order.push_back(present[::-1], members=True)

    def on_evictable(self, slots: Slots) -> None:
        if self.order.scanned:  # else nothing is parked (the order's own test, without its call)
            self.order.on_evictable(slots)

    def evict(self, n: int, protected: Slots) -> Any:
        t = self.table
        victims = self.order.take(n, t.ref_buf if protected.__class__ is list else t.ref, protected, t.prot_mark)
        if len(victims) < n:
            self.order.on_evictable(victims)
            return None
        self.order.discard(victims, members=True)
        return victims  # type: ignore[no-any-return]

    def clear(self) -> None:
        self.member[:] = 0
        self.order.clear()

    def ordered_slots(self) -> list[int]:
        """Every slot, least recent first (O(capacity); tests/debugging)."""
        return self.order.ordered()

    def metadata_nbytes(self) -> int:
        return self.member.nbytes + self.pos.nbytes + self.order.buf.nbytes
