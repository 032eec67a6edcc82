"""Cache-level replay: a trace's prompt blocks through the real manager and policy, nothing else.

No KV bytes, no GPU cache, no engine steps: each request, in arrival order and one at a time, makes
the calls the kvoffload scheduler makes for it on a
:class:`~kvoffload.cache.manager.CPUOffloadingManager`, at offloaded-block granularity:

1. ``lookup_batch`` of its prompt's full blocks; the hit is the leading run of ready blocks
   (a load must be a prefix: the first missing block ends it);
2. ``touch`` of all its blocks (absent ones are ignored), as the scheduler does on admission;
3. ``prepare_load`` and ``complete_load`` of the hit blocks (the load, done before the request
   computes the rest);
4. ``prepare_store`` of every block after the hit (present ones are skipped and protected; the
   policy evicts to make room, possibly blocks this request just loaded; None when the evictable
   blocks do not give enough room: then nothing of the request is stored), ``complete_store``.

The CPU-tier hit of a request in tokens is ``min(hit_blocks * B, prompt_tokens - 1)``: the engine
always computes the prompt's last token. This is exactly what the engine replay does with one
request at a time, no GPU prefix cache, a step budget that prefills a whole prompt at once and no
generated tokens (see ``tests/sim/test_cache_replay_agrees.py``); with the GPU prefix cache,
concurrency and generated blocks the engine's numbers differ by design.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import OffloadKey, ReqContext
from kvoffload.core.lookup_result import LOOKUP_HIT
from kvoffload.sim.block_trace import BlockTrace

__all__ = ["ReplayResult", "replay_cache"]


@dataclass
class ReplayResult:
    """Totals of one (policy, capacity) cache-level replay.

    Attributes:
        policy / capacity: the policy name and the capacity in offloaded blocks.
        prompt_tokens: all requests' prompt tokens.
        hit_blocks: prompt blocks found (leading runs), summed over requests.
        hit_tokens: prompt tokens loaded from the CPU tier (``min(hit * B, prompt - 1)`` each).
        stored_blocks: blocks stored (``keys_to_store``), evictions: blocks evicted.
        failed_stores: requests whose ``prepare_store`` returned None.
        distinct_stored: distinct blocks stored at least once.
        per_request: hit blocks of every request (``int64[R]``).
        seconds: wall time of the replay.
    """

    policy: str
    capacity: int
    prompt_tokens: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    stored_blocks: int = 0
    evictions: int = 0
    failed_stores: int = 0
    distinct_stored: int = 0
    per_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def hit_tokens_of(hits: np.ndarray, prompt_tokens: np.ndarray, block_tokens: int) -> int:
    """Tokens loaded for per-request hit blocks: ``min(hit * B, prompt - 1)`` summed."""
    return int(np.minimum(hits * block_tokens, prompt_tokens - 1).sum())


def replay_cache(
    trace: BlockTrace, policy: str, capacity: int, key_lists: list[list[OffloadKey]] | None = None
) -> ReplayResult:
    """Replay ``trace`` through a fresh ``CPUOffloadingManager(capacity, policy)`` (module docstring).

    ``key_lists`` (``trace.key_lists()``) may be passed to share one copy between runs.
    """
    t0 = time.perf_counter()
    lists = trace.key_lists() if key_lists is None else key_lists
    m = CPUOffloadingManager(capacity, policy)
    ctx = ReqContext("replay")
    lookup_batch, touch, prepare_load, complete_load = m.lookup_batch, m.touch, m.prepare_load, m.complete_load
    prepare_store, complete_store = m.prepare_store, m.complete_store
    hits = np.zeros(len(lists), dtype=np.int64)
    ever_stored = np.zeros(trace.num_blocks, dtype=bool)
    ids, starts = trace.ids, trace.starts
    stored = evicted = failed = 0
    for r, keys in enumerate(lists):
        n = len(keys)
        if n == 0:
            continue
        codes = lookup_batch(keys, ctx)
        miss = np.flatnonzero(codes != LOOKUP_HIT)
        hit = int(miss[0]) if len(miss) else n
        touch(keys, ctx)
        if hit:
            prepare_load(keys[:hit], ctx)
            complete_load(keys[:hit], ctx)
        out = prepare_store(keys[hit:], ctx) if hit < n else None
        if out is None:
            failed += hit < n
        else:
            if out.keys_to_store:
                complete_store(out.keys_to_store, ctx)
                # keys_to_store are the offered keys that were absent, in order
                s = int(starts[r]) + hit
                ever_stored[ids[s : s + n - hit][codes[hit:] != LOOKUP_HIT]] = True
            stored += len(out.keys_to_store)
            evicted += len(out.evicted_keys)
        hits[r] = hit
    m.shutdown()
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        prompt_tokens=trace.total_prompt_tokens,
        hit_blocks=int(hits.sum()),
        hit_tokens=hit_tokens_of(hits, trace.prompt_tokens, trace.block_tokens),
        stored_blocks=stored,
        evictions=evicted,
        failed_stores=failed,
        distinct_stored=int(ever_stored.sum()),
        per_request=hits,
        seconds=time.perf_counter() - t0,
    )
