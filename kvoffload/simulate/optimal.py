"""Reference lines of a cache-level replay: the infinite cache and Belady's offline optimum.

Both read a :class:`~kvoffload.simulate.block_trace.BlockTrace` and count hits as the cache-level
replay does (a request's hit is the leading run of its prompt blocks found in the cache; tokens
``min(hit * B, prompt - 1)``), so their lines sit on the same scale as the policies'.

* **Infinite** (:func:`replay_infinite`): every block ever stored stays. A request hits the leading
  run of its blocks that some earlier request had. No policy at any capacity can do better.
* **Belady** (:func:`replay_belady`): the capacity is the policy's, and the future is known. After
  each request the cache keeps, among the blocks it held and the request's blocks, the ``C`` whose
  next use (the next request whose prompt holds the block) is soonest; blocks never used again are
  dropped (not stored at all: optional admission, which an offloading cache has). Ties are broken
  by depth, the deeper block of a prompt going first. With prefix keys a block's ancestors are in
  every prompt the block is in, so their next use is never later than the block's: the kept set is
  always prefix-closed, and the leading-run hit equals the number of the request's blocks cached.
  This is Belady's MIN (furthest next use out) on blocks; the offline optimum for block hits of a
  cache of ``C`` blocks that may decline to store, hence an upper bound on what a policy gets.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import ReplayResult, hit_tokens_of

__all__ = ["BeladyPlan", "replay_belady", "replay_belady_heap", "replay_infinite"]


def replay_infinite(trace: BlockTrace) -> ReplayResult:
    """Hits with a cache that never evicts (module docstring)."""
    t0 = time.perf_counter()
    ids, st = trace.ids, trace.starts
    n = len(ids)
    first = np.zeros(n, dtype=bool)  # the access that sees its block first
    first[np.unique(ids, return_index=True)[1]] = True
    at = np.where(first, np.arange(n, dtype=np.int64), n)
    full = np.diff(st) > 0
    miss = np.full(trace.num_requests, n, dtype=np.int64)  # each request's first unseen block
    if full.any():
        miss[full] = np.minimum.reduceat(at, st[:-1][full])
    hits = np.minimum(miss, st[1:]) - st[:-1]
    return ReplayResult(
        policy="infinite",
        capacity=trace.num_blocks,
        prompt_tokens=trace.total_prompt_tokens,
        hit_blocks=int(hits.sum()),
        hit_tokens=hit_tokens_of(hits, trace.prompt_tokens, trace.block_tokens),
        stored_blocks=trace.num_blocks,
        distinct_stored=trace.num_blocks,
        per_request=hits,
        seconds=time.perf_counter() - t0,
    )


class BeladyPlan:
    """The capacity-independent part of Belady's replay: every access's eviction priority.

    An access at depth ``d`` of request ``r`` whose block is next used by request ``n`` gets
    priority ``n * D + d`` (``D`` > every depth), or -1 when the block is never used again; the
    block with the largest priority is evicted first.
    """

    def __init__(self, trace: BlockTrace) -> None:
        ids, st = trace.ids, trace.starts
        n = len(ids)
        req = np.repeat(np.arange(trace.num_requests, dtype=np.int64), np.diff(st))
        depth = np.arange(n, dtype=np.int64) - st[req]
        order = np.lexsort((np.arange(n), ids))  # by block id, then by position (arrival)
        nxt = np.full(n, -1, dtype=np.int64)
        same = ids[order[1:]] == ids[order[:-1]]
        nxt[order[:-1][same]] = req[order[1:][same]]
        width = int(depth.max()) + 1 if n else 1
        prio = np.where(nxt >= 0, nxt * width + depth, -1)
        # blocks held after each request while nothing was evicted: an access with a next use
        # holds its block from its request up to (not counting) that next request
        reused = nxt >= 0
        change = np.bincount(req[reused], minlength=trace.num_requests + 1)
        change -= np.bincount(nxt[reused], minlength=trace.num_requests + 1)
        #: the most blocks ever held at once with a capacity that never evicts: at or above it
        #: Belady's replay evicts nothing and is computed without the replay
        self.peak_held = int(np.cumsum(change).max()) if n else 0
        first = np.ones(n, dtype=bool)
        first[order[1:][same]] = False  # an access whose block was seen before
        #: blocks stored when nothing is evicted: first accesses that have a next use
        self.stored_without_eviction = int(np.count_nonzero(first & reused))
        self.trace = trace
        self.ids: list[int] = ids.tolist()
        self.starts: list[int] = st.tolist()
        self.prio: list[int] = prio.tolist()


def replay_belady(plan: BeladyPlan, capacity: int) -> ReplayResult:
    """Belady's offline optimum at ``capacity`` offloaded blocks (module docstring).

    At or above ``plan.peak_held`` nothing is ever evicted: every block with a next use stays, so
    a request hits the leading run of its blocks seen before (the infinite cache's hits), and the
    result is computed from the plan without the replay."""
    if capacity >= plan.peak_held:
        return _belady_without_eviction(plan, capacity)
    return replay_belady_heap(plan, capacity)


def _belady_without_eviction(plan: BeladyPlan, capacity: int) -> ReplayResult:
    t0 = time.perf_counter()
    trace = plan.trace
    stored = plan.stored_without_eviction
    return _belady_result(trace, capacity, replay_infinite(trace).per_request, stored, 0, stored, t0)


def replay_belady_heap(plan: BeladyPlan, capacity: int) -> ReplayResult:
    """:func:`replay_belady` by replaying the trace with a heap of next uses, at any capacity."""
    t0 = time.perf_counter()
    trace = plan.trace
    ids, st, prio = plan.ids, plan.starts, plan.prio
    bits = max(1, trace.num_blocks.bit_length())
    mask = (1 << bits) - 1
    held = [-1] * trace.num_blocks  # the priority a cached block was pushed with; -1: not cached
    heap: list[int] = []  # -(priority << bits | block): a max-heap; stale entries skipped when popped
    push, pop = heapq.heappush, heapq.heappop
    size = evicted = stored = 0
    ever = bytearray(trace.num_blocks)
    hits = np.zeros(trace.num_requests, dtype=np.int64)
    for r in range(trace.num_requests):
        s, e = st[r], st[r + 1]
        h = s
        while h < e and held[ids[h]] >= 0:
            h += 1
        hits[r] = h - s
        for p in range(s, e):
            i, pr = ids[p], prio[p]
            old = held[i]
            if pr < 0:
                if old >= 0:
                    held[i] = -1
                    size -= 1
                continue
            if old < 0:
                size += 1
                stored += 1
                ever[i] = 1
            held[i] = pr
            push(heap, -((pr << bits) | i))
        while size > capacity:
            v = -pop(heap)
            i = v & mask
            if held[i] == v >> bits:
                held[i] = -1
                size -= 1
                evicted += 1
        if len(heap) > 4 * size + 1_000_000:  # drop stale entries
            heap = [-((held[i] << bits) | i) for i in range(trace.num_blocks) if held[i] >= 0]
            heapq.heapify(heap)
    return _belady_result(trace, capacity, hits, stored, evicted, sum(ever), t0)


def _belady_result(
    trace: BlockTrace, capacity: int, hits: np.ndarray, stored: int, evicted: int, distinct: int, t0: float
) -> ReplayResult:
    """Belady's :class:`ReplayResult` from its per-request hit blocks and store counts."""
    return ReplayResult(
        policy="belady",
        capacity=capacity,
        prompt_tokens=trace.total_prompt_tokens,
        hit_blocks=int(hits.sum()),
        hit_tokens=hit_tokens_of(hits, trace.prompt_tokens, trace.block_tokens),
        stored_blocks=stored,
        evictions=evicted,
        distinct_stored=distinct,
        per_request=hits,
        seconds=time.perf_counter() - t0,
    )
