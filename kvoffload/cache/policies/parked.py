"""The parked slots of one :class:`~kvoffload.cache.policies.order.SlotOrder` that became evictable
again: a min-heap of ``(position, slot)`` pairs, oldest position first.

An entry may go stale (its slot moved, was removed or pinned again since it was queued): the
list that owns the heap checks each entry it pops against its own arrays. One ``(position,
slot)`` pair is queued at most once while it is in the heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["ParkedHeap"]


class ParkedHeap:
    """Min-heap of ``(position, slot)`` pairs without repeats of a queued pair."""

    __slots__ = ("heap", "_queued")

    def __init__(self) -> None:
        #: the pairs, a heap (others read it only: its truth says whether a pair is queued, without a call)
        self.heap: list[tuple[int, int]] = []
        self._queued: dict[int, int] = {}  # slot -> the position it is queued at

    def __len__(self) -> int:
        return len(self.heap)

    def clear(self) -> None:
        self.heap.clear()
        self._queued.clear()

    def push(self, entries: Iterable[tuple[int, int]]) -> None:
        """Queue ``(position, slot)`` pairs; a pair already queued is not queued twice."""
        heap, queued = self.heap, self._queued
        for ps, s in entries:
            if queued.get(s) != ps:
                queued[s] = ps
                heapq.heappush(heap, (ps, s))

    def pop(self) -> tuple[int, int]:
        """Remove and return the pair with the lowest position (the heap must not be empty)."""
        ps, s = heapq.heappop(self.heap)
        if self._queued.get(s) == ps:
            del self._queued[s]
        return ps, s

    def first(self) -> tuple[int, int]:
        """The pair with the lowest position, left queued (the heap must not be empty)."""
        return self.heap[0]

    def smallest(self, n: int) -> list[tuple[int, int]]:
        """The ``n`` pairs with the lowest positions, in order, left queued."""
        if n >= len(self.heap):
            return sorted(self.heap)
        return heapq.nsmallest(n, self.heap)
