"""Eviction scans over a :class:`~kvoffload.cache.policies.log.SlotLog` (the list's log), with
*parked* slots.

Scanning for eviction victims walks the log from ``head``. Stale entries are dropped. A current
entry that cannot be evicted (pinned, or pending) is *parked*: ``head`` moves past it and it
keeps its position, so a later scan never looks at it again -- the cost of evicting ``k``
blocks does not grow with the number of pinned blocks at the old end, nor with capacity.
When a parked slot becomes evictable again (unpinned, or its store completed), it is pushed on
a small heap keyed by its position. Every heap entry is older than every log entry (parked
positions are all below the position at ``head``), so a scan takes the heap first, then the
log: the exact list order is preserved. A slot moved to the tail (touched) simply stops being
parked: its heap entry, if any, becomes stale.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import numpy as np

from kvoffload.cache.keytable import any_below
from kvoffload.cache.policies.log import SlotLog
from kvoffload.cache.policies.parked import ParkedHeap

logger = logging.getLogger(__name__)

__all__ = ["SlotOrder"]

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
#: :meth:`SlotOrder.take` (small calls) scans at most ``SCAN_BUDGET + 4 * k`` log entries one by one,
#: then goes on with the vectorised :meth:`SlotOrder.take`.
SCAN_BUDGET = 64


class SlotOrder(SlotLog):
    """One list of slots in order, oldest first, that eviction scans take victims from (see the
    module docstring; the arguments are :class:`~kvoffload.cache.policies.log.SlotLog`'s)."""

    def __init__(self, lid: int, member: np.ndarray, pos: np.ndarray, capacity: int) -> None:
        super().__init__(lid, member, pos, capacity)
        self._parked = ParkedHeap()
        #: whether a scan moved ``head`` since the last :meth:`clear` (else no slot is parked)
        self.scanned = False
        #: the slot the last :meth:`take` ended at, past its ``limit``: what ``peek(1)`` would return
        #: now; -1 when it took ``k``, or found no evictable, unprotected slot left (``peek`` finds none)
        self.past_limit = -1

    def clear(self) -> None:
        """Empty the list (the caller resets the shared arrays)."""
        super().clear()
        self._parked.clear()
        self.scanned = False

    @property
    def scan_position(self) -> int:
        """Position of the eviction scan's head: only slots at lower positions can be parked."""
        return self.base + self.head

    def front(self) -> int | None:
        """The slot no later scan can pass over unseen: the current entry at the scan's head when no
        parked slot waits to be taken again (every evictable slot of the list is then that one or
        one after it), else None. No scan, no change."""
        h = self.head
        if h < self.tail and not len(self._parked):
            s: int = self._bm[h]
            if self._mm[s] == self.lid and self._pm[s] == self.base + h:
                return s
        return None

    def on_evictable(self, slots: np.ndarray | list[int]) -> None:
        """``slots`` just became evictable (ready with ref 0): re-queue the parked ones."""
        if not self.scanned or len(slots) == 0:
            return  # nothing parked
        limit = self.base + self.head
        if slots.__class__ is list:
            pos = self._pm
            if not any_below(pos, slots, limit):
                return  # nothing parked (the common case)
            parked = [(pos[s], s) for s in slots if pos[s] < limit and self._mm[s] == self.lid]
        else:
            p = self.pos[slots]
            if int(p.min()) >= limit:
                return  # nothing parked (the common case: blocks pushed since the last scan)
            mask = (self.member[slots] == self.lid) & (p < limit)
            parked = list(zip(p[mask].tolist(), slots[mask].tolist(), strict=True))  # type: ignore[index]
        self._parked.push(parked)

    def take(
        self,
        k: int,
        ref: np.ndarray | array,
        protected: Any,
        prot_mark: np.ndarray,
        stamps: np.ndarray | None = None,
        limit: int | None = None,
    ) -> Any:
        """The next (up to) ``k`` evictable slots in list order, oldest first.

        Evictable: ``ref[s] == 0`` (ready, not pinned) and ``s`` not in ``protected``
        (``prot_mark[s] == 1`` exactly for the slots of ``protected``).
        The returned slots stay in the list but are parked; the caller must either
        :meth:`discard` them (evicted) or give them back with :meth:`on_evictable`. Calls may be repeated to
        continue the same scan. Observable order never changes.

        ``protected`` a ``list`` (a small call): the answer is a list, found entry by entry for
        a bounded number of steps (then the vectorised scan goes on); ``ref`` may then be any
        ``int32`` buffer (``array('i')``). Else ``int64`` arrays in and out.

        ``stamps`` (an ``int64`` array) and ``limit``: stop at the first evictable, unprotected slot
        whose ``stamps[s] > limit`` (it is not taken); the caller promises that stamps never decrease
        along the list, so no later slot could be taken either.
        """
        if protected.__class__ is not list:
            return self._take_array(k, ref, protected, prot_mark, stamps, limit)  # type: ignore[arg-type]
        self.past_limit = -1
        if k <= 0:
            return []
        ref_s = ref.data if ref.__class__ is np.ndarray else ref
        prot = prot_mark.data  # all 0 but for ``protected``
        st = stamps.data if stamps is not None and limit is not None else None
        lim = 0 if limit is None else limit  # (read only with ``st``)
        out: list[int] = []
        deferred: list[tuple[int, int]] = []
        parked = self._parked
        member, pos, lid = self._mm, self._pm, self.lid
        past = -1
        while parked.heap and len(out) < k:
            ps, s = parked.pop()
            if member[s] != lid or pos[s] != ps or ref_s[s]:
                continue  # moved/removed since it was parked, or pinned again
            if prot[s]:
                deferred.append((ps, s))
                continue
            if st is not None and st[s] > lim:
                deferred.append((ps, s))  # back on the heap, untaken; nothing later qualifies
                past = s
                break
            out.append(s)
        if len(out) < k and past < 0:
            h0, buf, base = self.head, self._bm, self.base
            stop = min(self.tail, h0 + SCAN_BUDGET + 4 * k)
            for h in range(h0, stop):
                s = buf[h]
                if member[s] != lid or pos[s] != base + h or ref_s[s]:
                    continue  # stale entry, or parked (pinned/pending) from now on
                if prot[s]:
                    deferred.append((base + h, s))
                    continue
                if st is not None and st[s] > lim:
                    past = s  # the scan ends before it, untaken
                    break
                out.append(s)
                if len(out) == k:
                    h += 1
                    break
            else:
                h = stop
            self.head = h
            self.scanned = True
        if deferred:
            parked.push(deferred)
        self.past_limit = past
        if len(out) < k and past < 0 and self.head < self.tail:
            ref_np = ref if ref.__class__ is np.ndarray else np.frombuffer(ref, dtype=np.int32)
            prot_np = np.array(protected, dtype=np.int64) if protected else _EMPTY_I64
            out.extend(self._take_array(k - len(out), ref_np, prot_np, prot_mark, stamps, limit).tolist())
        return out

    def _take_array(
        self,
        k: int,
        ref: np.ndarray,
        protected: np.ndarray,
        prot_mark: np.ndarray,
        stamps: np.ndarray | None = None,
        limit: int | None = None,
    ) -> np.ndarray:
        """:meth:`take` with arrays."""
        self.past_limit = -1
        if k <= 0:
            return _EMPTY_I64
        out: list[int] = []
        deferred: list[tuple[int, int]] = []
        parked = self._parked
        member, pos, lid = self.member, self.pos, self.lid
        has_prot = len(protected) > 0
        limited = stamps is not None and limit is not None
        past = -1
        while parked and len(out) < k:
            ps, s = parked.pop()
            if member[s] != lid or pos[s] != ps:
                continue  # moved or removed since it was parked
            if ref[s] != 0:
                continue  # pinned again: stays parked until its next unpin
            if has_prot and prot_mark[s]:
                deferred.append((ps, s))
                continue
            if limited and stamps[s] > limit:  # type: ignore[index,operator]
                deferred.append((ps, s))  # back on the heap, untaken; nothing later qualifies
                past = s
                break
            out.append(s)
        taken = np.array(out, dtype=np.int64) if out else _EMPTY_I64
        chunks = [taken]
        need = 0 if past >= 0 else k - len(out)
        extra = max(64, need // 4)  # entries read past ``need``, doubled each round (long runs of stale entries)
        while need > 0 and self.head < self.tail:
            h = self.head
            end = min(self.tail, h + need + extra)
            extra *= 2
            seg = self.buf[h:end].astype(np.int64)
            ev = ref[seg] == 0
            ev &= member[seg] == lid
            ev &= pos[seg] == np.arange(self.base + h, self.base + end, dtype=np.int64)  # current entries
            if has_prot:
                prot = prot_mark[seg].astype(bool)
                cand = ev & ~prot
            else:
                prot = None
                cand = ev
            idx = cand.nonzero()[0]
            over = len(idx)
            if limited and over:
                over = int(np.searchsorted(stamps[seg[idx]], limit, side="right"))  # type: ignore[index,call-overload]
            if over < min(len(idx), need):  # the first slot past the limit ends the scan, untaken
                consumed = int(idx[over])
                past = int(seg[consumed])
                idx = idx[:over]
            elif len(idx) >= need:
                idx = idx[:need]
                consumed = int(idx[-1]) + 1
            else:
                consumed = end - h
            if prot is not None:
                pe = (ev[:consumed] & prot[:consumed]).nonzero()[0]
                for s in seg[pe].tolist():
                    deferred.append((int(pos[s]), s))
            chunks.append(seg[idx])
            need = 0 if past >= 0 else need - len(idx)
            self.head = h + consumed
            self.scanned = True
        parked.push(deferred)
        self.past_limit = past
        if len(chunks) == 1:
            return taken
        if len(chunks) == 2 and not out:
            return chunks[1]
        return np.concatenate(chunks)

    def peek(self, k: int, ref: np.ndarray, protected: Any, prot_mark: np.ndarray) -> Any:
        """The slots :meth:`take` would return for ``k``, without taking them.

        No observable change: the entries before the first evictable one are passed as
        :meth:`take` passes them (stale ones dropped, pinned or pending ones parked), so repeated
        peeks do not rescan them. A following ``take(j)`` for ``j <= k`` returns the first ``j``.
        ``protected`` a ``list``: the answer is a list, else an ``int64`` array.
        """
        few = protected.__class__ is list
        if k <= 0:
            return [] if few else _EMPTY_I64
        member, pos, lid = self.member, self.pos, self.lid
        has_prot = len(protected) > 0
        out: list[int] = []
        parked = self._parked
        while parked:  # drop what take() would drop: moved or removed since parked, or pinned again
            ps, s = parked.first()
            if member[s] == lid and pos[s] == ps and ref[s] == 0:
                break
            parked.pop()
        if parked and k == 1 and not (has_prot and prot_mark[parked.first()[1]]):
            s = parked.first()[1]  # the oldest parked slot is evictable again
            return [s] if few else np.array([s], dtype=np.int64)
        if parked:
            ahead = parked.smallest(4 * k + 16)
            for ps, s in ahead:
                if len(out) == k:
                    break
                if member[s] == lid and pos[s] == ps and ref[s] == 0 and not (has_prot and prot_mark[s]):
                    out.append(s)
            if len(out) < k and len(ahead) < len(parked):
                out = []
                for ps, s in parked.smallest(len(parked)):
                    if len(out) == k:
                        break
                    if member[s] == lid and pos[s] == ps and ref[s] == 0 and not (has_prot and prot_mark[s]):
                        out.append(s)
        h = self.head
        if not out and k <= 8 and not parked:  # a few: entry by entry for a bounded number of steps
            buf, mm, pm, base = self._bm, self._mm, self._pm, self.base
            ref_s = ref.data
            prot = prot_mark.data if has_prot else None
            stop = min(self.tail, h + SCAN_BUDGET + 4 * k)
            passing = True
            while h < stop:
                s = buf[h]
                if mm[s] == lid and pm[s] == base + h and ref_s[s] == 0:
                    if passing:
                        self.head = h
                        self.scanned = True
                        passing = False
                    if prot is None or not prot[s]:
                        out.append(s)
                        if len(out) == k:
                            break
                h += 1
            if passing:
                self.head = h
                self.scanned = True
            if len(out) == k or h >= self.tail:
                return out if few else np.array(out, dtype=np.int64) if out else _EMPTY_I64
        chunks = [np.array(out, dtype=np.int64)] if out else []
        need = k - len(out)
        while need > 0 and h < self.tail:
            end = min(self.tail, h + need + max(64, need // 4))
            seg = self.buf[h:end].astype(np.int64)
            ev = ref[seg] == 0
            ev &= member[seg] == lid
            ev &= pos[seg] == np.arange(self.base + h, self.base + end, dtype=np.int64)
            if h == self.head:  # pass the leading entries no scan needs (stale) or may (parked)
                self.head = h + (int(ev.argmax()) if ev.any() else len(seg))
                self.scanned = True
            if has_prot:
                ev &= ~prot_mark[seg].astype(bool)
            idx = ev.nonzero()[0][:need]
            chunks.append(seg[idx])
            need -= len(idx)
            h = end
        if not chunks:
            return [] if few else _EMPTY_I64
        got = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return got.tolist() if few else got
