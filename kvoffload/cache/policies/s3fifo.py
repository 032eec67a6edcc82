"""S3-FIFO (Yang et al., SOSP 2023) adapted to pinned/pending offloaded blocks.

Why this policy for prefix-sharing workloads: a prompt is a shared prefix (system prompt,
few-shot examples, a document, a conversation so far) followed by a tail unique to the
request. Offloading stores every block, so the pool sees a stream of one-hit wonders (the
unique tails, and the generated tokens of conversations that never come back) interleaved
with blocks that will be hit again. Under LRU one burst of long unique prompts flushes the
shared prefixes; ARC reacts, but only after ghost hits tell it to. S3-FIFO admits new blocks
into a small FIFO queue (10% of the pool): a block that is not hit again before it reaches
the head of that queue is evicted quickly (its key goes to a ghost queue), a block that was
hit meanwhile is promoted to the main queue, where blocks survive as long as they keep being
hit (a 2-bit hit counter gives them up to three extra passes). A block evicted from the small
queue whose key comes back is admitted straight into the main queue. Touching is a counter
increment (no list reordering), so ``touch`` is also the cheapest of the three policies.

Where it fails: traffic whose blocks are read exactly twice, long apart (every conversation of
exactly two turns, the second after the small queue's lifetime). First turns leave the small
queue before their second turn and enter the ghost; the second turn is admitted straight into the
main queue, where it is dead, and the main queue (90 % of the pool) fills with dead blocks: on
``kvoffload simulate --suite two-turn`` S3-FIFO loads about 0.6x what LRU loads at a pool of a
fifth of the working set (``tests/simulate/test_suite.py``). ``headstart`` measures this case and
falls back to LRU.

Rules (the reference model in the tests implements exactly these):

* insert (pending blocks, call order): key in the ghost queue -> leaves it, goes to the
  tail of M; otherwise tail of S. Hit counter 0.
* touch: every present key's counter += 1 (once per call, capped at 3). Absent keys ignored.
* evict ``n``: repeat until ``n`` victims: if ``|S| >= small_target`` (``max(1, capacity //
  10)``) or M has no evictable block, take the oldest evictable block of S: counter > 0 ->
  moves to the tail of M with counter 0; else evicted, its key appended to the ghost queue
  (bounded to ``capacity`` keys, oldest dropped). Otherwise take the oldest evictable block of
  M: counter > 0 -> counter - 1 and re-queued at the tail of M; else evicted. If S has no
  evictable block either, take from M. Pinned, pending and protected blocks are skipped in
  place (they keep their queue position).

The manager only asks for ``n`` victims when ``n`` evictable, unprotected blocks exist, so
eviction always succeeds and needs no roll-back. Storage: two
:class:`~kvoffload.cache.policies.order.SlotOrder` queues, an ``int8`` counter per slot,
an ``OrderedDict`` ghost queue.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy, Slots
from kvoffload.cache.policies.order import SlotOrder

logger = logging.getLogger(__name__)

__all__ = ["S3FIFOPolicy"]

_S = 1
_M = 2
_MAX_FREQ = 3


class S3FIFOPolicy(CachePolicy):
    """Small FIFO + main FIFO with lazy promotion and a ghost queue (see the module docstring)."""

    name = "s3fifo"
    takes_lists = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.freq = np.zeros(capacity, dtype=np.int8)
        self._freq_mv = self.freq.data
        self.small = SlotOrder(_S, self.member, self.pos, capacity)
        self.main = SlotOrder(_M, self.member, self.pos, capacity)
        self.ghost: OrderedDict[bytes, None] = OrderedDict()
        self.small_target = max(1, capacity // 10)

    def insert(self, slots: Slots, keys: Sequence[bytes]) -> None:
        ghost = self.ghost
        if slots.__class__ is list:
            freq = self._freq_mv
            for s in slots:
                freq[s] = 0
            if not ghost or not any(k in ghost for k in keys):
                self.small.push_back(slots)
                return
            hit_l = [k in ghost for k in keys]
            for k, h in zip(keys, hit_l, strict=True):
                if h:
                    del ghost[k]
            self.small.push_back([s for s, h in zip(slots, hit_l, strict=True) if not h])
            self.main.push_back([s for s, h in zip(slots, hit_l, strict=True) if h])
            return
        self.freq[slots] = 0
        if ghost:
            hit = np.fromiter((k in ghost for k in keys), dtype=bool, count=len(keys))
            if hit.any():
                for i in hit.nonzero()[0].tolist():
                    del ghost[keys[i]]
                self.small.push_back(slots[~hit])  # type: ignore[call-overload]
                self.main.push_back(slots[hit])  # type: ignore[call-overload]
                return
        self.small.push_back(slots)

    def remove(self, slots: Slots) -> None:
        self.small.discard(slots)
        self.main.discard(slots)

    def touch(self, keys: Sequence[bytes], slots: Slots, unique: bool = False) -> None:
        if slots.__class__ is list:
            freq = self._freq_mv
            for s in set(slots):
                if s >= 0 and freq[s] < _MAX_FREQ:
                    freq[s] += 1
            return
        present = slots[slots >= 0]  # type: ignore[call-overload,operator]
        if len(present):
            if not unique:
                present = np.unique(present)
            f = self.freq[present]
            self.freq[present] = np.minimum(f + 1, _MAX_FREQ)

    def on_evictable(self, slots: Slots) -> None:
        self.small.on_evictable(slots)
        self.main.on_evictable(slots)

    def evict(self, n: int, protected: Slots) -> Any:
        if protected.__class__ is list:  # small calls evict with the array form too
            got = self.evict(n, np.array(protected, dtype=np.int64))
            return None if got is None else got.tolist()  # type: ignore[union-attr]
        ref, freq = self.table.ref, self.freq
        small, main = self.small, self.main
        victims: list[np.ndarray] = []
        rem = n
        main_dry = False
        small_dry = False
        while rem > 0:
            allowance = len(small) - self.small_target + 1
            if (allowance > 0 or main_dry) and not small_dry:
                want = rem if main_dry else min(rem, allowance)
                got = small.take(want, ref, protected, self.table.prot_mark)
                if len(got) < want:
                    small_dry = True
                if len(got) == 0:
                    if main_dry:
                        break
                    continue
                hit = freq[got] > 0
                if main_dry and allowance <= 0 and hit.any():
                    # only here because M had nothing evictable: the first promotion gives
                    # M a candidate, and the next step goes back to M
                    cut = int(np.argmax(hit)) + 1
                    small.on_evictable(got[cut:])
                    got, hit = got[:cut], hit[:cut]
                promoted = got[hit]
                dead = got[~hit]
                if len(promoted):
                    small.discard(promoted)
                    freq[promoted] = 0
                    main.push_back(promoted)
                    main_dry = False
                if len(dead):
                    small.discard(dead)
                    ghost = self.ghost
                    for key in self.table.keys[dead].tolist():  # cheaper than OrderedDict.update
                        ghost[key] = None
                    victims.append(dead)
                    rem -= len(dead)
                continue
            got = main.take(rem, ref, protected, self.table.prot_mark)
            if len(got) == 0:
                main_dry = True
                if small_dry:
                    break
                continue
            hit = freq[got] > 0
            again = got[hit]
            dead = got[~hit]
            if len(again):
                freq[again] -= 1
                main.push_back(again)
            if len(dead):
                main.discard(dead)
                victims.append(dead)
                rem -= len(dead)
        if rem > 0:  # pragma: no cover - the manager checks that enough evictable blocks exist
            raise RuntimeError("s3fifo: fewer evictable blocks than the manager counted")
        for _ in range(len(self.ghost) - self.capacity):
            self.ghost.popitem(last=False)
        return victims[0] if len(victims) == 1 else np.concatenate(victims)

    def clear(self) -> None:
        self.member[:] = 0
        self.freq[:] = 0
        self.small.clear()
        self.main.clear()
        self.ghost.clear()

    def ordered_slots(self) -> tuple[list[int], list[int]]:
        """(small, main) queues, oldest first (O(capacity); tests/debugging)."""
        return self.small.ordered(), self.main.ordered()

    def metadata_nbytes(self) -> int:
        return self.member.nbytes + self.pos.nbytes + self.freq.nbytes + self.small.buf.nbytes + self.main.buf.nbytes
