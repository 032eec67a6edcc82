"""An ordered list of slots (oldest first) in numpy arrays: an append-only log with lazy deletion
(the representation; :mod:`~kvoffload.cache.policies.order` scans it for eviction victims).

Why not an intrusive doubly-linked list? Moving ``k`` slots to the most-recent end of a linked
list is ``k`` dependent Python-level pointer updates (~0.3 us each); here it is one
``buf[tail:tail+k] = slots`` and one ``pos[slots] = ...`` (numpy, ~ns per slot).

Representation (shared by all the lists of one policy; a slot is in at most one list):

* ``member[s]`` (``int8``): id of the list holding slot ``s`` (0 = none).
* ``pos[s]`` (``int64``): the slot's position in its list. Positions only ever grow, so
  list order is position order.
* each list has a log ``buf`` (``int32`` slot ids); the entry at physical index ``i`` has
  position ``base + i``. An entry is *current* iff ``member[slot] == lid and pos[slot] ==
  base + i``; moving or removing a slot just makes its old entry stale. Entries before ``head``
  were passed by an eviction scan; their current slots are *parked* (see ``order.py``).

Compaction: when the log is full, the current entries from ``head`` on are copied to the start
and renumbered with fresh positions above every existing one (order kept, parked slots stay
older). The log holds ``2 * capacity + 64`` entries and at most ``capacity`` of them are
current, so a compaction (O(capacity)) happens at most once per ``capacity`` appends: O(1)
amortised per append.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["SlotLog"]


class SlotLog:
    """One list of slots in order, oldest first, as a log (see the module docstring).

    Args:
        lid: this list's id (``1..127``), stored in ``member``.
        member: shared ``int8[capacity]`` list-membership array.
        pos: shared ``int64[capacity]`` position array.
        capacity: number of slots.
    """

    def __init__(self, lid: int, member: np.ndarray, pos: np.ndarray, capacity: int) -> None:
        self.lid = lid
        self.member = member
        self.pos = pos
        self.buf = np.empty(2 * capacity + 64, dtype=np.int32)
        self.base = 0
        self.head = 0
        self.tail = 0
        self.size = 0
        # memoryviews for the scalar (small-batch) methods; ``_bm`` follows ``buf``
        self._mm = member.data
        self._pm = pos.data
        self._bm = self.buf.data

    def __len__(self) -> int:
        return self.size

    def clear(self) -> None:
        """Empty the list (the caller resets the shared arrays)."""
        self.base += self.tail
        self.head = self.tail = 0
        self.size = 0

    def reserve(self, k: int) -> None:
        """Make room for ``k`` appends at ``tail`` (compacting the log if needed: positions change,
        order does not), for a caller that writes ``buf`` and ``pos`` itself (``_bm``/``_pm``, then
        ``tail`` and ``size``)."""
        if self.tail + k > len(self.buf):
            self._compact(k)

    def push_back(self, slots: np.ndarray | list[int], members: bool = False, fresh: bool = False) -> None:
        """Append distinct ``slots`` at the newest end, in order (the last one is the newest).

        Slots already in this list move; slots in another list must have been discarded
        from it first. ``members=True`` promises that every slot is already in this list,
        ``fresh=True`` that none is in any list (blocks just allocated). Here and below, a
        ``list`` of slots takes per-slot memoryview steps (~50 ns each; a numpy call costs ~1 us
        whatever its size), an array numpy operations.
        """
        k = len(slots)
        if k == 0:
            return
        if self.tail + k > len(self.buf):
            self._compact(k)
        t = self.tail
        if slots.__class__ is list:
            member, pos, buf, lid = self._mm, self._pm, self._bm, self.lid
            p = self.base + t
            if fresh:
                for s in slots:
                    member[s] = lid
                    buf[t] = s
                    pos[s] = p
                    t += 1
                    p += 1
                self.size += k
            elif members:
                for s in slots:
                    buf[t] = s
                    pos[s] = p
                    t += 1
                    p += 1
            else:
                joined = 0
                for s in slots:
                    if member[s] != lid:
                        member[s] = lid
                        joined += 1
                    buf[t] = s
                    pos[s] = p
                    t += 1
                    p += 1
                self.size += joined
            self.tail = t
            return
        if fresh:
            self.size += k
        elif not members:
            self.size += int(np.count_nonzero(self.member[slots] != self.lid))
        self.buf[t : t + k] = slots
        self.pos[slots] = np.arange(self.base + t, self.base + t + k, dtype=np.int64)
        if not members:
            self.member[slots] = self.lid
        self.tail = t + k

    def discard(self, slots: np.ndarray | list[int], members: bool = False) -> None:
        """Remove distinct ``slots`` that are in this list (others are ignored; ``members``: all are
        in it, e.g. the slots an eviction scan just returned)."""
        if members:
            if slots.__class__ is list:
                member = self._mm
                for s in slots:
                    member[s] = 0
            else:
                self.member[slots] = 0
            self.size -= len(slots)
            return
        if slots.__class__ is list:
            member, lid = self._mm, self.lid
            for s in slots:
                if member[s] == lid:
                    member[s] = 0
                    self.size -= 1
            return
        if len(slots) == 0:
            return
        mine = self.member[slots] == self.lid
        n = int(np.count_nonzero(mine))
        if n:
            self.member[slots[mine]] = 0  # type: ignore[index]
            self.size -= n

    def ordered(self) -> list[int]:
        """Every slot of the list, oldest first (O(capacity); for tests and debugging)."""
        seg = self.buf[self.head : self.tail].astype(np.int64)
        idx = np.arange(self.base + self.head, self.base + self.tail, dtype=np.int64)
        cur = seg[(self.member[seg] == self.lid) & (self.pos[seg] == idx)] if len(seg) else seg
        parked = ((self.member == self.lid) & (self.pos < self.base + self.head)).nonzero()[0]
        parked = parked[np.argsort(self.pos[parked], kind="stable")]
        return parked.tolist() + cur.tolist()

    def _compact(self, extra: int) -> None:
        h, t = self.head, self.tail
        seg = self.buf[h:t].astype(np.int64)
        if len(seg):
            cur = (self.member[seg] == self.lid) & (
                self.pos[seg] == np.arange(self.base + h, self.base + t, dtype=np.int64)
            )
            live = seg[cur]
        else:
            live = seg
        m = len(live)
        if m + extra > len(self.buf):
            self.buf = np.empty(max(2 * len(self.buf), m + extra + 64), dtype=np.int32)
            self._bm = self.buf.data
        new_base = self.base + t
        self.buf[:m] = live
        if m:
            self.pos[live] = np.arange(new_base, new_base + m, dtype=np.int64)
        self.base = new_base
        self.head = 0
        self.tail = m
