"""The kv-aware router: balances where longest-prefix routing piles up, and is exactly
join-the-shortest-queue (brute force) when it has no cache to weigh."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.engine_time import EngineTime, serve_fifo
from kvoffload.simulate.fleet import FleetTrace, replay_fleet
from kvoffload.simulate.mooncake import read_mooncake_trace
from tests.simulate.mooncake_traces import random_mooncake, system_prompt_headed, write_mooncake

_ET = EngineTime(token_s=2e-3, attn_s=0.0, step_s=0.0, kv_read_s=0.0, link_s=2e-4, tier_s=5e-4)


def _ft(tmp_path: Path, lines: list[dict[str, object]]) -> FleetTrace:
    path = write_mooncake(tmp_path / "t.jsonl", lines)
    return FleetTrace.from_mooncake(read_mooncake_trace(path, 64), 64, 64)


def test_kv_aware_spreads_what_longest_prefix_piles_onto_one_replica(tmp_path: Path) -> None:
    # every prompt starts with one shared block: prefix routing sends all to one replica; the
    # kv-aware cost sees the queue there and spreads them, keeping most of prefix's hits
    ft = _ft(tmp_path, system_prompt_headed(200, 3, max_blocks=6, gap_ms=300))
    prefix = replay_fleet(ft, "prefix", 4, "lru", 40, window_s=60.0)
    kv = replay_fleet(ft, "kv-aware", 4, "lru", 40, timing=_ET)
    tokens = ft.trace.prompt_tokens.astype(np.float64)
    assert prefix.per_replica(tokens).max() == tokens.sum()
    per = kv.per_replica(tokens)
    assert per.max() / per.mean() < 1.5
    rand = replay_fleet(ft, "random", 4, "lru", 40)
    assert kv.hit_tokens > rand.hit_tokens


def _jsq(arrival: np.ndarray, prompt: np.ndarray, replicas: int) -> np.ndarray:
    """Brute force: each request to the replica with the least unfinished work at its arrival,
    ties to the fewest prompt tokens handed so far, then the lowest index; FIFO service."""
    busy = [0.0] * replicas
    given = [0] * replicas
    out = np.zeros(len(arrival), dtype=np.int64)
    for r, (t, n) in enumerate(zip(arrival.tolist(), prompt.tolist(), strict=True)):
        rep = min(range(replicas), key=lambda i: (max(busy[i] - t, 0.0), given[i], i))
        busy[rep] = max(busy[rep], t) + n * _ET.token_s
        given[rep] += n
        out[r] = rep
    return out


@pytest.mark.parametrize("weight", [0.0, 1.0, 7.0])
def test_without_a_host_pool_kv_aware_is_join_the_shortest_queue(tmp_path: Path, weight: float) -> None:
    lines = random_mooncake(300, 9, block_tokens=64, max_blocks=8)
    for i, line in enumerate(lines):
        line["timestamp"] = i * 250
    ft = _ft(tmp_path, lines)
    got = replay_fleet(ft, "kv-aware", 3, "lru", 0, timing=_ET, kv_weight=weight)
    arrival = ft.arrival_s - ft.arrival_s[0]
    expect = _jsq(arrival, ft.trace.prompt_tokens, 3)
    assert got.replica.tolist() == expect.tolist()
    assert got.hit_tokens == 0 and len(set(expect.tolist())) == 3
    # and its queues really form: some request waits
    waits = [serve_fifo(arrival[expect == i], ft.trace.prompt_tokens[expect == i] * _ET.token_s) for i in range(3)]
    assert max(float((s - arrival[expect == i]).max()) for i, (s, _) in enumerate(waits)) > 0


def test_rate_scale_changes_kv_aware_routes_only(tmp_path: Path) -> None:
    lines = random_mooncake(200, 2, block_tokens=64, max_blocks=8)
    for i, line in enumerate(lines):
        line["timestamp"] = i * 400
    ft = _ft(tmp_path, lines)
    slow = replay_fleet(ft, "kv-aware", 3, "lru", 0, timing=_ET, rate_scale=0.1)
    fast = replay_fleet(ft, "kv-aware", 3, "lru", 0, timing=_ET, rate_scale=10.0)
    assert slow.rate_scale == 0.1 and fast.rate_scale == 10.0 and slow.kv_weight == 1.0
    assert slow.replica.tolist() != fast.replica.tolist()
    with pytest.raises(InvalidArgumentError, match="kv-aware routing needs the engine-time model"):
        replay_fleet(ft, "kv-aware", 3, "lru", 4)
