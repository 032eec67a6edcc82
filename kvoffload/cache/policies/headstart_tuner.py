"""Picks the ``headstart`` policy's head start online, by miniature simulation.

The right head start for blocks seen before depends on the workload: on conversations that go on
for many turns, a block held by a second request is likely to be read again and should outlive
first-sight blocks by a lot; where every conversation has exactly two turns, "seen before" means
"done", and the best head start is none (plain LRU). Ghost-hit counting (ARC-style) adapts, but to
the wrong quantity. Instead the tuner *measures* the candidates, as in miniature simulation
(Waldspurger et al., USENIX ATC 2017): a fixed sample of the keys (those whose fingerprint falls in
a range, so a key is always in or always out) drives one small two-class cache per candidate head
start, each of ``capacity * sample_rate`` blocks, and the policy adopts the candidate whose small
cache hit most often lately.

Rules (the reference model in the tests implements exactly these):

* a key's fingerprint is ``fingerprints([key])``: its CRC-32 through the ``lowbias32`` integer
  mixer (CRC-32 alone is linear: runs of similar keys would collide together).
* a key is sampled iff ``fingerprint >> 20 < threshold`` with ``threshold = min(4096,
  ceil(4096 * SAMPLE_BLOCKS / capacity))``; every small cache holds ``mini = max(1, capacity *
  threshold // 4096)`` blocks.
* :meth:`HeadStartTuner.observe` feeds the sampled accesses, in order, to every small cache,
  which know keys by fingerprint: a key
  present is a hit (``hits += 1``; it moves to the seen list, most recent, stamped with the small
  cache's clock); an absent one is inserted -- after evicting one block if the cache is full: the
  oldest first-sight block if its stamp ``<= `` the oldest seen block's stamp ``+ h * mini``, else
  the oldest seen block; the victim's key goes to a FIFO ghost of ``4 * mini`` keys -- into the
  seen list if its key was in the ghost (and leaves it), else into the first-sight list, stamped
  with the clock, which then advances by one.
* the head start starts at 0 (plain LRU, candidate 0); after every ``mini`` sampled keys, the
  policy's head start becomes ``round(h * capacity)`` of
  the candidate with the most hits (the current one while it ties for most; else the first
  best), and every count is halved (``hits //= 2``).
"""

from __future__ import annotations

import logging
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["CANDIDATES", "SAMPLE_BLOCKS", "HeadStartTuner", "fingerprint", "fingerprints"]

#: head starts tried, in capacities (0 is plain LRU; 16 ranks every seen block first in practice)
CANDIDATES = (0.0, 1.0, 4.0, 16.0)
#: blocks held by each small cache (for capacities of at least this many blocks)
SAMPLE_BLOCKS = 128
_RANGE = 4096
_START = 0  # index of the initial candidate (0: plain LRU until the small caches say otherwise)


#: the ``lowbias32`` mixer's multipliers (:func:`fingerprints` and :func:`fingerprint`)
_MIX1, _MIX2 = 0x7FEB352D, 0x846CA68B


def fingerprints(keys: Sequence[bytes]) -> np.ndarray:
    """``uint32`` fingerprint of every key: ``lowbias32(crc32(key))``."""
    x = np.frombuffer(array("I", map(zlib.crc32, keys)), dtype=np.uintc)  # uint32; cheaper than fromiter
    x ^= x >> 16
    x *= np.uint32(_MIX1)
    x ^= x >> 15
    x *= np.uint32(_MIX2)
    x ^= x >> 16
    return x


def fingerprint(key: bytes) -> int:
    """One key's fingerprint, equal to ``fingerprints([key])[0]`` (scalar code, for a few keys)."""
    x = zlib.crc32(key)
    x ^= x >> 16
    x = (x * _MIX1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * _MIX2) & 0xFFFFFFFF
    return x ^ (x >> 16)


class _SmallCache:
    """One candidate's two-class LRU over sampled keys (the module's rules)."""

    __slots__ = ("size", "head_start", "new", "seen", "ghost", "clock", "hits")

    def __init__(self, size: int, head_start: float) -> None:
        self.size = size
        self.head_start = head_start * size
        self.new: OrderedDict[int, int] = OrderedDict()
        self.seen: OrderedDict[int, int] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.clock = 0
        self.hits = 0

    def run(self, keys: list[int]) -> None:
        """Access ``keys`` in order (the module's rules; one call per run of keys: the state lives in
        locals meanwhile)."""
        new, seen, ghost = self.new, self.seen, self.ghost
        size, head_start, clock, hits = self.size, self.head_start, self.clock, self.hits
        ghost_size = 4 * size
        for key in keys:
            if key in seen:
                hits += 1
                seen.move_to_end(key)
                seen[key] = clock
                continue
            if key in new:
                hits += 1
                del new[key]
                seen[key] = clock
                continue
            if len(new) + len(seen) >= size:
                if new and (not seen or new[next(iter(new))] <= seen[next(iter(seen))] + head_start):
                    victim = new.popitem(last=False)[0]
                else:
                    victim = seen.popitem(last=False)[0]
                ghost[victim] = None
                if len(ghost) > ghost_size:
                    ghost.popitem(last=False)
            if ghost.pop(key, 0) is None:
                seen[key] = clock
            else:
                new[key] = clock
            clock += 1
        self.clock, self.hits = clock, hits

    def clear(self) -> None:
        self.new.clear()
        self.seen.clear()
        self.ghost.clear()
        self.clock = self.hits = 0


class HeadStartTuner:
    """Miniature simulations of :data:`CANDIDATES` over a sample of the keys (module docstring).

    Args:
        capacity: the policy's capacity in blocks (``>= 1``).

    Attributes:
        head_start: the head start in use, in blocks of the policy's clock.
        threshold / mini: the sampling threshold (out of 4096) and each small cache's size.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.threshold = min(_RANGE, -(-_RANGE * SAMPLE_BLOCKS // capacity))
        self.mini = max(1, capacity * self.threshold // _RANGE)
        self._below = min(self.threshold << 20, 2**32 - 1)  # sampled: fingerprint < this
        self.caches = [_SmallCache(self.mini, h) for h in CANDIDATES]
        self.clear()

    def clear(self) -> None:
        """Forget everything and go back to the initial candidate."""
        for c in self.caches:
            c.clear()
        self.choice = _START
        self.head_start = round(CANDIDATES[_START] * self.capacity)
        self.sampled = 0

    def observe(self, fp: np.ndarray | list[int]) -> None:
        """Accesses, in order, given as the keys' :func:`fingerprints` (``uint32``; a list of ints for
        a few keys)."""
        if isinstance(fp, list):
            below = self._below
            keys = fp if self.threshold >= _RANGE else [f for f in fp if f < below]
        else:
            if self.threshold < _RANGE:
                sampled = fp < self._below
                if not np.count_nonzero(sampled):
                    return  # none sampled (most calls at large capacities)
                fp = fp[sampled]
            keys = fp.tolist()
        while keys:  # each small cache takes the keys up to the next choice at once
            run, keys = keys[: self.mini - self.sampled], keys[self.mini - self.sampled :]
            for c in self.caches:
                c.run(run)
            self.sampled += len(run)
            if self.sampled >= self.mini:
                self._choose()

    def _choose(self) -> None:
        self.sampled = 0
        hits = [c.hits for c in self.caches]
        best = max(hits)
        if hits[self.choice] != best:
            self.choice = hits.index(best)
            self.head_start = round(CANDIDATES[self.choice] * self.capacity)
        for c in self.caches:
            c.hits //= 2
