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
   The replay takes ``prepare_store``'s decision from ``store_plan``, the same method without
   the output types an engine hands its workers.

The hit of a request in tokens is ``min(hit_blocks * B, prompt_tokens - 1)``: the engine always
computes the prompt's last token. This is exactly what the engine replay does with one request at
a time, no GPU prefix cache, a step budget that prefills a whole prompt at once and no generated
tokens (see ``tests/simulate/test_cache_replay.py``); with the GPU prefix cache, concurrency and
generated blocks the engine's numbers differ by design.

**A shared tier beneath host memory** (``tier_capacity`` blocks > 0: Redis with ``allkeys-lru``,
modelled by :class:`~kvoffload.simulate.shared_tier.LRUTierModel`) is wired as kvoffload's tiered
manager wires a tier below the host pool (docs/contract.md §8):

* after step 1, the blocks from the first host miss on that the host pool misses are looked up in
  the tier (``EXISTS``, no recency change); the tier hits before the first block missing from both
  are promoted: one ``prepare_store`` of those blocks, naming the request's host hits too so that
  they are not evicted (the host policy evicts others; all or nothing: when it returns None the
  promotion is refused and the request hits only its host run), ``complete_store``, and a ``GET``
  of each promoted block in the tier (recency refreshed); then ``lookup_batch`` again, whose
  leading run (host hits and promoted blocks) is the request's hit, loaded as in step 3;
* every block a step-4 store made ready (``keys_to_store``) is written through to the tier
  (``SET NX``: a block already there is left alone but becomes most recent); promoted blocks are
  not written back.

The hit is split by where each block was at lookup: ``tier_hit_tokens`` are the tokens of the
promoted blocks (the prompt's last token, never loaded, is taken from the tier's share when the
tier supplied the last hit block), the rest came from the host pool. With ``tier_capacity=0`` the
tier holds nothing and the replay is the one-tier replay, call for call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import OffloadKey, ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.lru_replay import replay_lru
from kvoffload.simulate.shared_tier import LRUTierModel

__all__ = ["HostReplay", "ReplayResult", "replay_cache", "split_hit_tokens", "tier_tokens_of"]


@dataclass
class ReplayResult:
    """Totals of one (policy, capacity, tier capacity) cache-level replay.

    Attributes:
        policy / capacity: the host pool's policy name and capacity in offloaded blocks.
        tier_capacity: the shared tier's capacity in offloaded blocks (0: no tier).
        prompt_tokens: all requests' prompt tokens.
        hit_blocks: prompt blocks found (leading runs, host pool and tier), summed over requests.
        hit_tokens: prompt tokens loaded (``min(hit * B, prompt - 1)`` each), from either tier.
        tier_hit_blocks / tier_hit_tokens: the part of those promoted from the shared tier.
        stored_blocks: blocks stored into the host pool by requests (``keys_to_store``, promotions
            not counted); evictions: blocks evicted from the host pool (by stores and promotions).
        failed_stores: requests whose ``prepare_store`` returned None.
        refused_promotions: requests whose tier hits the host pool had no room for.
        tier_evictions: blocks the shared tier evicted.
        distinct_stored: distinct blocks stored (by requests) at least once.
        per_request: hit blocks of every request (``int64[R]``); tier_per_request: of those, the
            blocks promoted from the tier.
        seconds: wall time of the replay.
    """

    policy: str
    capacity: int
    tier_capacity: int = 0
    prompt_tokens: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    tier_hit_blocks: int = 0
    tier_hit_tokens: int = 0
    stored_blocks: int = 0
    evictions: int = 0
    failed_stores: int = 0
    refused_promotions: int = 0
    tier_evictions: int = 0
    distinct_stored: int = 0
    per_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tier_per_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens loaded, from the host pool or the tier."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def host_hit_tokens(self) -> int:
        """Prompt tokens loaded from blocks found in the host pool."""
        return self.hit_tokens - self.tier_hit_tokens


_HIT = bytes([LOOKUP_HIT])


def _leading_hits(codes: np.ndarray, n: int) -> int:
    """The leading run of ``LOOKUP_HIT`` in the ``int8[n]`` codes (one C-level pass, no array made)."""
    return n - len(codes.tobytes().lstrip(_HIT))


def hit_tokens_of(hits: np.ndarray, prompt_tokens: np.ndarray, block_tokens: int) -> int:
    """Tokens loaded for per-request hit blocks: ``min(hit * B, prompt - 1)`` summed."""
    return int(np.minimum(hits * block_tokens, prompt_tokens - 1).sum())


