"""The fleet replay (replicas, routing, a shared tier) against the single-node replay and an
independent reference of OrderedDicts."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.bailian import read_bailian_trace
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.engine_time import EngineTime
from kvoffload.simulate.fleet import FleetTrace, fleet_of_parts, replay_fleet, replay_replica
from kvoffload.simulate.mooncake import read_mooncake_trace
from kvoffload.simulate.routing import ROUTINGS, chat_conversations, check_routings, conversation_ids
from tests.simulate.mooncake_traces import random_mooncake, system_prompt_headed, write_mooncake
from tests.simulate.test_two_tier_replay import _lead, reference_request

WINDOW = 98.0  # seconds of trace time: 14 requests (7 s apart) in the load window, one on its edge


def _fleet(tmp_path: Path, n: int, seed: int, trace_block: int = 64, block: int = 32, **kw: int) -> FleetTrace:
    lines = random_mooncake(n, seed, trace_block, **kw)
    for i, line in enumerate(lines):  # spread arrivals so that the load window forgets
        line["timestamp"] = i * 7000
    path = write_mooncake(tmp_path / f"f{seed}.jsonl", lines)
    return FleetTrace.from_mooncake(read_mooncake_trace(path, trace_block), trace_block, block)


def _requests(ft: FleetTrace) -> list[list[int]]:
    bt = ft.trace
    return [bt.ids[bt.starts[r] : bt.starts[r + 1]].tolist() for r in range(bt.num_requests)]


def _ref_conversations(prefixes: list[list[int]]) -> list[int]:
    """Brute force: the latest of the longest earlier lists that are a prefix of this one and
    whose last block no request before them held."""
    conv: list[int] = []
    count = 0

    def introduced(j: int) -> bool:
        return all(prefixes[j][-1] not in prefixes[k] for k in range(j))

    for r, ids in enumerate(prefixes):
        cands = [
            j
            for j in range(r)
            if 0 < len(prefixes[j]) <= len(ids) and ids[: len(prefixes[j])] == prefixes[j] and introduced(j)
        ]
        if cands:
            conv.append(conv[max(cands, key=lambda j: (len(prefixes[j]), j))])
        else:
            conv.append(count)
            count += 1
    return conv


#: the engine-time model the kv-aware router queues with in these tests: 1 ms per computed token,
#: 0.2 ms per token loaded from host memory, 0.5 ms from the tier
TIMING = EngineTime(token_s=1e-3, attn_s=0.0, step_s=0.0, kv_read_s=0.0, link_s=2e-4, tier_s=5e-4)


def _ref_load(times: list[float], tokens: list[int], routed: list[int], r: int, n: int) -> list[int]:
    load = [0] * n
    for j in range(r):
        if times[j] > times[r] - WINDOW:
            load[routed[j]] += tokens[j]
    return load


def reference_fleet(
    ft: FleetTrace, routing: str, n: int, host: int, tier: int, seed: int
) -> tuple[list[int], list[int]]:
    """Per request: its replica and its hit blocks; ``n`` OrderedDict LRU host pools over one
    OrderedDict LRU tier (each request as tests/simulate/test_two_tier_replay.reference_request serves it),
    routed by the routing's rule written from its definition."""
    reqs = _requests(ft)
    times, tokens = ft.arrival_s.tolist(), ft.trace.prompt_tokens.tolist()
    convs = ft.conversations.tolist()
    draws = np.random.default_rng(seed).integers(0, n, len(reqs)).tolist()
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
    shared: OrderedDict[int, None] = OrderedDict()
    routed: list[int] = []
    hits: list[int] = []
    owner: dict[int, int] = {}
    bt = ft.trace.block_tokens
    busy, given = [0.0] * n, [0] * n  # kv-aware: when each replica's queue empties; tokens handed
    for r, blocks in enumerate(reqs):
        load = _ref_load(times, tokens, routed, r, n)

        def least(among: list[int], load: list[int] = load) -> int:
            return min(among, key=lambda k: (load[k], k))

        if routing == "random":
            rep = draws[r]
        elif routing == "round-robin":
            rep = r % n
        elif routing == "least-loaded":
            rep = least(list(range(n)))
        elif routing == "session":
            if convs[r] not in owner:
                owner[convs[r]] = least(list(range(n)))
            rep = owner[convs[r]]
        elif routing == "kv-aware":  # weight 1: blocks still to compute + blocks of work queued
            runs = [_lead(blocks, c) for c in caches]
            t, nt = times[r] - times[0], tokens[r]

            def cost(i: int, runs: list[int] = runs, t: float = t, nt: int = nt) -> tuple[float, float, int, int]:
                queued = max(busy[i] - t, 0.0) / (TIMING.token_s * bt)
                return ((nt - min(runs[i] * bt, nt - 1)) / bt + queued, queued, given[i], i)

            rep = min(range(n), key=cost)
        else:
            runs = [_lead(blocks, c) for c in caches]
            rep = least([i for i in range(n) if runs[i] == max(runs)])
        routed.append(rep)
        hit, from_tier = reference_request(caches[rep], shared, blocks, host, tier)
        hits.append(hit)
        if routing == "kv-aware":
            t, nt = times[r] - times[0], tokens[r]
            got = min(hit * bt, nt - 1)
            tier_tok = min(from_tier * bt, got)
            work = (got - tier_tok) * TIMING.link_s + tier_tok * TIMING.tier_s + (nt - got) * TIMING.token_s
            busy[rep] = max(busy[rep], t) + work
            given[rep] += nt
    return routed, hits


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("routing", ROUTINGS)
def test_fleet_matches_an_independent_reference(tmp_path: Path, routing: str, seed: int) -> None:
    ft = _fleet(tmp_path, 160, 70 + seed, max_blocks=10)
    spread = False
    for n in (1, 3, 4):
        for host, tier in ((2, 0), (6, 0), (6, 15), (20, 60)):
            got = replay_fleet(ft, routing, n, "lru", host, tier, seed=seed, window_s=WINDOW, timing=TIMING)
            routed, hits = reference_fleet(ft, routing, n, host, tier, seed)
            assert got.replica.tolist() == routed, (n, host, tier)
            assert got.hits.tolist() == hits, (n, host, tier)
            spread |= len(set(routed)) > 1
    assert spread


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_one_replica_is_the_single_node_replay(tmp_path: Path, routing: str, policy: str) -> None:
    ft = _fleet(tmp_path, 150, 5)
    for host, tier in ((3, 0), (20, 0), (4, 30), (20, 200)):
        node = replay_cache(ft.trace, policy, host, tier_capacity=tier)
        got = replay_fleet(ft, routing, 1, policy, host, tier, window_s=WINDOW, timing=TIMING)
        assert got.hits.tolist() == node.per_request.tolist()
        assert got.tier_hits.tolist() == node.tier_per_request.tolist()
        assert (got.hit_tokens, got.tier_hit_tokens, got.evictions, got.tier_evictions) == (
            node.hit_tokens,
            node.tier_hit_tokens,
            node.evictions,
            node.tier_evictions,
        )
        assert set(got.replica.tolist()) == {0}


