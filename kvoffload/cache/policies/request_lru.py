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

Storage: a rank and a key per slot (lists), the set of evictable slots (told by
:meth:`on_evictable` and :meth:`on_pinned`) and a lazy min-heap of ``(rank, key, slot)`` entries,
kept up to date only when an eviction needs it: a rank change or a newly evictable slot is noted
(``dirty``) and pushed at the next :meth:`evict`; once more slots are noted than there are keys,
the heap is dropped and rebuilt from the evictable set at the next eviction (a pool that never
fills pays for no heap). A slot's rank only grows while it holds a key, so ``queued[s] ==
rank[s]`` says that the slot's current entry is in the heap (a slot pinned and released before an
eviction reached it is not pushed again). An entry whose slot changed rank, key or evictability
since it was pushed is dropped when it surfaces; the heap is rebuilt when it holds more than twice
as many entries as there are keys. Evicting ``k`` blocks and changing ``k`` ranks cost amortised
O(k log n).
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
#: the heap is rebuilt from the evictable set when it holds this many entries more than twice the keys
_SLACK = 64

_Entry = tuple[int, Any, int]  # (rank, key, slot)


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
        self._key: list[Any] = [None] * capacity  # the key of a present slot (bytes)
        self._queued: list[int] = [-1] * capacity  # the rank of the slot's entry in the heap, or -1
        self._evictable: set[int] = set()
        self._heap: list[_Entry] | None = []  # None: dropped, rebuilt at the next eviction
        self._dirty: list[int] = []  # evictable slots whose current entry may be missing from the heap
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
        rank, nxt, evictable, moved = self._rank, self._next, self._evictable, []
        noting = self._heap is not None  # (a dropped heap notes nothing: ranks only)
        for s in reversed(slots):
            if s >= 0:
                nxt += 1
                rank[s] = nxt * SPAN
                if noting and s in evictable:
                    moved.append(s)
        self._next = nxt
        self._note(moved)

    def _note(self, slots: list[int]) -> None:
        """The evictable ``slots`` have a new rank, or just became evictable (pushed at the next
        eviction, unless the heap is dropped first)."""
        if self._heap is None or not slots:
            return
        self._dirty.extend(slots)
        if len(self._dirty) > len(self.table.index) + _SLACK:
            self._forget_heap()
            self._heap = None

    def _forget_heap(self) -> None:
        """No entry is in the heap any more (``queued`` reset); the heap itself is the caller's."""
        queued = self._queued
        for e in self._heap or ():
            queued[e[2]] = -1
        self._dirty.clear()

    def _rebuild(self) -> list[_Entry]:
        """The heap of the current entries only (kept and returned)."""
        self._forget_heap()
        rank, keys, queued = self._rank, self._key, self._queued
        heap = [(rank[s], keys[s], s) for s in self._evictable]
        for s in self._evictable:
            queued[s] = rank[s]
        heapq.heapify(heap)
        self._heap = heap
        return heap

    def _ready_heap(self) -> list[_Entry]:
        """The heap holding an entry for every evictable slot (before an eviction)."""
        heap = self._heap
        if heap is None:
            return self._rebuild()
        rank, keys, queued, evictable, push = self._rank, self._key, self._queued, self._evictable, heapq.heappush
        for s in self._dirty:
            r = rank[s]
            if queued[s] != r and s in evictable:
                queued[s] = r
                push(heap, (r, keys[s], s))
        self._dirty.clear()
        if len(heap) > 2 * len(self.table.index) + _SLACK:
            return self._rebuild()
        return heap

    # ------------------------------------------------------------------ the policy contract
    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        position = self._positions()
        rank, key, queued, base = self._rank, self._key, self._queued, 0
        for s, k in zip(slots.tolist(), keys, strict=True):
            key[s] = k
            queued[s] = -1  # an entry of the slot's former key is stale
            p = position(k) if position is not None else None
            if p is None:
                self._next += 1
                rank[s] = self._next * SPAN
            else:
                if not base:
                    base = self._request_major() * SPAN
                rank[s] = base - p

    def remove(self, slots: np.ndarray) -> None:
        self._evictable.difference_update(slots.tolist())

    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        self._refresh(slots.tolist())

    def on_request_access(self, keys: Sequence[bytes], slots: np.ndarray) -> None:
        major = self._request_major()
        position = self._positions()
        if position is None:
            return
        present = np.flatnonzero(slots >= 0).tolist()  # (an offer's keys are mostly absent)
        if not present:
            return
        rank, evictable, base, listed = self._rank, self._evictable, major * SPAN, slots.tolist()
        moved = []
        for i in present:
            p = position(keys[i])
            if p is None:
                continue
            s, r = listed[i], base - p
            if rank[s] >= r:
                continue
            rank[s] = r
            if s in evictable:
                moved.append(s)
        self._note(moved)

    def on_evictable(self, slots: np.ndarray) -> None:
        listed = slots.tolist()
        self._evictable.update(listed)
        self._note(listed)

    def on_pinned(self, slots: np.ndarray) -> None:
        self._evictable.difference_update(slots.tolist())

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        heap = self._ready_heap()
        rank, keys, queued, evictable = self._rank, self._key, self._queued, self._evictable
        prot = self.table.prot_mv
        chosen: list[_Entry] = []
        seen: set[int] = set()
        deferred: list[_Entry] = []
        while heap and len(chosen) < n:
            e = heapq.heappop(heap)
            r, k, s = e
            if queued[s] == r:
                queued[s] = -1
            if s not in evictable or rank[s] != r or keys[s] is not k or s in seen:
                continue  # stale (re-ranked, pinned, freed) or a second entry of a chosen slot
            if prot[s]:
                deferred.append(e)
                continue
            chosen.append(e)
            seen.add(s)
        for e in deferred:
            queued[e[2]] = e[0]
            heapq.heappush(heap, e)
        if len(chosen) < n:
            for e in chosen:
                queued[e[2]] = e[0]
                heapq.heappush(heap, e)
            return None
        evictable.difference_update(seen)
        return np.array([e[2] for e in chosen], dtype=np.int64)

    def clear(self) -> None:
        self._forget_heap()
        self._evictable.clear()
        self._heap = []
        self._next = 0
        self._generation += 1

    def ordered_slots(self) -> list[int]:
        """Every present slot, least recent first (O(n log n); tests/debugging)."""
        rank, keys = self._rank, self._key
        return sorted(self.table.index.values(), key=lambda s: (rank[s], keys[s]))

    def metadata_nbytes(self) -> int:
        return 24 * self.capacity + 8 * (len(self._heap or ()) + len(self._dirty) + len(self._evictable))
