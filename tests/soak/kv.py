"""The soak engine's KV cache: deterministic per-token values, shared GPU tensors, byte checks.

Token ``t`` of a request has one value per (group, rank) that depends only on the tokens
``0..t`` (the chained hash of the previous full hash blocks and the tokens of its own block so
far), so the KV of a prefix is the same whichever request computed it -- and a block loaded from
the CPU tier can be compared with what computing it would have written.

GPU memory follows vLLM's hybrid layout: ``NUM_TENSORS`` flash-attn tensors per rank and block
pool, each shared by one layer of every group of the pool, so block ``b`` of a pool is one
physical block whichever group owns it. One offloaded record of a GPU block is, per tensor, its
K page then its V page (the order of the canonical views), i.e. ``cache[pool, :, :, b]`` flattened.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch

BLOCK = 4  # tokens per GPU block and per hash block
NUM_TENSORS = 2
HEADS = 1
HEAD_DIM = 4
ROOT = b"\0" * 16
RECORD_INTS = NUM_TENSORS * 2 * BLOCK * HEADS * HEAD_DIM


def chain_hash(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return h.digest()


@lru_cache(maxsize=1 << 16)
def token_bases(parent: bytes, tokens: tuple[int, ...], group: int) -> tuple[int, ...]:
    """One base value per token of a hash block (``tokens``: its tokens so far)."""
    h = hashlib.blake2b(parent + group.to_bytes(4, "little"), digest_size=8)
    out = []
    for t in tokens:
        h.update(t.to_bytes(4, "little"))
        out.append(int.from_bytes(h.copy().digest()[:4], "little") >> 4)
    return tuple(out)


_OFFSETS = torch.arange(NUM_TENSORS * 2, dtype=torch.int64).view(NUM_TENSORS, 2, 1, 1, 1) * 65537 + torch.arange(
    HEADS * HEAD_DIM, dtype=torch.int64
).view(1, 1, 1, HEADS, HEAD_DIM)


@lru_cache(maxsize=1 << 16)
def block_values(parent: bytes, tokens: tuple[int, ...], group: int, rank: int) -> torch.Tensor:
    """``[NUM_TENSORS, 2, len(tokens), HEADS, HEAD_DIM]`` int32: the KV of those tokens (cached:
    do not modify)."""
    bases = torch.tensor(token_bases(parent, tokens, group), dtype=torch.int64).view(1, 1, -1, 1, 1)
    return (bases + _OFFSETS + rank * 7).to(torch.int32)


class GPUCaches:
    """One int32 cache per rank: ``[num_pools, NUM_TENSORS, 2, num_blocks, BLOCK, HEADS, HEAD_DIM]``."""

    def __init__(self, num_blocks: int, num_ranks: int, num_pools: int) -> None:
        self.num_blocks = num_blocks
        self.caches = [
            torch.zeros(num_pools, NUM_TENSORS, 2, num_blocks, BLOCK, HEADS, HEAD_DIM, dtype=torch.int32)
            for _ in range(num_ranks)
        ]

    def layer_tensors(self, rank: int, pool: int) -> list[torch.Tensor]:
        """The per-layer flash-attn tensors ``[2, num_blocks, BLOCK, HEADS, HEAD_DIM]`` of a pool of a rank."""
        return [self.caches[rank][pool, k] for k in range(NUM_TENSORS)]

    def write(self, pool: int, block: int, start: int, parent: bytes, tokens: tuple[int, ...], group: int) -> None:
        """Compute: write the KV of ``tokens[start:]`` (a hash block's tokens so far) into ``block``."""
        for r, c in enumerate(self.caches):
            c[pool, :, :, block, start : len(tokens)] = block_values(parent, tokens, group, r)[:, :, start:]

    def matches(self, pool: int, block: int, parent: bytes, tokens: tuple[int, ...], group: int) -> bool:
        """Whether ``block`` holds the KV of ``tokens`` (its first ``len(tokens)`` slots) on every rank."""
        n = len(tokens)
        return all(
            torch.equal(c[pool, :, :, block, :n], block_values(parent, tokens, group, r))
            for r, c in enumerate(self.caches)
        )

    def garbage(self, rank: int, pool: int, blocks: list[int]) -> None:
        if blocks:
            self.caches[rank][pool, :, :, blocks] = -1


def slot_records(buffer: torch.Tensor, slot: int, slot_bytes: int, factor: int) -> torch.Tensor:
    """The ``factor`` GPU-block records of a host-pool slot: ``[factor, NUM_TENSORS, 2, BLOCK, HEADS, HEAD_DIM]``."""
    nbytes = factor * RECORD_INTS * 4
    raw = buffer[slot * slot_bytes : slot * slot_bytes + nbytes]
    return raw.view(torch.int32).view(factor, NUM_TENSORS, 2, BLOCK, HEADS, HEAD_DIM)