def split_hit_tokens(
    hits: np.ndarray, tier_hits: np.ndarray, last_from_tier: np.ndarray, prompt_tokens: np.ndarray, block_tokens: int
) -> tuple[int, int]:
    """``(hit_tokens, tier_hit_tokens)`` of per-request hit blocks, tier blocks among them and
    whether the last hit block came from the tier (:func:`tier_tokens_of`, summed)."""
    tier = tier_tokens_of(hits, tier_hits, last_from_tier, prompt_tokens, block_tokens)
    return hit_tokens_of(hits, prompt_tokens, block_tokens), int(tier.sum())


def tier_tokens_of(
    hits: np.ndarray, tier_hits: np.ndarray, last_from_tier: np.ndarray, prompt_tokens: np.ndarray, block_tokens: int
) -> np.ndarray:
    """Per request, the tokens loaded from the tier: its tier blocks' tokens, less the prompt's last
    token (never loaded) when the last hit block came from the tier."""
    excess = np.maximum(hits * block_tokens - (prompt_tokens - 1), 0)
    return tier_hits * block_tokens - excess * last_from_tier


class HostReplay:
    """One host pool of the cache-level replay: a fresh ``CPUOffloadingManager(capacity, policy)``,
    the calls the scheduler makes on it for each request (:meth:`serve`, module docstring) and
    their totals (``stored``, ``evicted``, ``failed``, ``refused`` as in :class:`ReplayResult`)."""

    def __init__(self, policy: str, capacity: int) -> None:
        self.manager = CPUOffloadingManager(capacity, policy)
        self.ctx = ReqContext("replay")
        self.stored = self.evicted = self.failed = self.refused = 0

    def cached_prefix(self, keys: list[OffloadKey]) -> int:
        """The leading run of ``keys`` stored and ready here (``peek``: counts and changes nothing)."""
        h = 0
        for code in self.manager.peek(keys):
            if code != LOOKUP_HIT:
                break
            h += 1
        return h

    def serve(
        self, keys: list[OffloadKey], ids: np.ndarray, tier: LRUTierModel, tag: str | None = None
    ) -> tuple[int, list[int], np.ndarray | None]:
        """One request (``keys`` and their dense ``ids``, head first, non-empty) over ``tier``;
        ``tag`` its workload tag (``ReqContext.workload``), if any.

        Returns its hit blocks, the positions promoted from the tier, and the ids its store made
        ready (written through to the tier), or None when nothing was stored.
        """
        m, ctx = self.manager, self.ctx if tag is None else ReqContext("replay", workload=tag)
        n = len(keys)
        codes = m.lookup_batch(keys, ctx)
        hit = _leading_hits(codes, n)
        promoted: list[int] = []
        if hit < n and len(tier):
            promoted, evicted_by_promotion = _promote(m, tier, keys, codes, ids, hit, ctx)
            if evicted_by_promotion is None:
                self.refused += 1
            elif promoted:
                self.evicted += evicted_by_promotion
                codes = m.lookup_batch(keys, ctx)
                hit = _leading_hits(codes, n)
        m.touch(keys, ctx)
        if hit:
            head = keys[:hit]
            m.prepare_load(head, ctx)
            m.complete_load(head, ctx)
        if hit == n:
            return hit, promoted, None
        # prepare_store's decision as the manager makes it (store_plan: without the output wrapping)
        plan = m.store_plan(keys[hit:], ctx)
        if plan.slots is None:
            self.failed += 1
            return hit, promoted, None
        new_ids = None
        if plan.keys:
            m.complete_store(plan.keys, ctx)
            # the plan's keys (keys_to_store) are the offered keys that were absent, in order
            rest = codes[hit:]
            new_ids = ids[hit:] if _HIT not in rest.tobytes() else ids[hit:][rest != LOOKUP_HIT]
            if tier.capacity:
                tier.write(new_ids.tolist())  # write-through: SET NX
            self.stored += len(plan.keys)
        self.evicted += len(plan.evicted)
        return hit, promoted, new_ids

    def shutdown(self) -> None:
        self.manager.shutdown()


