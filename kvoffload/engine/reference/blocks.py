"""GPU block pool of one KV-cache group, with the engine's own GPU prefix cache.

Block 0 is the *null block*: it stands for the positions of a sliding-window group that lie
before the attention window (never allocated, never written, never cached). Free blocks wait in
an LRU queue (oldest first); a free block may still be *cached* (its hash -> block entry kept) and
is then reusable by a prefix hit until the allocator evicts it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["BlockPool", "GPUBlockCache", "NULL_BLOCK"]

NULL_BLOCK = 0


class BlockPool:
    """Reference-counted GPU blocks ``1..num_blocks-1`` plus a hash -> block prefix cache.

    Args:
        num_blocks: blocks in the group's KV tensors (block 0 is the null block).
        enable_caching: keep a prefix cache (False: blocks are forgotten when freed).
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.cached: dict[bytes, int] = {}
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.num_evicted = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks (ref count 1), evicting cached free blocks oldest first; None if short."""
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.block_hash[b] = None
                self.num_evicted += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def lookup(self, h: bytes) -> int | None:
        return self.cached.get(h)

    def acquire(self, b: int) -> None:
        """Take a reference on a cached block (a prefix hit)."""
        if b == NULL_BLOCK:
            return
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue (in the given order)."""
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
                if not self.enable_caching and self.block_hash[b] is not None:
                    self.cached.pop(self.block_hash[b], None)  # type: ignore[arg-type]
                    self.block_hash[b] = None

    def cache(self, b: int, h: bytes) -> None:
        """Record that block ``b`` holds the KV of the hash block(s) ending with hash ``h``."""
        if not self.enable_caching or b == NULL_BLOCK or self.block_hash[b] is not None or h in self.cached:
            return
        self.cached[h] = b
        self.block_hash[b] = h


class GPUBlockCache:
    """All groups' block pools plus the prefix-hit rules of the reference engine.

    A GPU prefix hit must be usable by every group: full-attention groups need every block of the
    prefix cached, sliding-window groups the blocks of the window before the hit point
    (``sliding_window_blocks * offloaded_block_size`` tokens); positions before a window map to the
    null block. Hits are multiples of every group's GPU block size.

    Args:
        groups: the engine's :class:`~kvoffload.engine.reference.config.GroupConfig` s.
        num_blocks: blocks per group.
        hash_block_size: tokens per request block hash.
        enable_caching: keep the prefix cache.
    """

    def __init__(self, groups: Sequence[Any], num_blocks: int, hash_block_size: int, enable_caching: bool) -> None:
        self.groups = tuple(groups)
        self.pools = [BlockPool(num_blocks, enable_caching) for _ in self.groups]
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self._lcm = math.lcm(*(g.gpu_block_size for g in self.groups))
        self._windows = [
            None if g.sliding_window_blocks is None else g.sliding_window_blocks * g.offloaded_block_size
            for g in self.groups
        ]

    def grow(self, tables: list[list[int]], tokens: int) -> bool:
        """Append fresh blocks so every group's table covers ``tokens`` tokens (all or nothing)."""
        needs = [max(0, -(-tokens // g.gpu_block_size) - len(t)) for g, t in zip(self.groups, tables, strict=False)]
        if any(n > p.num_free for n, p in zip(needs, self.pools, strict=False)):
            return False
        for n, p, t in zip(needs, self.pools, tables, strict=False):
            if n:
                t.extend(p.allocate(n))  # type: ignore[arg-type]
        return True

    def free(self, tables: list[list[int]]) -> None:
        """Release every block of the tables (tail blocks first in the LRU queue) and empty them."""
        for p, t in zip(self.pools, tables, strict=False):
            p.release(reversed(t))
            t.clear()

    def block_hash(self, req: Any, g: int, i: int) -> bytes | None:
        """Hash of GPU block ``i`` of group ``g`` of ``req`` (None while not full/hashed)."""
        step = self.groups[g].gpu_block_size // self.hash_block_size
        j = (i + 1) * step - 1
        return req.block_hashes[j] if j < len(req.block_hashes) else None

    def _cached_range(self, req: Any, g: int, lo: int, hi: int) -> bool:
        pool = self.pools[g]
        for i in range(lo, hi):
            h = self.block_hash(req, g, i)
            if h is None or pool.lookup(h) is None:
                return False
        return True

    def hit(self, req: Any) -> int:
        """Tokens of ``req`` usable from the GPU prefix cache (at most ``num_tokens - 1``)."""
        if not self.enable_caching:
            return 0
        hit = req.num_tokens - 1
        for g, gc in enumerate(self.groups):
            if self._windows[g] is not None:
                continue
            bs, pool = gc.gpu_block_size, self.pools[g]
            n = 0
            while (n + 1) * bs <= hit:
                h = self.block_hash(req, g, n)
                if h is None or pool.lookup(h) is None:
                    break
                n += 1
            hit = min(hit, n * bs)
        hit -= hit % self._lcm
        while hit > 0:
            ok = True
            for g, gc in enumerate(self.groups):
                w = self._windows[g]
                if w is not None and not self._cached_range(
                    req, g, max(0, hit - w) // gc.gpu_block_size, hit // gc.gpu_block_size
                ):
                    ok = False
                    break
            if ok:
                return hit
            hit -= self._lcm
        return 0

    def take_hit(self, req: Any, hit: int, tables: list[list[int]]) -> None:
        """Fill empty ``tables`` with references to the cached blocks of the first ``hit`` tokens."""
        for g, gc in enumerate(self.groups):
            bs, pool, w = gc.gpu_block_size, self.pools[g], self._windows[g]
            lo = 0 if w is None else max(0, hit - w) // bs
            table = tables[g]
            table.extend([NULL_BLOCK] * lo)
            for i in range(lo, hit // bs):
                b = pool.lookup(self.block_hash(req, g, i))  # type: ignore[arg-type]
                pool.acquire(b)  # type: ignore[arg-type]
                table.append(b)  # type: ignore[arg-type]

    def cache_blocks(self, req: Any, tables: list[list[int]], g: int, lo: int, hi: int) -> None:
        """Register blocks ``[lo, hi)`` of group ``g`` (now holding valid KV) in the prefix cache."""
        pool, table = self.pools[g], tables[g]
        for i in range(lo, hi):
            h = self.block_hash(req, g, i)
            if h is not None:
                pool.cache(table[i], h)

    @property
    def num_evicted(self) -> int:
        return sum(p.num_evicted for p in self.pools)
