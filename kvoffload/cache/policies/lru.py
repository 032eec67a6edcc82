"""Exact LRU over the manager's blocks (vLLM's ``lru`` policy semantics)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy
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

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.order = SlotOrder(1, self.member, self.pos, capacity)

    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        self.order.push_back(slots, fresh=True)

    def remove(self, slots: np.ndarray) -> None:
        self.order.discard(slots)

    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        present = slots[slots >= 0]
        if len(present):
            if not unique:
                present = first_occurrences(present)
            self.order.push_back(present[::-1], members=True)

    def on_evictable(self, slots: np.ndarray) -> None:
        self.order.on_evictable(slots)

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        victims = self.order.take(n, self.table.ref, protected, self.table.prot_mark)
        if len(victims) < n:
            self.order.restore(victims)
            return None
        self.order.discard_taken(victims)
        return victims

    # scalar forms for small batches (see CachePolicy)
    def insert_list(self, slots: list[int], keys: Sequence[bytes]) -> None:
        self.order.push_back_list(slots)

    def remove_list(self, slots: list[int]) -> None:
        self.order.discard_list(slots)

    def touch_list(self, keys: Sequence[bytes], slots: list[int]) -> None:
        seen: set[int] = set()
        present = [s for s in slots if s >= 0 and not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]
        if present:
            present.reverse()
            self.order.push_back_list(present, members=True)

    def on_evictable_list(self, slots: list[int]) -> None:
        self.order.on_evictable_list(slots)

    def evict_list(self, n: int, protected: list[int]) -> list[int] | None:
        victims = self.order.take_list(n, self.table.ref_buf, protected, self.table.prot_mark)
        if len(victims) < n:
            self.order.on_evictable_list(victims)
            return None
        self.order.discard_list(victims)
        return victims

    def clear(self) -> None:
        self.member[:] = 0
        self.order.clear()

    def ordered_slots(self) -> list[int]:
        """Every slot, least recent first (O(capacity); tests/debugging)."""
        return self.order.ordered()

    def metadata_nbytes(self) -> int:
        return self.member.nbytes + self.pos.nbytes + self.order.buf.nbytes
