"""Adaptive Replacement Cache with vLLM's semantics (docs/contract.md §3), on numpy slot lists."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy, Slots
from kvoffload.cache.policies.lru import first_occurrences
from kvoffload.cache.policies.order import SlotOrder

logger = logging.getLogger(__name__)

__all__ = ["ARCPolicy"]

_T1 = 1
_T2 = 2


class ARCPolicy(CachePolicy):
    """ARC: T1 (blocks seen once), T2 (seen again), ghost lists B1/B2, adaptive T1 target.

    * New (pending) blocks go to the most-recent end of T1 in call order, and leave B1/B2.
    * ``touch`` (keys processed last to first, so ``keys[0]`` ends most recent): a T1 block
      still pending stays in T1 (moved to most recent); a ready T1 block moves to T2 (most
      recent); a T2 block is refreshed; a ghost hit in B1 raises the target by
      ``max(1, |B2|/|B1|)`` (capped at capacity), in B2 lowers it by ``max(1, |B1|/|B2|)``
      (floored at 0); the ghost entry moves to its list's most-recent end.
    * Eviction of ``n`` blocks, atomic: while ``|T1|`` (minus the T1 victims already chosen)
      is at least ``int(target)``, the next evictable T1 block, else the next evictable T2
      block. Evicted keys go to the most-recent end of B1/B2; then each ghost list is
      trimmed (oldest first) to ``capacity`` entries.

    When T2 has no evictable block left while T1 is below its target, the remaining victims
    come from T1 (vLLM 0.32 does the same), so ``prepare_store`` fails only when room really
    cannot be made (docs/contract.md §2).

    Storage: two :class:`~kvoffload.cache.policies.order.SlotOrder` lists sharing one
    ``int8`` membership and one ``int64`` position array; ghosts are ``OrderedDict`` s of
    keys (bounded to ``capacity`` each). Costs are O(k) amortised for ``k`` keys.
    """

    name = "arc"
    takes_lists = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.t1 = SlotOrder(_T1, self.member, self.pos, capacity)
        self.t2 = SlotOrder(_T2, self.member, self.pos, capacity)
        # the shared arrays as memoryviews: single-slot reads on the scalar paths (Python ints)
        self._member_mv = self.member.data
        self._pos_mv = self.pos.data
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.target_t1_size: float = 0.0

    def insert(self, slots: Slots, keys: Sequence[bytes]) -> None:
        self.t1.push_back(slots, fresh=True)  # new blocks are in no list
        b1, b2 = self.b1, self.b2
        if b1 or b2:  # a test and a del: cheaper than OrderedDict.pop, mostly a miss
            for key in keys:
                if key in b1:
                    del b1[key]
                if key in b2:
                    del b2[key]

    def remove(self, slots: Slots) -> None:
        self.t1.discard(slots)
        self.t2.discard(slots)

    def touch(self, keys: Sequence[bytes], slots: Slots, unique: bool = False) -> None:
        if isinstance(slots, list):
            slots = np.array(slots, dtype=np.int64)
        present_mask = slots >= 0
        present = slots[present_mask]
        if len(present):
            rp = (present if unique else first_occurrences(present))[::-1]
            in_t1 = self.member[rp] == _T1
            ready = self.table.ref[rp] >= 0
            promote = in_t1 & ready
            if promote.any():
                self.t1.discard(rp[promote])
            self.t1.push_back(rp[in_t1 & ~ready], members=True)
            self.t2.push_back(rp[~in_t1 | ready])
        if (self.b1 or self.b2) and len(present) < len(keys):
            self._ghost_hits([keys[i] for i in (~present_mask).nonzero()[0][::-1].tolist()])

    def _ghost_hits(self, keys: Iterable[bytes]) -> None:
        """Adapt the target for each ghost hit among ``keys`` (absent keys), in this order."""
        b1, b2 = self.b1, self.b2
        target, cap = self.target_t1_size, float(self.capacity)
        for key in keys:  # max(1.0, ratio) and the clamps written out: the same floats, no builtin calls
            if key in b1:
                ratio = len(b2) / len(b1)
                target += ratio if ratio > 1.0 else 1.0
                if target > cap:
                    target = cap
                b1.move_to_end(key)
            elif key in b2:
                ratio = len(b1) / len(b2)
                target -= ratio if ratio > 1.0 else 1.0
                if target < 0.0:
                    target = 0.0
                b2.move_to_end(key)
        self.target_t1_size = target

    def on_store_miss(self, keys: Sequence[bytes]) -> None:
        """Ghost hits among keys offered for storing adapt the target (last key first), as in touch."""
        if self.b1 or self.b2:
            self._ghost_hits(reversed(keys))

    def on_request_finished(self, keys: Sequence[bytes], slots: Slots, inserted_only: Slots, reused: Slots) -> None:
        """vLLM's request-scoped ARC: a block the request only stored is refreshed in its own list
        (a store is not a second access, so T1 stays T1); a ready block it reused moves from T1
        to T2 or is refreshed in T2; other keys are left alone. Ghost lists are not consulted
        here (that happens at store time, :meth:`on_store_miss`)."""
        if slots.__class__ is list:  # one pass, last key first, straight into both logs
            t1, t2 = self.t1, self.t2
            t1.reserve(len(slots))
            t2.reserve(len(slots))
            member, pos, buf1, buf2 = self._member_mv, self._pos_mv, t1._bm, t2._bm
            i1, i2, base1, base2 = t1.tail, t2.tail, t1.base, t2.base
            promoted = 0
            for s, ins, reu in zip(reversed(slots), reversed(inserted_only), reversed(reused)):  # type: ignore[call-overload]  # noqa: B905 (hot: see keytable)
                if s < 0:
                    continue
                if member[s] == _T1:
                    if ins:  # refreshed in T1
                        buf1[i1] = s
                        pos[s] = base1 + i1
                        i1 += 1
                        continue
                    if not reu:
                        continue
                    member[s] = _T2  # promoted: its T1 entry goes stale
                    promoted += 1
                elif not (ins or reu):
                    continue
                buf2[i2] = s
                pos[s] = base2 + i2
                i2 += 1
            t1.tail, t2.tail = i1, i2
            if promoted:
                t1.size -= promoted
                t2.size += promoted
            return
        present = slots >= 0  # type: ignore[operator]
        if not present.any():
            return
        idx = present.nonzero()[0][::-1]
        rp = slots[idx]  # type: ignore[call-overload]
        ins, reu = inserted_only[idx], reused[idx] & ~inserted_only[idx]  # type: ignore[call-overload]
        in_t1 = self.member[rp] == _T1
        promote_m = in_t1 & reu
        if promote_m.any():
            self.t1.discard(rp[promote_m])
        self.t1.push_back(rp[in_t1 & ins], members=True)
        self.t2.push_back(rp[promote_m | (~in_t1 & (ins | reu))])

    def on_evictable(self, slots: Slots) -> None:
        if slots.__class__ is list:
            t1, t2 = self.t1, self.t2  # a slot may be parked only below its list's scan position
            if not (t1.scanned or t2.scanned):
                return
            lim1, lim2, pos, member = t1.base + t1.head, t2.base + t2.head, self._pos_mv, self._member_mv
            limit = lim1 if lim1 > lim2 else lim2
            for s in slots:
                if pos[s] < limit and pos[s] < (lim1 if member[s] == _T1 else lim2):
                    t1.on_evictable(slots)
                    t2.on_evictable(slots)
                    return
            return
        self.t1.on_evictable(slots)
        self.t2.on_evictable(slots)

    def evict(self, n: int, protected: Slots) -> Any:
        if protected.__class__ is not list:
            got = self._pick(n, protected)  # type: ignore[arg-type]
            if got is None:
                return None
            return got[0] if len(got) == 1 else np.concatenate(got)
        # a small call: _pick's steps on lists, each done once
        t1, t2, t = self.t1, self.t2, self.table
        ref, mark = t.ref_buf, t.prot_mark
        target = int(self.target_t1_size)
        got1: list[int] = []
        got2: list[int] = []
        more: list[int] = []
        t1_left = True
        if t1.size >= target:
            want = min(n, t1.size - target + 1)
            got1 = t1.take(want, ref, protected, mark)
            t1_left = len(got1) == want
        rem = n - len(got1)
        if rem:
            got2 = t2.take(rem, ref, protected, mark)
            rem -= len(got2)
            if rem and t1_left:
                more = t1.take(rem, ref, protected, mark)
                rem -= len(more)
        from_t1 = got1 + more if more else got1
        if rem:
            t1.on_evictable(from_t1)
            t2.on_evictable(got2)
            return None
        keys = t.keys
        if from_t1:
            t1.discard(from_t1, members=True)
            self._remember(self.b1, [keys[s] for s in from_t1])
        if not got2:
            return from_t1
        t2.discard(got2, members=True)
        self._remember(self.b2, [keys[s] for s in got2])
        return got1 + got2 + more

    def _remember(self, ghost: OrderedDict[bytes, None], keys: Iterable[bytes]) -> None:
        """Add the evicted ``keys`` to ``ghost`` (most recent last), trimmed to ``capacity`` entries."""
        for key in keys:  # cheaper than OrderedDict.update
            ghost[key] = None
        for _ in range(len(ghost) - self.capacity):
            ghost.popitem(False)

    def _pick(self, n: int, protected: np.ndarray) -> list[np.ndarray] | None:
        """Choose ``n`` victims (T1 while at or above target, else T2, then T1), forget them, record
        their keys as ghosts; per list the victims. None: nothing changed."""
        target = int(self.target_t1_size)
        picks: list[tuple[np.ndarray, SlotOrder]] = []
        rem = n
        t1_left = True
        t = self.table
        if len(self.t1) >= target:
            want = min(rem, len(self.t1) - target + 1)
            got = self.t1.take(want, t.ref, protected, t.prot_mark)
            picks.append((got, self.t1))
            rem -= len(got)
            t1_left = len(got) == want
        if rem > 0:
            got = self.t2.take(rem, t.ref, protected, t.prot_mark)
            picks.append((got, self.t2))
            rem -= len(got)
        if rem > 0 and t1_left:
            got = self.t1.take(rem, t.ref, protected, t.prot_mark)
            picks.append((got, self.t1))
            rem -= len(got)
        if rem > 0:
            for got, lst in picks:
                lst.on_evictable(got)
            return None
        out = []
        for got, lst in picks:
            if len(got):
                out.append(got)
                lst.discard(got, members=True)
                self._remember(self.b1 if lst is self.t1 else self.b2, t.keys[got].tolist())
        return out

    def clear(self) -> None:
        self.member[:] = 0
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def ordered_slots(self) -> tuple[list[int], list[int]]:
        """(T1, T2) slots, least recent first (O(capacity); tests/debugging)."""
        return self.t1.ordered(), self.t2.ordered()

    def metadata_nbytes(self) -> int:
        return self.member.nbytes + self.pos.nbytes + self.t1.buf.nbytes + self.t2.buf.nbytes
