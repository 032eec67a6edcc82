"""The shared tier beneath host memory in the cache-level replay: Redis with ``allkeys-lru``, as an LRU.

A Redis server configured as kvoffload's tests and docs (docs/tiers.md) configure it (``maxmemory`` and
``maxmemory-policy allkeys-lru``) holding offloaded blocks, one value per block, is modelled by
:class:`LRUTierModel`: an exact LRU over block ids with room for ``capacity`` blocks (the tier's
bytes divided by one block's bytes; keys and Redis's per-key overhead are not counted). What
refreshes a block's recency follows what the three commands kvoffload's ``RedisTier`` sends do in
Redis 7 (``src/db.c``, ``src/t_string.c``):

* ``EXISTS`` (the lookup probe, :meth:`LRUTierModel.contains`) looks keys up with
  ``LOOKUP_NOTOUCH``: it does **not** refresh recency;
* ``GET`` (the load of a tier hit promoted into host memory, :meth:`LRUTierModel.read`) looks the
  key up for reading: it refreshes recency;
* ``SET key value NX`` (the write-through of a block stored into host memory,
  :meth:`LRUTierModel.write`) first looks the key up for writing (``lookupKeyWrite``, which
  refreshes recency) and, when it is present, leaves its value alone: a present block becomes
  most recent, an absent one is added as most recent, evicting the least recent blocks beyond
  the capacity, one command at a time (Redis frees memory before each command it runs).

Redis's LRU is an approximation: it evicts the least recent of a small random sample of keys
(``maxmemory-samples``, 5 by default, through a pool of good candidates), not the least recent of
all keys. This model is the exact LRU that approximation aims at; a real server's figures differ
somewhat (not always downward). The capacity counts block values only: a server's ``maxmemory``
also holds the keys, kvoffload's value headers and Redis's per-key overhead, so it needs a little
more than the tier capacity given here. Verdict caches and probe latency are not modelled either:
a lookup sees the tier as it is at that moment.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvoffload.checks import check_int

__all__ = ["LRUTierModel"]


class LRUTierModel:
    """An LRU over block ids holding at most ``capacity`` blocks (0: a tier that keeps nothing).

    Attributes:
        capacity: blocks the tier holds at most.
        evictions: blocks evicted so far.
        writes: blocks added (``SET NX`` of an absent block).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = check_int(capacity, "tier capacity", 0)
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.evictions = 0
        self.writes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def contains(self, block: int) -> bool:
        """``EXISTS``: whether the block is held; recency is left alone."""
        return block in self._lru

    def read(self, blocks: Iterable[int]) -> None:
        """``GET`` of held blocks, in order: each becomes the most recent."""
        move = self._lru.move_to_end
        for b in blocks:
            move(b)

    def write(self, blocks: Iterable[int]) -> None:
        """``SET NX`` of blocks, in order: a held block becomes the most recent, an absent one is
        added as the most recent, and the least recent blocks beyond the capacity are evicted."""
        if not self.capacity:
            return
        lru, cap = self._lru, self.capacity
        for b in blocks:
            if b in lru:
                lru.move_to_end(b)
                continue
            lru[b] = None
            self.writes += 1
            if len(lru) > cap:
                lru.popitem(last=False)
                self.evictions += 1
