"""The soak engine's GPU block allocator: per pool, a stack of free block ids (block 0 is the null block)."""

from __future__ import annotations

from tests.soak.kv import BLOCK
from tests.soak.model import GROUPS, NULL, Seq


class GPUBlocks:
    """Free GPU blocks per pool; a group allocates from its pool (``pool_of[g]``).

    Args:
        pool_of: per group, its GPU block pool.
        num_gpu_blocks: blocks per pool, block 0 (the null block) never handed out.

    Attributes:
        free: per pool, a stack of free block ids: freed blocks are reused first.
    """

    def __init__(self, pool_of: tuple[int, ...], num_gpu_blocks: int) -> None:
        self.pool_of = pool_of
        self.free: list[list[int]] = [list(range(num_gpu_blocks - 1, 0, -1)) for _ in range(max(pool_of) + 1)]

    def alloc(self, g: int, n: int) -> list[int]:
        """``n`` blocks for group ``g`` (check :meth:`fits` first)."""
        free = self.free[self.pool_of[g]]
        return [free.pop() for _ in range(n)]

    def fits(self, need: list[int]) -> bool:
        """Whether group g can get ``need[g]`` more blocks, for every group."""
        per_pool = [0] * len(self.free)
        for g, n in enumerate(need):
            per_pool[self.pool_of[g]] += n
        return all(n <= len(f) for n, f in zip(per_pool, self.free, strict=True))

    def give_back(self, g: int, blocks: list[int]) -> None:
        """Free ``blocks`` of group ``g`` (none of them the null block)."""
        self.free[self.pool_of[g]].extend(blocks)

    def release(self, seq: Seq) -> None:
        """Free every block of ``seq``; its tables become empty."""
        for g, t in enumerate(seq.tables):
            self.give_back(g, [b for b in t if b != NULL])
        seq.tables = [[] for _ in GROUPS]

    def tables_for(self, tokens: int, computed: int) -> list[list[int]] | None:
        """Block tables covering ``tokens`` tokens of a request with ``computed`` tokens on the GPU:
        sliding-window blocks wholly before the window are the null block. None: they do not fit."""
        nb = -(-tokens // BLOCK)
        nulls = []
        for _f, w in GROUPS:
            nulls.append(0 if w is None else max(0, min(nb, (computed - w + 1) // BLOCK)))
        if not self.fits([nb - n for n in nulls]):
            return None
        return [[NULL] * n + self.alloc(g, nb - n) for g, n in enumerate(nulls)]