@pytest.mark.parametrize("routing", ["random", "round-robin", "least-loaded", "session"])
def test_replicas_alone_equal_the_joint_replay_without_a_tier(tmp_path: Path, routing: str) -> None:
    ft = _fleet(tmp_path, 200, 9)
    lists = ft.trace.key_lists()
    for policy in ("lru", "s3fifo"):
        joint = replay_fleet(ft, routing, 3, policy, 5, window_s=WINDOW)
        routes = ft.routes(routing, 3, window_s=WINDOW)
        parts = [replay_replica(ft.trace, routes, i, policy, 5, lists) for i in range(3)]
        alone = fleet_of_parts(ft, routing, routes, parts, policy, 5)
        assert alone.hits.tolist() == joint.hits.tolist()
        assert alone.replica.tolist() == joint.replica.tolist()
        assert (alone.hit_tokens, alone.evictions) == (joint.hit_tokens, joint.evictions)


@pytest.mark.parametrize("seed", range(8))
def test_prefix_routing_never_loads_less_than_random_without_a_tier(tmp_path: Path, seed: int) -> None:
    ft = _fleet(tmp_path, 250, 200 + seed, max_blocks=8)
    for n in (2, 4):
        for host in (3, 8, 30):
            prefix = replay_fleet(ft, "prefix", n, "lru", host, seed=seed, window_s=WINDOW)
            rand = replay_fleet(ft, "random", n, "lru", host, seed=seed, window_s=WINDOW)
            assert prefix.hit_tokens >= rand.hit_tokens, (n, host)


def test_tier_traffic_counts_promotions_and_write_through(tmp_path: Path) -> None:
    ft = _fleet(tmp_path, 200, 11)
    got = replay_fleet(ft, "round-robin", 3, "lru", 4, 100, window_s=WINDOW)
    assert (got.tier_reads >= got.tier_hits).all() and got.tier_hits.sum() > 0
    assert got.tier_writes.sum() > 0
    none = replay_fleet(ft, "round-robin", 3, "lru", 4, 0, window_s=WINDOW)
    assert none.tier_reads.sum() == none.tier_writes.sum() == 0


def test_conversations_match_a_brute_force() -> None:
    rnd = np.random.default_rng(3)
    lists: list[list[int]] = []
    nxt = 0
    for _ in range(300):
        if lists and rnd.random() < 0.7:
            parent = lists[int(rnd.integers(max(0, len(lists) - 15), len(lists)))]
            base = parent[: int(rnd.integers(0, len(parent) + 1))]
        else:
            base = []
        extra = int(rnd.integers(0, 4))
        lists.append(base + list(range(nxt, nxt + extra)))
        nxt += extra
    assert conversation_ids(lists).tolist() == _ref_conversations(lists)


