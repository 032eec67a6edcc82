"""The cache-level side of ``kvoffload simulate``: traces as block keys, the sweep, its points.

:func:`block_trace_of` turns the sweep's workload (a Mooncake trace, a kvoffload trace or the chat
workload) into a :class:`~kvoffload.simulate.block_trace.BlockTrace`; :func:`run_cache_sweep` replays it
for every policy and capacity plus the reference lines (:mod:`kvoffload.simulate.cache_sweep`), printing
one progress line per finished run, and returns the points in the report's
:class:`~kvoffload.simulate.sweep.SimPoint` form.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvoffload.engine.reference.request import hash_blocks
from kvoffload.engine.reference.workload import TraceRequest
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import ReplayResult
from kvoffload.simulate.cache_sweep import CacheSweep, sweep_cache
from kvoffload.simulate.mooncake import MooncakeRequest
from kvoffload.simulate.sweep import HASH_BLOCK_TOKENS, SimPoint, spread_capacities

__all__ = ["CacheSweepPoints", "block_trace_of", "run_cache_sweep", "to_point", "trace_blocks"]


def block_trace_of(items: list[Any], block_tokens: int, trace_block_tokens: int) -> BlockTrace:
    """The block keys of ``items``: Mooncake requests, :class:`TraceRequest` s or chat turns."""
    if items and isinstance(items[0], MooncakeRequest):
        return BlockTrace.from_mooncake(items, trace_block_tokens, block_tokens)  # Bailian tags included
    tokens = [it.num_tokens if isinstance(it, TraceRequest) else len(it.prompt_token_ids) for it in items]
    return BlockTrace.from_block_hashes(trace_blocks(items), tokens, block_tokens)


def trace_blocks(items: list[Any]) -> list[list[Any]]:
    """Per request, the ids of its trace blocks, head first: a Mooncake request's ``hash_ids``, a
    kvoffload trace request's 16-token block hashes (given, or hashed from its tokens), a chat turn's."""
    out: list[list[Any]] = []
    for it in items:
        if isinstance(it, MooncakeRequest):
            out.append(list(it.hash_ids))
        elif isinstance(it, TraceRequest):
            tokens = it.token_ids
            out.append(list(it.block_hashes or ()) if tokens is None else hash_blocks(tokens, HASH_BLOCK_TOKENS))
        else:
            out.append(hash_blocks(it.prompt_token_ids, HASH_BLOCK_TOKENS))
    return out


def to_point(r: ReplayResult, block_tokens: int, block_bytes: int) -> SimPoint:
    """A cache-level result as a report point (no GPU tier, no preemption: served = prompt tokens;
    ``cpu_*`` the host pool's part, ``tier_*`` the shared tier's, ``hit_rate`` both)."""
    share = r.prompt_tokens or 1
    return SimPoint(
        policy=r.policy,
        cpu_blocks=r.capacity,
        cpu_gib=r.capacity * block_bytes / 2**30,
        cpu_tokens=r.capacity * block_tokens,
        prompt_tokens=r.prompt_tokens,
        served_tokens=r.prompt_tokens,
        cpu_hit_tokens=r.host_hit_tokens,
        gpu_hit_tokens=0,
        computed_prefill_tokens=r.prompt_tokens - r.hit_tokens,
        cpu_hit_rate=r.host_hit_tokens / share,
        hit_rate=r.hit_rate,
        cpu_evictions=r.evictions,
        distinct_blocks_stored=r.distinct_stored,
        preemptions=0,
        seconds=r.seconds,
        tier_blocks=r.tier_capacity,
        tier_gib=r.tier_capacity * block_bytes / 2**30,
        tier_tokens=r.tier_capacity * block_tokens,
        tier_hit_tokens=r.tier_hit_tokens,
        tier_hit_rate=r.tier_hit_tokens / share,
        tier_evictions=r.tier_evictions,
    )


@dataclass
class CacheSweepPoints:
    """The sweep as report points: the policies' (one-tier runs first, then per shared-tier
    capacity), Belady's per capacity, the infinite cache's (its hit rate holds at every capacity),
    and the sweep's wall time."""

    points: list[SimPoint]
    belady: list[SimPoint]
    infinite: SimPoint
    seconds: float

    def at_capacities(self, capacities: list[int], bound: int, block_bytes: int, block_tokens: int) -> CacheSweepPoints:
        """The sweep run at ``min(c, bound)`` blocks given for each of ``capacities``
        (:func:`~kvoffload.simulate.sweep.spread_capacities`; ``bound``: the trace's distinct blocks)."""
        return replace(
            self,
            points=spread_capacities(self.points, capacities, bound, block_bytes, block_tokens),
            belady=spread_capacities(self.belady, capacities, bound, block_bytes, block_tokens),
        )


def run_cache_sweep(
    trace: BlockTrace,
    policies: list[str],
    capacities: list[int],
    jobs: int,
    block_bytes: int,
    verbose: bool = True,
    tier_capacities: list[int] | None = None,
) -> CacheSweepPoints:
    """Sweep ``trace`` (:func:`~kvoffload.simulate.cache_sweep.sweep_cache`) on ``jobs`` processes,
    for each shared-tier capacity in ``tier_capacities`` (blocks; default ``[0]``: none)."""
    bt = trace.block_tokens
    width = max(len(p) for p in [*policies, "belady"])

    def progress(done: int, total: int, r: ReplayResult, elapsed: float, eta: float) -> None:
        pt = r.prompt_tokens or 1
        found = (
            f" + tier {r.tier_capacity * block_bytes / 2**30:.2f} GiB   from host {r.host_hit_tokens / pt:6.1%}"
            f" + tier {r.tier_hit_tokens / pt:6.1%}"
            if r.tier_capacity
            else f"   from CPU tier {r.hit_rate:6.1%}"
        )
        print(
            f"  [{done:>3}/{total}] {r.policy:<{width}} {r.capacity * block_bytes / 2**30:9.2f} GiB "
            f"{r.capacity:>10,} blocks{found}   evicted {r.evictions:>10,}   "
            f"({r.seconds:.1f} s; {elapsed:.0f} s elapsed, about {eta:.0f} s to go)",
            flush=True,
        )

    sweep: CacheSweep = sweep_cache(trace, policies, capacities, jobs, progress if verbose else None, tier_capacities)
    inf = to_point(sweep.infinite, bt, block_bytes)
    return CacheSweepPoints(
        [to_point(r, bt, block_bytes) for r in sweep.runs],
        [to_point(sweep.belady[c], bt, block_bytes) for c in capacities],
        inf,
        sweep.seconds,
    )
