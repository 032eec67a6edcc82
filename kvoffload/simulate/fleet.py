"""The cache-level replay of a fleet: ``N`` replicas behind a router, each with its own host pool,
optionally one shared tier beneath all of them.

Every replica is a :class:`~kvoffload.simulate.cache_replay.HostReplay`: its own
``CPUOffloadingManager(capacity, policy)`` (``capacity`` blocks per replica) making, for each
request routed to it, exactly the calls of the single-node cache-level replay
(:mod:`kvoffload.simulate.cache_replay`). With ``tier_capacity`` > 0 one
:class:`~kvoffload.simulate.shared_tier.LRUTierModel` (Redis, ``allkeys-lru``) lies beneath all of them:
every replica writes the blocks it stores through to it and promotes its tier hits from it, the
requests served one at a time in arrival order. The router is :mod:`kvoffload.simulate.routing`.

``kv-aware`` routing (:mod:`kvoffload.simulate.kv_router`) reads the caches and each replica's
queue of the engine-time model (:mod:`kvoffload.simulate.engine_time`); ``prefix`` reads the
caches alone. Without a tier and with a routing that reads neither (all but those two), replicas
never affect one another: each replays its own requests alone (:func:`replay_replica`, what
``--jobs`` spreads over processes), which gives what the joint replay gives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvoffload.core.base import OffloadKey
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.bailian import BailianRequest
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import HostReplay, ReplayResult, replay_cache, split_hit_tokens, tier_tokens_of
from kvoffload.simulate.engine_time import EngineTime
from kvoffload.simulate.kv_router import KV_AWARE, KV_WEIGHT, KVAwareRouter
from kvoffload.simulate.mooncake import MooncakeRequest
from kvoffload.simulate.routing import (
    LOAD_WINDOW_S,
    PREFIX,
    LoadModel,
    chat_conversations,
    conversation_ids,
    static_routes,
)
from kvoffload.simulate.shared_tier import LRUTierModel

__all__ = ["FleetResult", "FleetTrace", "replay_fleet", "replay_replica", "fleet_of_parts"]


@dataclass(frozen=True)
class FleetTrace:
    """A :class:`BlockTrace` with what routing reads: arrival times (``float64[R]``, seconds)
    and a conversation id per request (``int64[R]``, :func:`~kvoffload.simulate.routing.conversation_ids`);
    ``timed``: the arrival times come from the trace (else one request per second is assumed);
    ``output_tokens``: the trace's output length per request (``int64[R]``), or None."""

    trace: BlockTrace
    arrival_s: np.ndarray
    conversations: np.ndarray
    timed: bool = True
    output_tokens: np.ndarray | None = None

    @property
    def outputs(self) -> np.ndarray:
        """Output tokens per request (``int64[R]``; zeros when the trace gives none)."""
        if self.output_tokens is None:
            return np.zeros(self.trace.num_requests, dtype=np.int64)
        return self.output_tokens

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last (at least 1)."""
        a = self.arrival_s
        return max(float(a[-1] - a[0]), 1.0) if len(a) else 1.0

    @classmethod
    def from_mooncake(
        cls, requests: Sequence[MooncakeRequest], trace_block_tokens: int, block_tokens: int
    ) -> FleetTrace:
        """Mooncake (or Bailian) requests: arrival from ``timestamp`` (ms); conversations from
        Bailian's ``chat_id`` / ``parent_chat_id`` (:func:`~kvoffload.simulate.routing.chat_conversations`),
        else from the ``hash_ids`` of each prompt's full trace blocks."""
        trace = BlockTrace.from_mooncake(requests, trace_block_tokens, block_tokens)
        arrival = np.fromiter((q.timestamp / 1000.0 for q in requests), dtype=np.float64, count=len(requests))
        chats = [q for q in requests if isinstance(q, BailianRequest)]
        if requests and len(chats) == len(requests):
            convs = chat_conversations([q.chat_id for q in chats], [q.parent_chat_id for q in chats])
        else:
            convs = conversation_ids([q.hash_ids[: q.input_length // trace_block_tokens] for q in requests])
        outputs = np.fromiter((q.output_length for q in requests), dtype=np.int64, count=len(requests))
        return cls(trace, arrival, convs, True, outputs)

    @classmethod
    def untimed(cls, trace: BlockTrace) -> FleetTrace:
        """A trace without arrival times (one request per second assumed); conversations from
        its offloaded-block ids."""
        ids, st = trace.ids.tolist(), trace.starts.tolist()
        convs = conversation_ids([ids[st[r] : st[r + 1]] for r in range(trace.num_requests)])
        return cls(trace, np.arange(trace.num_requests, dtype=np.float64), convs, timed=False)

    def routes(self, routing: str, replicas: int, seed: int = 0, window_s: float = LOAD_WINDOW_S) -> np.ndarray:
        """:func:`~kvoffload.simulate.routing.static_routes` over this trace."""
        t = self.trace
        return static_routes(routing, replicas, self.arrival_s, t.prompt_tokens, self.conversations, seed, window_s)


@dataclass
class FleetResult:
    """One (routing, replicas, policy, host capacity per replica, tier capacity) fleet replay.

    Per request (arrays of length R, arrival order): ``replica`` it was routed to, ``hits`` its
    hit blocks (host pool and tier), ``tier_hits`` those promoted from the tier, ``tier_reads``
    blocks read from the tier (``GET`` of its promotions) and ``tier_writes`` blocks written
    through to it (``SET NX``), ``last_from_tier`` whether its last hit block came from the tier.
    Token totals as in :class:`ReplayResult`. ``rate_scale``: the arrival rate the routes were
    chosen at (0: routes that do not depend on it); ``kv_weight``: the ``kv-aware`` router's weight.
    """

    routing: str
    replicas: int
    policy: str
    capacity: int
    tier_capacity: int
    prompt_tokens: int
    hit_tokens: int
    tier_hit_tokens: int
    evictions: int
    tier_evictions: int
    replica: np.ndarray
    hits: np.ndarray
    tier_hits: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tier_reads: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tier_writes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seconds: float = 0.0
    last_from_tier: np.ndarray | None = None
    rate_scale: float = 0.0
    kv_weight: float | None = None

    @property
    def host_hit_tokens(self) -> int:
        return self.hit_tokens - self.tier_hit_tokens

    def token_split(self, prompt_tokens: np.ndarray, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Per request, ``(host tokens, tier tokens)`` loaded (:func:`tier_tokens_of` for the tier's)."""
        hit = np.minimum(self.hits * block_tokens, prompt_tokens - 1)
        if not len(self.tier_hits):
            return hit, np.zeros_like(hit)
        last = np.zeros(len(hit), dtype=bool) if self.last_from_tier is None else self.last_from_tier
        tier = tier_tokens_of(self.hits, self.tier_hits, last, prompt_tokens, block_tokens)
        return hit - tier, tier

    def per_replica(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Requests (or the sum of ``weights``, e.g. prompt tokens) per replica (``float64[N]``)."""
        return np.bincount(self.replica, weights=weights, minlength=self.replicas).astype(np.float64)


def _sub_trace(trace: BlockTrace, idx: np.ndarray) -> BlockTrace:
    """The requests ``idx`` of ``trace`` (same ids and keys)."""
    lens = np.diff(trace.starts)[idx]
    starts = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    parts = [trace.ids[trace.starts[r] : trace.starts[r + 1]] for r in idx.tolist()]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return BlockTrace(trace.block_tokens, ids, starts, trace.prompt_tokens[idx], trace.keys)


def replay_replica(
    trace: BlockTrace, routes: np.ndarray, replica: int, policy: str, capacity: int, key_lists: list[list[OffloadKey]]
) -> ReplayResult:
    """Replica ``replica`` alone (no shared tier): its requests (``routes == replica``) through
    :func:`~kvoffload.simulate.cache_replay.replay_cache`."""
    idx = np.flatnonzero(routes == replica)
    return replay_cache(_sub_trace(trace, idx), policy, capacity, [key_lists[r] for r in idx.tolist()])


def fleet_of_parts(
    ft: FleetTrace, routing: str, routes: np.ndarray, parts: list[ReplayResult], policy: str, capacity: int
) -> FleetResult:
    """The :class:`FleetResult` of replicas replayed alone (``parts[i]``: replica ``i``)."""
    hits = np.zeros(ft.trace.num_requests, dtype=np.int64)
    for i, part in enumerate(parts):
        hits[routes == i] = part.per_request
    zeros = np.zeros_like(hits)
    return FleetResult(
        routing,
        len(parts),
        policy,
        capacity,
        0,
        ft.trace.total_prompt_tokens,
        sum(p.hit_tokens for p in parts),
        0,
        sum(p.evictions for p in parts),
        0,
        routes,
        hits,
        zeros,
        zeros,
        zeros.copy(),
        sum(p.seconds for p in parts),
    )


def replay_fleet(
    ft: FleetTrace,
    routing: str,
    replicas: int,
    policy: str,
    capacity: int,
    tier_capacity: int = 0,
    key_lists: list[list[OffloadKey]] | None = None,
    seed: int = 0,
    window_s: float = LOAD_WINDOW_S,
    timing: EngineTime | None = None,
    kv_weight: float = KV_WEIGHT,
    rate_scale: float = 1.0,
) -> FleetResult:
    """All replicas together, requests in arrival order (module docstring). ``capacity`` 0: no
    host pool (nothing offloaded, every prompt token computed). ``kv-aware`` routing needs
    ``timing`` (its queue model) and routes at ``rate_scale`` times the trace's arrival rate."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidArgumentError(f"--replicas must be positive ints, got {replicas!r}")
    if routing == KV_AWARE and timing is None:
        raise InvalidArgumentError("kv-aware routing needs the engine-time model (timing)")
    t0 = time.perf_counter()
    trace = ft.trace
    lists = trace.key_lists() if key_lists is None else key_lists
    n_req = trace.num_requests
    nodes = [HostReplay(policy, capacity) for _ in range(replicas)] if capacity else []
    tier = LRUTierModel(tier_capacity if capacity else 0)
    if replicas == 1:
        routes: np.ndarray | None = np.zeros(n_req, dtype=np.int64)  # whatever the routing
    else:
        routes = None if routing in (PREFIX, KV_AWARE) else ft.routes(routing, replicas, seed, window_s)
    router = None
    if routing == KV_AWARE and replicas > 1:
        assert timing is not None
        decode = timing.decode_s(trace.prompt_tokens, ft.outputs)
        pt = trace.prompt_tokens
        args = (trace.block_tokens, ft.arrival_s, pt, decode, ft.duration_s, rate_scale)
        router = KVAwareRouter(replicas, kv_weight, timing, *args)
    load = LoadModel(replicas, window_s)
    replica = np.zeros(n_req, dtype=np.int64)
    hits, tier_hits, reads, writes = (np.zeros(n_req, dtype=np.int64) for _ in range(4))
    last_from_tier = np.zeros(n_req, dtype=bool)
    ids, starts = trace.ids, trace.starts.tolist()
    times, tokens = ft.arrival_s.tolist(), trace.prompt_tokens.tolist()
    bt = trace.block_tokens
    everyone = range(replicas)
    for r, keys in enumerate(lists):
        if routes is not None:
            rep = int(routes[r])
        elif replicas == 1:
            rep = 0
        else:
            runs = [nodes[i].cached_prefix(keys) for i in everyone] if keys and nodes else [0] * replicas
            if router is not None:
                rep = router.choose(r, runs)
            else:
                load.advance(times[r])
                best = max(runs)
                rep = load.least([i for i in everyone if runs[i] == best])
                load.add(times[r], rep, tokens[r])
        replica[r] = rep
        if keys and nodes:
            s = starts[r]
            hit, promoted, new_ids = nodes[rep].serve(keys, ids[s : s + len(keys)], tier)
            hits[r] = hit
            if new_ids is not None and tier_capacity:
                writes[r] = len(new_ids)
            if promoted:
                reads[r] = len(promoted)
                tier_hits[r] = sum(1 for i in promoted if i < hit)
                last_from_tier[r] = hit - 1 in promoted
        if router is not None:
            got = min(int(hits[r]) * bt, tokens[r] - 1)
            from_tier = min(int(tier_hits[r]) * bt, got)
            router.served(r, rep, got - from_tier, from_tier)
    for node in nodes:
        node.shutdown()
    hit_tokens, tier_hit_tokens = split_hit_tokens(hits, tier_hits, last_from_tier, trace.prompt_tokens, bt)
    return FleetResult(
        routing,
        replicas,
        policy,
        capacity,
        tier_capacity if capacity else 0,
        trace.total_prompt_tokens,
        hit_tokens,
        tier_hit_tokens,
        sum(n.evicted for n in nodes),
        tier.evictions,
        replica,
        hits,
        tier_hits,
        reads,
        writes,
        time.perf_counter() - t0,
        last_from_tier,
        rate_scale if routing == KV_AWARE else 0.0,
        kv_weight if routing == KV_AWARE else None,
    )
