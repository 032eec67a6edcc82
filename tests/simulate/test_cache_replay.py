"""The cache-level replay against an independent LRU, its reference lines, and the engine replay."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.drive import drive
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.null_worker import NullTransferWorker
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.cache_sweep import sweep_cache
from kvoffload.simulate.cli import _mooncake_to_trace, _to_request
from kvoffload.simulate.mooncake import read_mooncake_trace
from kvoffload.simulate.optimal import BeladyPlan, replay_belady, replay_belady_heap, replay_infinite
from tests.keys import POLICIES
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


def _trace(tmp_path: Path, n: int, seed: int, trace_block: int = 64, block: int = 32, **kw: int) -> BlockTrace:
    path = write_mooncake(tmp_path / f"t{seed}.jsonl", random_mooncake(n, seed, trace_block, **kw))
    return BlockTrace.from_mooncake(read_mooncake_trace(path, trace_block), trace_block, block)


@dataclass
class LRUTotals:
    """What :func:`reference_lru` counts: hit blocks per request, blocks evicted, blocks stored,
    requests whose store found no room, and the distinct blocks ever stored."""

    hits: list[int] = field(default_factory=list)
    evictions: int = 0
    stored: int = 0
    failed: int = 0
    ever_stored: set[int] = field(default_factory=set)


def reference_lru(requests: list[list[int]], capacity: int) -> LRUTotals:
    """An LRU over block ids, written from the rules alone: a hit is the leading run of the
    request's blocks in the cache; then every present block of the request is used (the head of
    the prompt most recently); the blocks after the hit that are absent are stored, evicting the
    least recent blocks not present in that store batch; if that cannot make room, nothing is
    stored (a failed store)."""
    cache: OrderedDict[int, None] = OrderedDict()  # least recent first
    out = LRUTotals()
    for blocks in requests:
        h = 0
        while h < len(blocks) and blocks[h] in cache:
            h += 1
        out.hits.append(h)
        for b in reversed(blocks):
            if b in cache:
                cache.move_to_end(b)
        offered = blocks[h:]
        new = [b for b in offered if b not in cache]
        if not new:
            continue
        need = len(new) - (capacity - len(cache))
        if need > 0:
            keep = set(offered)
            victims = list(islice((b for b in cache if b not in keep), need))
            if len(victims) < need:
                out.failed += 1
                continue
            for v in victims:
                del cache[v]
            out.evictions += need
        for b in new:
            cache[b] = None
        out.stored += len(new)
        out.ever_stored.update(new)
    return out


def _requests(bt: BlockTrace) -> list[list[int]]:
    return [bt.ids[bt.starts[r] : bt.starts[r + 1]].tolist() for r in range(bt.num_requests)]


@pytest.mark.parametrize("seed", range(6))
def test_lru_matches_an_independent_ordered_dict_lru(tmp_path: Path, seed: int) -> None:
    bt = _trace(tmp_path, 150, seed)
    reqs = _requests(bt)
    for capacity in (1, 4, 9, 25, 60, 200, bt.num_blocks):
        got = replay_cache(bt, "lru", capacity)
        want = reference_lru(reqs, capacity)
        assert got.per_request.tolist() == want.hits, capacity
        assert (got.evictions, got.stored_blocks, got.failed_stores) == (want.evictions, want.stored, want.failed)
        assert got.distinct_stored == len(want.ever_stored)
        assert got.hit_blocks == sum(want.hits)


def test_belady_bounds_every_policy_and_infinite_bounds_belady(tmp_path: Path) -> None:
    for seed in range(5):
        bt = _trace(tmp_path, 200, 100 + seed, max_blocks=14)
        inf = replay_infinite(bt)
        plan = BeladyPlan(bt)
        for capacity in (2, 6, 15, 40, 100, 300):
            bel = replay_belady(plan, capacity)
            assert bel.hit_tokens <= inf.hit_tokens
            assert bel.hit_blocks <= inf.hit_blocks
            for policy in POLICIES:
                r = replay_cache(bt, policy, capacity)
                assert r.hit_blocks <= bel.hit_blocks, (seed, capacity, policy)
                assert r.hit_tokens <= bel.hit_tokens, (seed, capacity, policy)
        # with room for everything Belady keeps every block that is used again: the infinite line
        assert replay_belady(plan, bt.num_blocks).hit_blocks == inf.hit_blocks


def _brute_force_best(requests: list[list[int]], capacity: int) -> int:
    """The most hit blocks any cache of ``capacity`` blocks can get, by trying every choice of
    which blocks to keep after each request (hits: the leading run, as in the replay)."""
    from itertools import combinations

    best: dict[frozenset[int], int] = {frozenset(): 0}
    for blocks in requests:
        nxt: dict[frozenset[int], int] = {}
        for held, score in best.items():
            h = 0
            while h < len(blocks) and blocks[h] in held:
                h += 1
            pool = sorted(held | set(blocks))
            for k in range(min(capacity, len(pool)) + 1):
                for keep in combinations(pool, k):
                    f = frozenset(keep)
                    if nxt.get(f, -1) < score + h:
                        nxt[f] = score + h
        best = nxt
    return max(best.values())


def test_belady_is_the_optimum_on_tiny_traces(tmp_path: Path) -> None:
    for seed in range(4):
        bt = _trace(tmp_path, 7, 300 + seed, trace_block=32, block=32, max_blocks=4)
        reqs = _requests(bt)
        plan = BeladyPlan(bt)
        for capacity in (1, 2, 3):
            assert replay_belady(plan, capacity).hit_blocks == _brute_force_best(reqs, capacity), (seed, capacity)


@pytest.mark.parametrize("seed", range(4))
def test_belady_without_eviction_equals_the_heap_replay(tmp_path: Path, seed: int) -> None:
    """At or above the plan's peak of held blocks Belady is computed without the replay: the same
    result as the heap replay, field for field; the peak is exact (one block less evicts)."""
    bt = _trace(tmp_path, 120, 40 + seed)
    plan = BeladyPlan(bt)
    assert replay_belady_heap(plan, plan.peak_held - 1).evictions > 0
    assert replay_belady_heap(plan, plan.peak_held).evictions == 0
    for capacity in (plan.peak_held - 1, plan.peak_held, plan.peak_held + 1, bt.num_blocks):
        got, want = replay_belady(plan, capacity), replay_belady_heap(plan, capacity)
        assert got.per_request.tolist() == want.per_request.tolist(), capacity
        same = ("hit_blocks", "hit_tokens", "stored_blocks", "evictions", "distinct_stored", "prompt_tokens")
        assert [getattr(got, f) for f in same] == [getattr(want, f) for f in same], capacity


def test_infinite_hits_the_leading_run_of_blocks_seen_before(tmp_path: Path) -> None:
    bt = _trace(tmp_path, 100, 7)
    seen: set[int] = set()
    expect = []
    for blocks in _requests(bt):
        h = 0
        while h < len(blocks) and blocks[h] in seen:
            h += 1
        expect.append(h)
        seen.update(blocks)
    assert replay_infinite(bt).per_request.tolist() == expect


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_replay_agrees_with_the_engine_replay(tmp_path: Path, policy: str) -> None:
    """Agree: with one request at a time, no GPU prefix cache, whole prompts prefilled in one step
    and nothing generated, the engine loads exactly the cache-level replay's hit tokens, evicts the
    same number of blocks and stores the same distinct blocks, at every capacity."""
    path = write_mooncake(tmp_path / "t.jsonl", random_mooncake(60, 11))
    reqs = read_mooncake_trace(path, 64)
    bt = BlockTrace.from_mooncake(reqs, 64, 32)
    items = _mooncake_to_trace(reqs, 64)
    for capacity in (3, 8, 20, 60, 500):
        cache = replay_cache(bt, policy, capacity)
        config = EngineConfig(
            groups=(GroupConfig(16, 2, None, 1),),
            num_gpu_blocks=64,
            num_cpu_blocks=capacity,
            num_heads=1,
            head_dim=4,
            max_num_seqs=1,
            max_num_batched_tokens=4096,
            enable_gpu_prefix_cache=False,
            verify_loads=False,
            track_stored_keys=True,
            cache_policy=policy,
            device="cpu",
        )
        engine = Engine(config, worker=NullTransferWorker())
        drive(engine, [_to_request(t) for t in items], 1)
        engine.shutdown()
        s = engine.stats
        assert s.prompt_tokens == cache.prompt_tokens
        assert s.prefill_loaded_tokens == cache.hit_tokens, capacity
        assert s.cpu_evictions == cache.evictions, capacity
        assert s.distinct_blocks_stored == cache.distinct_stored, capacity
        assert cache.hit_tokens > 0 or capacity < 8


def test_sweep_on_two_processes_equals_one(tmp_path: Path) -> None:
    bt = _trace(tmp_path, 120, 21)
    caps = [5, 30, 120]
    seen: list[tuple[int, int]] = []
    one = sweep_cache(bt, POLICIES, caps, jobs=1)
    two = sweep_cache(bt, POLICIES, caps, jobs=2, progress=lambda d, n, r, e, left: seen.append((d, n)))
    assert [(r.policy, r.capacity, r.hit_tokens, r.evictions) for r in one.runs] == [
        (r.policy, r.capacity, r.hit_tokens, r.evictions) for r in two.runs
    ]
    assert [(r.policy, r.capacity) for r in one.runs] == [(p, c) for p in POLICIES for c in caps]
    assert {c: r.hit_tokens for c, r in one.belady.items()} == {c: r.hit_tokens for c, r in two.belady.items()}
    assert one.infinite.hit_tokens == two.infinite.hit_tokens
    tasks = (len(POLICIES) + 1) * len(caps)  # every policy and Belady, per capacity
    assert seen == [(i, tasks) for i in range(1, tasks + 1)]


def test_hit_tokens_leave_the_last_prompt_token_to_compute(tmp_path: Path) -> None:
    # two identical prompts of exactly two 32-token blocks: the second loads 63 tokens, not 64
    path = write_mooncake(
        tmp_path / "t.jsonl",
        [{"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [5]}] * 2,
    )
    bt = BlockTrace.from_mooncake(read_mooncake_trace(path, 64), 64, 32)
    r = replay_cache(bt, "lru", 10)
    assert r.per_request.tolist() == [0, 2]
    assert r.hit_tokens == 63
    assert np.array_equal(replay_infinite(bt).per_request, r.per_request)
