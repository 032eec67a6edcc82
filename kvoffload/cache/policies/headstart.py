"""``headstart``: LRU in which blocks seen before get a head start sized online.

Why: in an offloading cache most blocks are one-shot (the tail of a prompt that never comes back:
76 % of the distinct blocks of the Mooncake conversation trace), and under plain LRU they push out
the prefixes that are read again. The one strong online signal is "this block was held by an
earlier request": such blocks are read again far more often than blocks on first sight. So the
policy keeps two LRU lists, *first sight* and *seen*, and evicts from the seen list only when its
oldest block is older than the first-sight list's oldest by more than a head start ``H``: a seen
block outlives a first-sight block of the same age by ``H`` blocks of inserts. How large ``H``
should be depends on the workload (where conversations have exactly two turns, "seen before" means
"done", and ``H = 0``, plain LRU, is best); :class:`~kvoffload.cache.policies.headstart_tuner.
HeadStartTuner` measures the candidates on a sample of the keys and picks one online.

Rules (the reference model in the tests implements exactly these):

* a clock counts inserted blocks; every block carries the clock value of its last insert or touch
  (its *stamp*).
* insert (pending blocks, call order): the tuner observes the keys; a key found in the ghost
  history leaves it and goes to the seen list, any other key to the first-sight list (most recent
  end); stamps ``clock, clock+1, ...`` in call order, then the clock advances by the number of
  blocks.
* touch: the present keys (first occurrences) are observed by the tuner in order and move to the
  seen list so that ``keys[0]`` ends up most recent, stamped with the clock.
* a finished request (request-scoped engines): its present keys (first occurrences) that it did
  not only store are observed by the tuner in order; keys it only stored keep their list, the
  others move to the seen list; both get the most-recent position of their list (``keys[0]``
  most recent), stamped with the clock.
* evict ``n``: repeatedly, of the oldest evictable, unprotected block of each list, the
  first-sight one goes if there is no seen one or its stamp ``<=`` the seen one's stamp ``+ H``,
  else the seen one. The victim's key enters the ghost history (queued, see below).
* workload tags (``uses_workload``): once a request has carried a tag,
  :class:`~kvoffload.cache.policies.headstart_tags.TagClasses` counts per tag how often the blocks
  its requests placed are read again (inserts label blocks, reads count and relabel them, evictions
  count); an insert by a request whose tag is *hot* puts every inserted block on the seen list.
  Without tags nothing changes and nothing is kept.
* ghost history: :class:`~kvoffload.cache.policies.ghost.GhostKeys` of about ``4 * capacity`` key
  fingerprints (``headstart_tuner.fingerprints``); a key found there on insert leaves it. Victims
  enter it in eviction order, queued in batches of ``max(1, min(GHOST_BATCH, history // 64))``
  (``GhostKeys.queue``; the history's size: ``4 * capacity``): up to a batch of recent victims,
  under 1/64 of the window, are not found yet. ``H`` is the tuner's ``head_start``.

Memory: per block of capacity, ``int8`` list id + ``int64`` position + ``int64`` stamp + ``uint32``
fingerprint + two ``int32`` logs of ``2 * capacity + 64`` entries (16 B) + the ghost history of 4
keys (64 to 129 B) + a ``uint8`` tag label: 102 to 167 bytes, plus 4 KB of tag counts, the victim
queue (at most ``GHOST_BATCH`` plus one call's victims, 4 B each) and the tuner's small caches (four
of at most 128 blocks with 512 ghost keys each, about 0.3 MB whatever the capacity). Cost: a touch
or insert is O(keys) numpy work (a CRC-32 and a history lookup per inserted key); evicting ``n``
blocks takes the first-sight blocks up to the seen list's oldest candidate in one scan (usually all
``n``; bounded first by the stamp at the seen list's head), then the two lists in turn (O(n)
amortised); the history O(1) amortised per victim (``ghost.py``); the tuner does Python work for
a fraction ``min(1, 128 / capacity)`` of the accesses (its sample). Small calls (lists: at most
``SCALAR_INSERT`` inserted keys, ``SCALAR_EVICT`` victims) take scalar steps, no numpy call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy, Slots
from kvoffload.cache.policies.ghost import GhostKeys
from kvoffload.cache.policies.headstart_tags import TagClasses
from kvoffload.cache.policies.headstart_tuner import HeadStartTuner, fingerprint, fingerprints
from kvoffload.cache.policies.lru import first_occurrences
from kvoffload.cache.policies.order import SlotOrder

logger = logging.getLogger(__name__)

__all__ = ["HeadStartPolicy"]

_NEW = 1
_SEEN = 2
#: the ghost history remembers about this many evicted keys per block of capacity
GHOST_FACTOR = 4
#: victims enter the ghost history in batches of at least ``min(GHOST_BATCH, history // 64)`` keys
GHOST_BATCH = 1024
#: an insert of more keys than this takes the array path even when handed a list (per key, the
#: scalar fingerprint and history lookup cost more than numpy's fixed cost per call beyond it)
SCALAR_INSERT = 16
#: an eviction of more blocks than this scans with arrays even when handed a list (beyond it the
#: entry-by-entry scans cost more than numpy's fixed costs)
SCALAR_EVICT = 32


def _joined(parts: list[Any]) -> Any:
    """The lists, or the arrays, ``parts`` end to end."""
    return [s for p in parts for s in p] if parts[0].__class__ is list else np.concatenate(parts)


class HeadStartPolicy(CachePolicy):
    """Two LRU lists, first sight and seen, with an adaptive head start (module docstring)."""

    name = "headstart"
    takes_lists = True
    uses_workload = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.stamp = np.zeros(capacity, dtype=np.int64)
        self._stamp_mv = self.stamp.data  # memoryviews for the list paths (a few keys)
        self._member_mv = self.member.data
        self._pos_mv = self.pos.data
        self.fp = np.zeros(capacity, dtype=np.uint32)  # each block's key fingerprint
        self._fp_mv = self.fp.data
        self.new = SlotOrder(_NEW, self.member, self.pos, capacity)
        self.seen = SlotOrder(_SEEN, self.member, self.pos, capacity)
        history = max(1, GHOST_FACTOR * capacity)
        self.ghost = GhostKeys(history, batch=max(1, min(GHOST_BATCH, history // 64)))
        self.tuner = HeadStartTuner(max(1, capacity))
        self.tags = TagClasses(capacity)
        self.clock = 0

    @property
    def head_start(self) -> int:
        """``H``: how many inserts longer a seen block stays than a first-sight one."""
        return self.tuner.head_start

    def insert(self, slots: Slots, keys: Sequence[bytes]) -> None:
        k = len(slots)
        if k == 0:
            return
        fp: Any
        if slots.__class__ is list and k > SCALAR_INSERT:
            slots = np.array(slots, dtype=np.int64)
        if slots.__class__ is list:
            fp = list(map(fingerprint, keys))
            fp_mv, stamp_mv, c = self._fp_mv, self._stamp_mv, self.clock
            for s, f in zip(slots, fp):  # noqa: B905 (hot; equal lengths)
                fp_mv[s] = f
                stamp_mv[s] = c
                c += 1
        else:
            fp = fingerprints(keys)
            self.fp[slots] = fp
            self.stamp[slots] = np.arange(self.clock, self.clock + k, dtype=np.int64)
        self.clock += k
        self.tuner.observe(fp)
        hit = self.ghost.contains_pop(fp)
        if self.workload is not None or self.tags.ids:  # tagged requests (headstart_tags.py)
            t = self.tags.class_of(self.workload)
            self.tags.label[slots] = t
            if self.tags.hot(t):
                self.seen.push_back(slots, fresh=True)
                return
        if hit is None:
            self.new.push_back(slots, fresh=True)
        elif hit.__class__ is list:
            self.new.push_back([s for s, h in zip(slots, hit) if not h], fresh=True)  # noqa: B905
            self.seen.push_back([s for s, h in zip(slots, hit) if h], fresh=True)  # noqa: B905
        else:
            self.new.push_back(slots[~hit], fresh=True)  # type: ignore[call-overload,index,operator]
            self.seen.push_back(slots[hit], fresh=True)  # type: ignore[call-overload,index]

    def remove(self, slots: Slots) -> None:
        self.new.discard(slots)
        self.seen.discard(slots)

    def touch(self, keys: Sequence[bytes], slots: Slots, unique: bool = False) -> None:
        present: Any
        if slots.__class__ is list:
            present = [s for s in slots if s >= 0]
            if not unique and len(present) > 1:
                present = list(dict.fromkeys(present))
        else:
            present = slots[slots >= 0]  # type: ignore[call-overload,index,operator]
            if not unique:
                present = first_occurrences(present)
        if len(present):
            self._read(present)
            self._to_seen(present[::-1])

    def _read(self, slots: Slots) -> None:
        """The blocks ``slots`` (in access order) were read: the tags and the tuner learn it."""
        if self.workload is not None or self.tags.ids:
            self.tags.read(slots, self.tags.class_of(self.workload))  # type: ignore[arg-type]
        fp_mv = self._fp_mv
        self.tuner.observe([fp_mv[s] for s in slots] if slots.__class__ is list else self.fp[slots])

    def _to_seen(self, slots: Slots) -> None:
        """Move ``slots`` (distinct, oldest first) to the seen list's most recent end."""
        if slots.__class__ is list:
            member = self._member_mv
            moving = any(member[s] != _SEEN for s in slots)
        else:
            moving = bool(np.count_nonzero(self.member[slots] != _SEEN))
        if moving:
            self.new.discard(slots)
            self.seen.push_back(slots)
        else:  # all on the seen list already (the common case): no membership changes
            self.seen.push_back(slots, members=True)
        self._stamp_now(slots)

    def _stamp_now(self, slots: Slots) -> None:
        """Stamp ``slots`` with the clock."""
        if slots.__class__ is list:
            stamp_mv, c = self._stamp_mv, self.clock
            for s in slots:
                stamp_mv[s] = c
        else:
            self.stamp[slots] = self.clock

    def on_request_finished(self, keys: Sequence[bytes], slots: Slots, inserted_only: Slots, reused: Slots) -> None:
        if slots.__class__ is list:
            self._finish_list(slots, inserted_only)  # type: ignore[arg-type]
            return
        idx = np.flatnonzero(slots >= 0)  # type: ignore[operator]
        if len(idx) == 0:
            return
        present = slots[idx]  # type: ignore[call-overload,index]
        if len(first_occurrences(present)) < len(present):
            _, at = np.unique(present, return_index=True)
            idx = idx[np.sort(at)]
            present = slots[idx]  # type: ignore[call-overload,index]
        own = inserted_only[idx]  # type: ignore[call-overload,index]
        self._read(present[~own])
        rev = present[::-1]
        keep_new = own[::-1] & (self.member[rev] == _NEW)
        if keep_new.any():
            self.new.push_back(rev[keep_new], members=True)
            self._stamp_now(rev[keep_new])
            rev = rev[~keep_new]
        self._to_seen(rev)

    def _finish_list(self, slots: list[int], inserted_only: list[bool]) -> None:
        """:meth:`on_request_finished` with lists (a few keys; distinct, as the contract's keys are):
        one pass, last key first, straight into both logs."""
        new, seen = self.new, self.seen
        new.reserve(len(slots))
        seen.reserve(len(slots))
        member, pos, stamp, clock = self._member_mv, self._pos_mv, self._stamp_mv, self.clock
        buf_new, buf_seen, i_new, i_seen = new._bm, seen._bm, new.tail, seen.tail
        left_new = joined_seen = 0
        read: list[int] = []
        for s, own in zip(reversed(slots), reversed(inserted_only), strict=True):
            if s < 0:
                continue
            m = member[s]
            if own and m == _NEW:  # only stored: refreshed on the first-sight list
                buf_new[i_new] = s
                pos[s] = new.base + i_new
                i_new += 1
            else:
                if not own:
                    read.append(s)
                if m != _SEEN:
                    member[s] = _SEEN  # its first-sight entry, if any, goes stale
                    joined_seen += 1
                    left_new += m == _NEW
                buf_seen[i_seen] = s
                pos[s] = seen.base + i_seen
                i_seen += 1
            stamp[s] = clock
        new.tail, seen.tail = i_new, i_seen
        new.size -= left_new
        seen.size += joined_seen
        read.reverse()  # head first
        self._read(read)

    def on_evictable(self, slots: Slots) -> None:
        if not len(slots) or not (self.new.scanned or self.seen.scanned):
            return  # (else nothing is parked)
        # a list with none below its scan has none parked: skipped
        low = min(map(self._pos_mv.__getitem__, slots)) if slots.__class__ is list else int(self.pos[slots].min())  # type: ignore[call-overload,index]
        if low < self.new.scan_position:
            self.new.on_evictable(slots)
        if low < self.seen.scan_position:
            self.seen.on_evictable(slots)

    def evict(self, n: int, protected: Slots) -> Any:
        if protected.__class__ is not list:
            return self._evict(n, protected)  # type: ignore[arg-type]
        if n <= SCALAR_EVICT:
            return self._evict_few(n, protected)  # type: ignore[arg-type]
        out = self._evict(n, np.array(protected, dtype=np.int64))
        return None if out is None else out.tolist()

    def _evict_few(self, n: int, protected: list[int]) -> list[int] | None:
        """:meth:`evict` with lists (a small call), each scan entry by entry: the first-sight blocks
        up to the stamp of the seen list's ``front()`` (its oldest candidate, or an older block: a
        lower bound; :meth:`_evict_merged` goes on from there), else up to the exact stamp; the same
        victims as :meth:`_evict`."""
        t, h, stamp, stamp_mv = self.table, self.tuner.head_start, self.stamp, self._stamp_mv
        new, seen = self.new, self.seen
        a: list[int]
        if not seen.size:
            a = new.take(n, t.ref_buf, protected, t.prot_mark)
        elif (floor := self._seen_floor()) is not None:
            a = new.take(n, t.ref_buf, protected, t.prot_mark, stamp, floor + h)
        else:
            b = seen.peek(1, t.ref, protected, t.prot_mark)
            a = new.take(n, t.ref_buf, protected, t.prot_mark, stamp, stamp_mv[b[0]] + h if b else None)
        if len(a) == n:
            new.discard(a, members=True)
            self._to_ghost(a)
            if self.tags.ids:
                self.tags.gone(a)  # type: ignore[arg-type]
            return a
        return self._evict_merged(n, a, h, protected)  # type: ignore[no-any-return]

    def _evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        """:meth:`evict` with arrays."""
        ref, mark, h, stamp = self.table.ref, self.table.prot_mark, self.tuner.head_start, self.stamp
        # the first-sight blocks that go before the seen list's oldest candidate (both lists' stamps
        # only grow from old to new, so one limited take finds them); usually that is every victim.
        # Where a lower bound of that candidate's stamp is known without a scan: an unlimited take,
        # those past the bound given back (parked, in order), and if that leaves too few, a take on
        # from there up to the exact stamp: together the same take.
        floor = self._seen_floor() if self.seen.size else None
        if floor is None and self.seen.size:
            b = self.seen.peek(1, ref, protected, mark)
            a = self.new.take(n, ref, protected, mark, stamp, int(stamp[b[0]]) + h if len(b) else None)
        else:
            a = self.new.take(n, ref, protected, mark)
            if floor is not None and len(a) and int(stamp[a[-1]]) > floor + h:
                cut = int(np.searchsorted(stamp[a], floor + h, side="right"))
                self.new.on_evictable(a[cut:])
                a = a[:cut]
            if len(a) < n and floor is not None:
                b = self.seen.peek(1, ref, protected, mark)
                more = self.new.take(n - len(a), ref, protected, mark, stamp, int(stamp[b[0]]) + h if len(b) else None)
                a = np.concatenate((a, more)) if len(a) else more
        if len(a) == n:
            self.new.discard(a, members=True)
            self._to_ghost(a)
            if self.tags.ids:
                self.tags.gone(a)
            return a
        return self._evict_merged(n, a, h, protected)

    def _seen_floor(self) -> int | None:
        """A lower bound of the stamp of the seen list's oldest evictable, unprotected block, found
        without a scan, or None: the stamp of the list's ``front()`` (stamps never
        decrease along the list; the list must not be empty)."""
        s = self.seen.front()
        return None if s is None else self._stamp_mv[s]  # type: ignore[no-any-return]

    def _evict_merged(self, n: int, a: Any, h: int, protected: Any) -> Any:
        """:meth:`evict` once a seen block comes next: takes from the two lists in turn, each up to
        the other's oldest candidate (ties go to the first-sight block), until ``n`` are taken
        (``protected`` and the answer: lists or arrays, as :meth:`_evict_few` and :meth:`_evict`).
        The first-sight list's last take ended short: its ``past_limit`` is that list's next
        candidate (-1: none left), and each take's ``past_limit`` the next of its list."""
        ref, mark, stamp, stamp_mv = self.table.ref, self.table.prot_mark, self.stamp, self._stamp_mv
        new_parts, seen_parts, victims = [a], [], [a]
        need = n - len(a)
        while need:
            nxt = self.new.past_limit
            s = self.seen.take(need, ref, protected, mark, stamp, stamp_mv[nxt] - h - 1 if nxt >= 0 else None)
            seen_parts.append(s)
            victims.append(s)
            need -= len(s)
            if need and nxt < 0:  # both lists exhausted: give everything back
                self.new.on_evictable(_joined(new_parts))
                self.seen.on_evictable(_joined(seen_parts))
                return None
            if need:
                b = self.seen.past_limit
                a = self.new.take(need, ref, protected, mark, stamp, stamp_mv[b] + h if b >= 0 else None)
                new_parts.append(a)
                victims.append(a)
                need -= len(a)
        self.new.discard(_joined(new_parts), members=True)
        self.seen.discard(_joined(seen_parts), members=True)
        out = _joined(victims)
        self._to_ghost(out)
        if self.tags.ids:
            self.tags.gone(out)
        return out

    def _to_ghost(self, victims: Slots) -> None:
        """The victims' fingerprints go to the ghost history's queue."""
        fp_mv = self._fp_mv
        self.ghost.queue([fp_mv[s] for s in victims] if victims.__class__ is list else self.fp[victims])

    def clear(self) -> None:
        self.member[:] = 0
        self.new.clear()
        self.seen.clear()
        self.ghost.clear()
        self.tuner.clear()
        self.tags.clear()
        self.clock = 0

    def ordered_slots(self) -> tuple[list[int], list[int]]:
        """(first-sight, seen) lists, oldest first (O(capacity); tests/debugging)."""
        return self.new.ordered(), self.seen.ordered()

    def metadata_nbytes(self) -> int:
        arrays = (self.member, self.pos, self.stamp, self.fp, self.new.buf, self.seen.buf)
        return sum(a.nbytes for a in arrays) + self.ghost.nbytes() + self.tags.nbytes()
