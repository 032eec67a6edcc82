"""LRU with request-scoped ranks (vLLM 0.33's ``lru``), over the manager's slots.

Every present block has a rank; eviction takes the evictable block of least rank first. A rank is
a pair ``(major, minor)``, compared in that order, kept as one integer ``major * SPAN - position``:

* a request gets one major number at its first access (its first :meth:`on_request_access`, or
  the first block inserted for it with a known position), kept on the request's context
  (``get_state`` / ``set_state``; a context without them gets a new one per call);
* a block inserted for a request, with a known token position ``p``, ranks ``(R, -p)``: the
  blocks of a running request sit together, after those of requests that began before it, tails
  before heads; a block without a position gets a fresh major number (the most recent);
* :meth:`on_request_access` raises a present block the request uses to ``(R, -p)`` if that is
  above its rank (a running request keeps what it reads as recent as its own blocks);
* :meth:`touch` and the end of a request (:meth:`on_request_finished`, the default: a touch of
  its keys head first) give each present key a fresh major number, the last key first, so that
  the first (the head) ends up most recent.

Ties (blocks of one request at the same position, in different KV-cache groups) go by key.

Storage: a rank per slot (a list), the set of evictable slots (told by :meth:`on_evictable` and
:meth:`on_pinned`) and a lazy min-heap of ``(rank, key, slot)`` entries: an entry whose slot
changed rank, key or evictability since it was pushed is dropped when it surfaces, and the heap
is rebuilt from the evictable set when it holds twice as many entries. Evicting ``k`` blocks and
changing ``k`` ranks cost O(k log n).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy

logger = logging.getLogger(__name__)

__all__ = ["RequestLRUPolicy", "SPAN"]

#: token positions are below this; a rank is ``major * SPAN - position``
SPAN = 1 << 40
#: rebuild the heap from the evictable set for an update of at least this many blocks (or a
#: quarter of the evictable ones), and when it holds this many entries and twice the evictable ones
_REBUILD_MIN = 64

_Entry = tuple[int, bytes, int]


class _RequestRank:
    """The major number of one request, valid for one policy and one generation (between clears)."""

    __slots__ = ("owner", "generation", "major")

    def __init__(self, owner: object, generation: int, major: int) -> None:
        self.owner = owner
        self.generation = generation
        self.major = major


class RequestLRUPolicy(CachePolicy):
    """Least-recently-used order with request-scoped ranks (see the module docstring).

    Reads :attr:`request` (``uses_requests``): the token positions of its keys
    (``get_offload_key_position``) and its per-request state. Without positions (kvoffload's own
    contexts carry none unless ``key_positions`` is given) it orders blocks as :class:`LRUPolicy`
    does: the last key of a store the most recent, a touch's first key the most recent.
    """

    name = "request_lru"
    uses_requests = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self._rank: list[int] = [0] * capacity  # meaningful for present slots only
        self._evictable: set[int] = set()
        self._heap: list[_Entry] = []
        self._next = 0
        self._generation = 0

    # ------------------------------------------------------------------ ranks
    def _request_major(self) -> int:
        """The current request's major number, assigned at its first use."""
        ctx = self.request
        get_state = getattr(ctx, "get_state", None)
        if get_state is not None:
            st = get_state(_RequestRank)
            if st is not None and st.owner is self and st.generation == self._generation:
                return st.major  # type: ignore[no-any-return]
        self._next += 1
        if get_state is not None:
            ctx.set_state(_RequestRank(self, self._generation, self._next))
        return self._next

    def _positions(self) -> Any:
        """The current request's ``key -> position`` lookup, or None."""
        return getattr(self.request, "get_offload_key_position", None)

    def _refresh(self, slots: list[int]) -> None:
        """Fresh ranks for the present ``slots``, the last first (the first ends up most recent)."""
        rank, evictable, nxt = self._rank, self._evictable, self._next
        moved = []
        for s in reversed(slots):
            if s >= 0:
                nxt += 1
                rank[s] = nxt * SPAN
                if s in evictable:
                    moved.append(s)
        self._next = nxt
        self._reheap(moved)

    def _reheap(self, moved: list[int]) -> None:
        """Make the heap reflect the new ranks of the evictable ``moved`` slots."""
        if not moved:
            return
        if len(moved) >= max(_REBUILD_MIN, len(self._evictable) // 4):
            self._rebuild()
            return
        rank, keys, heap = self._rank, self.table.keys, self._heap
        for s in moved:
            heapq.heappush(heap, (rank[s], keys[s], s))
        self._compact()

    def _rebuild(self) -> None:
        rank, keys = self._rank, self.table.keys
        self._heap = [(rank[s], keys[s], s) for s in self._evictable]
        heapq.heapify(self._heap)

    def _compact(self) -> None:
        if len(self._heap) >= max(_REBUILD_MIN, 2 * len(self._evictable)):
            self._rebuild()

    # ------------------------------------------------------------------ the policy contract
    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        position = self._positions()
        rank, major = self._rank, 0
        for s, k in zip(slots.tolist(), keys, strict=True):
            p = position(k) if position is not None else None
            if p is None:
                self._next += 1
                rank[s] = self._next * SPAN
            else:
                if not major:
                    major = self._request_major()
                rank[s] = major * SPAN - p

    def remove(self, slots: np.ndarray) -> None:
        self._evictable.difference_update(slots.tolist())

    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        self._refresh(slots.tolist())

    def on_request_access(self, keys: Sequence[bytes], slots: np.ndarray) -> None:
        major = self._request_major()
        position = self._positions()
        if position is None:
            return
        rank, evictable = self._rank, self._evictable
        moved = []
        for k, s in zip(keys, slots.tolist(), strict=True):
            if s < 0:
                continue
            p = position(k)
            if p is None:
                continue
            r = major * SPAN - p
            if rank[s] >= r:
                continue
            rank[s] = r
            if s in evictable:
                moved.append(s)
        self._reheap(moved)

    def on_evictable(self, slots: np.ndarray) -> None:
        rank, keys, heap = self._rank, self.table.keys, self._heap
        listed = slots.tolist()
        self._evictable.update(listed)
        for s in listed:
            heapq.heappush(heap, (rank[s], keys[s], s))
        self._compact()

    def on_pinned(self, slots: np.ndarray) -> None:
        self._evictable.difference_update(slots.tolist())

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        heap, rank, keys, evictable = self._heap, self._rank, self.table.keys, self._evictable
        prot = self.table.prot_mv
        chosen: list[_Entry] = []
        seen: set[int] = set()
        deferred: list[_Entry] = []
        while heap and len(chosen) < n:
            e = heapq.heappop(heap)
            r, k, s = e
            if s not in evictable or rank[s] != r or keys[s] is not k or s in seen:
                continue  # stale (re-ranked, pinned, freed) or a second entry of a chosen slot
            if prot[s]:
                deferred.append(e)
                continue
            chosen.append(e)
            seen.add(s)
        for e in deferred:
            heapq.heappush(heap, e)
        if len(chosen) < n:
            for e in chosen:
                heapq.heappush(heap, e)
            return None
        evictable.difference_update(seen)
        self._compact()
        return np.array([e[2] for e in chosen], dtype=np.int64)

    def clear(self) -> None:
        self._evictable.clear()
        self._heap.clear()
        self._next = 0
        self._generation += 1

    def ordered_slots(self) -> list[int]:
        """Every present slot, least recent first (O(n log n); tests/debugging)."""
        rank, keys = self._rank, self.table.keys
        return sorted(self.table.index.values(), key=lambda s: (rank[s], keys[s]))

    def metadata_nbytes(self) -> int:
        return 8 * self.capacity + 8 * len(self._heap) + 8 * len(self._evictable)
