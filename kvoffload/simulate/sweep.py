"""Sizes and results of a capacity sweep (``kvoffload simulate``): model shapes, working sets, points."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvoffload.engine.reference.request import hash_blocks
from kvoffload.engine.reference.workload import TraceRequest

__all__ = [
    "DTYPE_BYTES",
    "HASH_BLOCK_TOKENS",
    "MODEL_SHAPES",
    "ModelShape",
    "SimPoint",
    "default_capacities",
    "largest_run",
    "log_capacities",
    "spread_capacities",
    "stored_blocks_bound",
    "working_set_blocks",
]

HASH_BLOCK_TOKENS = 16  # tokens per GPU block and per trace block hash
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0, 1.25, 1.5, 2.0)


@dataclass(frozen=True)
class ModelShape:
    """The KV geometry that turns blocks into bytes: K and V of every layer, per token."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def describe(self) -> str:
        return f"{self.layers} layers x {self.kv_heads} KV heads x head dim {self.head_dim}, {self.dtype}"


MODEL_SHAPES = {
    "8b": ModelShape(32, 8, 128, "bf16"),  # Llama-3-8B-class: 128 KiB of KV per token
    "70b": ModelShape(80, 8, 128, "bf16"),  # Llama-3-70B-class: 320 KiB of KV per token
}


@dataclass(frozen=True)
class SimPoint:
    """One (policy, capacity) run; token counts are over each request's completed admission.

    ``served_tokens`` = prompt tokens (+ generated tokens prefilled again after a preemption)
    = ``gpu_hit_tokens + cpu_hit_tokens + computed_prefill_tokens``; ``cpu_hit_rate`` and
    ``hit_rate`` are shares of ``served_tokens``.

    With a shared tier beneath host memory (cache-level replay, ``tier_blocks > 0``):
    ``cpu_hit_tokens`` are the tokens found in host memory, ``tier_hit_tokens`` those promoted
    from the tier, and ``hit_rate`` is their sum's share; ``computed_prefill_tokens`` the rest.
    One-tier runs have ``tier_blocks == 0`` and no tier figures.
    """

    policy: str
    cpu_blocks: int
    cpu_gib: float
    cpu_tokens: int
    prompt_tokens: int
    served_tokens: int
    cpu_hit_tokens: int
    gpu_hit_tokens: int
    computed_prefill_tokens: int
    cpu_hit_rate: float
    hit_rate: float
    cpu_evictions: int
    distinct_blocks_stored: int
    preemptions: int
    seconds: float
    tier_blocks: int = 0
    tier_gib: float = 0.0
    tier_tokens: int = 0
    tier_hit_tokens: int = 0
    tier_hit_rate: float = 0.0
    tier_evictions: int = 0


def working_set_blocks(items: list[Any], hash_block_size: int = HASH_BLOCK_TOKENS, block_size_factor: int = 1) -> int:
    """Distinct offloaded blocks in the prompts of ``items`` (chat turns or trace requests).

    An offloaded block of ``block_size_factor`` hash blocks is counted by its key, the chained
    hash of its last hash block, so two prompts share a block exactly when they share the whole
    prefix up to its end; partial blocks at a prompt's end are never stored and not counted.
    """
    seen: set[bytes] = set()
    for it in items:
        if isinstance(it, TraceRequest):
            hashes = list(it.block_hashes or ()) if it.token_ids is None else hash_blocks(it.token_ids, hash_block_size)
        else:
            hashes = hash_blocks(it.prompt_token_ids, hash_block_size)
        seen.update(hashes[block_size_factor - 1 :: block_size_factor])
    return len(seen)


def default_capacities(working_set_offloaded_blocks: int) -> list[int]:
    """Capacities from 1/16 to 2x the prompts' working set, in offloaded blocks.

    Past the working set, blocks filled by generated tokens still compete for room, so the
    curves may keep rising a little.
    """
    w = max(working_set_offloaded_blocks, 16)
    return sorted({max(1, round(w * f)) for f in _FRACTIONS})


def log_capacities(working_set_offloaded_blocks: int, points: int = 9) -> list[int]:
    """``points`` capacities spaced evenly on a log scale from 1/256 of the working set to twice
    it, in offloaded blocks (the cache-level replay's default: real traces need decades)."""
    w = max(working_set_offloaded_blocks, 512)
    lo, hi = w / 256, 2.0 * w
    return sorted({max(1, round(lo * (hi / lo) ** (i / (points - 1)))) for i in range(points)})


def largest_run(points: list[SimPoint]) -> SimPoint:
    """The run with the most CPU blocks (of those, the one that stored the most distinct blocks)."""
    return max(points, key=lambda p: (p.cpu_blocks, p.distinct_blocks_stored))


def stored_blocks_bound(items: list[Any], block_tokens: int) -> int:
    """An upper bound on the distinct offloaded blocks the engine replay of ``items`` (chat turns or
    trace requests) can ever store: every full block of every prompt with its decoded tokens."""
    return sum(
        ((it.num_tokens if isinstance(it, TraceRequest) else len(it.prompt_token_ids)) + it.max_tokens) // block_tokens
        for it in items
    )


def spread_capacities(
    points: list[SimPoint], capacities: list[int], bound: int, block_bytes: int, block_tokens: int
) -> list[SimPoint]:
    """``points`` run at ``min(c, bound)`` for each of ``capacities`` (ascending), given for every
    ``c``: a pool of at least ``bound`` blocks, the most the workload can ever store, never evicts,
    so any larger one makes the same run (a point's capacity fields are the only ones set again)."""
    out: list[SimPoint] = []
    for p in points:
        for c in capacities:
            if min(c, bound) == p.cpu_blocks:
                gib, tokens = c * block_bytes / 2**30, c * block_tokens
                out.append(p if c == p.cpu_blocks else replace(p, cpu_blocks=c, cpu_gib=gib, cpu_tokens=tokens))
    return out