def _ref_chat_conversations(chats: list[int], parents: list[int]) -> list[int]:
    """Brute force: follow parents back through the earlier requests to the first request of the
    chain (or to the id of a parent the trace does not hold); one conversation per such root."""
    roots: list[tuple[str, int]] = []
    for r in range(len(chats)):
        root, p = ("request", r), parents[r]
        while p >= 0:
            earlier = [j for j in range(r) if chats[j] == p]
            if not earlier:
                root = ("absent parent", p)
                break
            j = earlier[-1]
            root, p = ("request", j), parents[j]
        roots.append(root)
    first = list(dict.fromkeys(roots))
    return [first.index(x) for x in roots]


def test_chat_conversations_match_a_brute_force() -> None:
    rnd = np.random.default_rng(5)
    chats: list[int] = []
    parents: list[int] = []
    for r in range(400):
        chats.append(1000 + r)
        u = rnd.random()
        if u < 0.3 or not chats[:-1]:
            parents.append(-1)
        elif u < 0.4:
            parents.append(int(rnd.integers(0, 50)))  # a parent before the trace's start
        else:
            parents.append(chats[int(rnd.integers(max(0, r - 20), r))])
    assert chat_conversations(chats, parents).tolist() == _ref_chat_conversations(chats, parents)
    with pytest.raises(InvalidArgumentError, match="parent_chat_ids"):
        chat_conversations([1, 2], [-1])


def test_session_routing_follows_bailian_chat_ids(tmp_path: Path) -> None:
    # three conversations whose turns share no prompt block (e.g. a summarised history): only the
    # chat ids tie them together, and session routing keeps each on one replica
    objs = []
    for i in range(24):
        turn = i // 3 + 1
        objs.append(
            {"chat_id": 100 + i, "parent_chat_id": -1 if turn == 1 else 100 + i - 3, "timestamp": i * 7.0,
             "input_length": 64, "output_length": 5, "type": "text", "turn": turn,
             "hash_ids": [1000 * (i + 1) + k for k in range(4)]}
        )  # fmt: skip
    path = tmp_path / "bailian.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    ft = FleetTrace.from_mooncake(read_bailian_trace(path), 16, 32)
    assert ft.conversations.tolist() == [i % 3 for i in range(24)]
    assert ft.trace.tags == tuple(f"text/{i // 3 + 1}" for i in range(24))  # as the single-node replay's
    got = replay_fleet(ft, "session", 3, "lru", 20, window_s=WINDOW)
    owners = {conv: {int(got.replica[r]) for r in range(conv, 24, 3)} for conv in range(3)}
    assert all(len(reps) == 1 for reps in owners.values())
    assert len(set().union(*owners.values())) == 3  # the three conversations spread over the replicas
    routed, hits = reference_fleet(ft, "session", 3, 20, 0, 0)
    assert got.replica.tolist() == routed and got.hits.tolist() == hits


def test_bad_routing_and_replicas_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="--routing"):
        check_routings(["prefix", "sticky"])
    with pytest.raises(InvalidArgumentError, match="--routing"):
        check_routings([])
    ft = _fleet(tmp_path, 10, 1)
    with pytest.raises(InvalidArgumentError, match="--replicas"):
        replay_fleet(ft, "random", 0, "lru", 4)


def test_a_shared_system_prompt_alone_does_not_join_conversations() -> None:
    # block 0 is every prompt's head; a bare [0] prompt must not become everyone's parent
    assert conversation_ids([[0, 1, 2], [0], [0, 3], [0, 3, 4], [0, 1, 2, 5], [0, 6]]).tolist() == [0, 1, 2, 2, 0, 3]


def test_prefix_routing_piles_onto_one_replica_when_every_prompt_shares_its_head(tmp_path: Path) -> None:
    # a system prompt block heads every prompt: it is cached only where the first request went, so
    # the longest cached prefix is always there; the report's balance shows it (N x the mean)
    path = write_mooncake(tmp_path / "sys.jsonl", system_prompt_headed(120, 12, max_blocks=8, gap_ms=7000))
    ft = FleetTrace.from_mooncake(read_mooncake_trace(path, 64), 64, 32)
    got = replay_fleet(ft, "prefix", 4, "lru", 20, window_s=WINDOW)
    assert set(got.replica.tolist()) == {0}
    per = got.per_replica()
    assert per.max() / per.mean() == 4.0
    assert got.hit_tokens == replay_cache(ft.trace, "lru", 20).hit_tokens  # one node's figure
    assert len(set(replay_fleet(ft, "session", 4, "lru", 20, window_s=WINDOW).replica.tolist())) == 4