def replay_cache(
    trace: BlockTrace,
    policy: str,
    capacity: int,
    key_lists: list[list[OffloadKey]] | None = None,
    tier_capacity: int = 0,
    manager: bool = False,
) -> ReplayResult:
    """Replay ``trace`` through a fresh ``CPUOffloadingManager(capacity, policy)`` with a shared
    tier of ``tier_capacity`` blocks beneath it (module docstring).

    ``key_lists`` (``trace.key_lists()``) may be passed to share one copy between runs. The ``lru``
    policy without a tier takes :func:`~kvoffload.simulate.lru_replay.replay_lru` (the same decisions
    without the manager's calls; ``manager=True`` makes them through the manager all the same).
    """
    if policy == "lru" and not (manager or tier_capacity) and capacity > 0 and not trace.has_repeats:
        return _lru_result(trace, capacity)
    t0 = time.perf_counter()
    tier = LRUTierModel(tier_capacity)
    lists = trace.key_lists() if key_lists is None else key_lists
    node = HostReplay(policy, capacity)
    hit_list = [0] * len(lists)
    tier_hits = np.zeros(len(lists), dtype=np.int64)
    last_from_tier = np.zeros(len(lists), dtype=bool)
    stored_ids: list[np.ndarray] = []  # the ids each request's store made ready
    ids, starts = trace.ids, trace.starts.tolist()
    serve, keep = node.serve, stored_ids.append
    tags = trace.tags
    for r, keys in enumerate(lists):
        if not keys:
            continue
        s = starts[r]
        hit, promoted, new_ids = serve(keys, ids[s : s + len(keys)], tier, None if tags is None else tags[r])
        if new_ids is not None:
            keep(new_ids)
        hit_list[r] = hit
        if promoted:
            tier_hits[r] = sum(1 for i in promoted if i < hit)
            last_from_tier[r] = hit - 1 in promoted
    node.shutdown()
    hits = np.array(hit_list, dtype=np.int64)
    ever_stored = np.zeros(trace.num_blocks, dtype=bool)
    if stored_ids:
        ever_stored[np.concatenate(stored_ids)] = True
    bt = trace.block_tokens
    hit_tokens, tier_hit_tokens = split_hit_tokens(hits, tier_hits, last_from_tier, trace.prompt_tokens, bt)
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        tier_capacity=tier_capacity,
        prompt_tokens=trace.total_prompt_tokens,
        hit_blocks=int(hits.sum()),
        hit_tokens=hit_tokens,
        tier_hit_blocks=int(tier_hits.sum()),
        tier_hit_tokens=tier_hit_tokens,
        stored_blocks=node.stored,
        evictions=node.evicted,
        failed_stores=node.failed,
        refused_promotions=node.refused,
        tier_evictions=tier.evictions,
        distinct_stored=int(ever_stored.sum()),
        per_request=hits,
        tier_per_request=tier_hits,
        seconds=time.perf_counter() - t0,
    )


def _lru_result(trace: BlockTrace, capacity: int) -> ReplayResult:
    """The one-tier LRU replay as :func:`~kvoffload.simulate.lru_replay.replay_lru` makes it (the
    manager's decisions without its calls)."""
    hits, ever_stored, stored, evicted, failed, seconds = replay_lru(trace, capacity)
    return ReplayResult(
        policy="lru",
        capacity=capacity,
        prompt_tokens=trace.total_prompt_tokens,
        hit_blocks=int(hits.sum()),
        hit_tokens=hit_tokens_of(hits, trace.prompt_tokens, trace.block_tokens),
        stored_blocks=stored,
        evictions=evicted,
        failed_stores=failed,
        distinct_stored=int(ever_stored.sum()),
        per_request=hits,
        tier_per_request=np.zeros(len(hits), dtype=np.int64),
        seconds=seconds,
    )


def _promote(
    m: CPUOffloadingManager,
    tier: LRUTierModel,
    keys: list[OffloadKey],
    codes: np.ndarray,
    ids: np.ndarray,
    first: int,
    ctx: ReqContext,
) -> tuple[list[int], int | None]:
    """Promote the tier hits of one request (``ids``: its dense ids) into the host pool (module
    docstring).

    ``first`` is the request's first host miss. Returns the promoted positions and the host
    evictions the promotion made, or ``([], None)`` when the host pool had no room (refused).
    """
    host_hit = (codes == LOOKUP_HIT).tolist()
    n = len(keys)
    positions: list[int] = []
    i = first
    while i < n:
        if not host_hit[i]:
            if not tier.contains(int(ids[i])):  # EXISTS: recency left alone
                break
            positions.append(i)
        i += 1
    if not positions:
        return [], 0
    tier_keys = list(dict.fromkeys(keys[p] for p in positions))
    named = set(tier_keys)
    protect = list(dict.fromkeys(k for k, h in zip(keys, host_hit, strict=True) if h and k not in named))
    plan = m.store_plan([*tier_keys, *protect], ctx)
    if plan.slots is None:
        return [], None
    if plan.keys:
        m.complete_store(plan.keys, ctx)
    tier.read(int(ids[p]) for p in positions)  # GET: most recent
    return positions, len(plan.evicted)
