"""The cache-level replay with a shared tier beneath host memory, against an independent reference."""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.mooncake import read_mooncake_trace
from kvoffload.simulate.optimal import replay_infinite
from kvoffload.simulate.shared_tier import LRUTierModel
from tests.keys import POLICIES
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


def _trace(tmp_path: Path, n: int, seed: int, trace_block: int = 64, block: int = 32, **kw: int) -> BlockTrace:
    path = write_mooncake(tmp_path / f"t{seed}.jsonl", random_mooncake(n, seed, trace_block, **kw))
    return BlockTrace.from_mooncake(read_mooncake_trace(path, trace_block), trace_block, block)


def _requests(bt: BlockTrace) -> list[list[int]]:
    return [bt.ids[bt.starts[r] : bt.starts[r + 1]].tolist() for r in range(bt.num_requests)]


def _lead(blocks: list[int], held: object) -> int:
    h = 0
    while h < len(blocks) and blocks[h] in held:  # type: ignore[operator]
        h += 1
    return h


def _lru_store(cache: OrderedDict[int, None], new: list[int], keep: set[int], capacity: int) -> bool:
    """Add ``new`` (absent) as most recent, evicting the least recent blocks not in ``keep``;
    False (nothing changed) when that cannot make room."""
    need = len(new) - (capacity - len(cache))
    if need > 0:
        victims = list(islice((b for b in cache if b not in keep), need))
        if len(victims) < need:
            return False
        for v in victims:
            del cache[v]
    for b in new:
        cache[b] = None
    return True


def reference_two_tier(requests: list[list[int]], host: int, tier: int) -> tuple[list[int], list[int]]:
    """Per request: hit blocks and, of those, blocks from the tier; an LRU host pool over a
    Redis-like LRU tier, written from the rules alone. A request's blocks are looked up in the
    host pool; from its first miss on, blocks missing there are looked up in the tier (no recency
    change) up to the first block missing from both; those tier blocks are stored into the host
    pool as most recent (evicting the least recent blocks that are neither those nor the request's
    host blocks; all or none) and read in the tier (most recent). The hit is the leading run of
    blocks now in the host pool; the request's host blocks are used (head most recent), the absent
    blocks after the hit stored (evicting least recent blocks not offered; all or none) and those
    stored written to the tier (present: most recent; absent: added, least recent evicted)."""
    cache: OrderedDict[int, None] = OrderedDict()
    shared: OrderedDict[int, None] = OrderedDict()
    hits, from_tier = [], []
    for blocks in requests:
        h, t = reference_request(cache, shared, blocks, host, tier)
        hits.append(h)
        from_tier.append(t)
    return hits, from_tier


def reference_request(
    cache: OrderedDict[int, None], shared: OrderedDict[int, None], blocks: list[int], host: int, tier: int
) -> tuple[int, int]:
    """One request of :func:`reference_two_tier` on an LRU host pool ``cache`` of ``host`` blocks
    over the tier ``shared`` of ``tier`` blocks: its hit blocks and, of those, blocks from the tier."""
    first = _lead(blocks, cache)
    promoted: list[int] = []
    for b in blocks[first:]:
        if b in cache:
            continue
        if b not in shared:
            break
        promoted.append(b)
    if promoted:
        keep = set(promoted) | {b for b in blocks if b in cache}
        if _lru_store(cache, promoted, keep, host):
            for b in promoted:
                shared.move_to_end(b)
        else:
            promoted = []
    h = _lead(blocks, cache)
    for b in reversed(blocks):
        if b in cache:
            cache.move_to_end(b)
    new = [b for b in blocks[h:] if b not in cache]
    if new and _lru_store(cache, new, set(blocks[h:]), host) and tier:
        for b in new:
            if b in shared:
                shared.move_to_end(b)
            else:
                shared[b] = None
                if len(shared) > tier:
                    shared.popitem(last=False)
    return h, sum(1 for b in blocks[:h] if b in promoted)


@pytest.mark.parametrize("seed", range(6))
def test_lru_over_lru_matches_an_independent_reference(tmp_path: Path, seed: int) -> None:
    bt = _trace(tmp_path, 200, 40 + seed, max_blocks=12)
    reqs = _requests(bt)
    promoted_somewhere = False
    for host in (1, 4, 9, 25, 60):
        for tier in (1, 5, 20, 80, bt.num_blocks):
            got = replay_cache(bt, "lru", host, tier_capacity=tier)
            hits, from_tier = reference_two_tier(reqs, host, tier)
            assert got.per_request.tolist() == hits, (host, tier)
            assert got.tier_per_request.tolist() == from_tier, (host, tier)
            assert got.tier_hit_blocks == sum(from_tier)
            promoted_somewhere |= got.tier_hit_blocks > 0
    assert promoted_somewhere


@pytest.mark.parametrize("policy", POLICIES)
def test_tier_capacity_zero_is_the_one_tier_replay(tmp_path: Path, policy: str) -> None:
    bt = _trace(tmp_path, 150, 3)
    for host in (3, 20, 100):
        one = replay_cache(bt, policy, host)
        zero = replay_cache(bt, policy, host, tier_capacity=0)
        assert zero.per_request.tolist() == one.per_request.tolist()
        fields = ("hit_tokens", "stored_blocks", "evictions", "failed_stores", "distinct_stored")
        assert [getattr(zero, f) for f in fields] == [getattr(one, f) for f in fields]
        assert (zero.tier_hit_tokens, zero.tier_hit_blocks, zero.tier_evictions) == (0, 0, 0)
        # and against the reference with an empty tier
        if policy == "lru":
            assert one.per_request.tolist() == reference_two_tier(_requests(bt), host, 0)[0]


def test_token_split_adds_up_and_the_last_token_is_never_loaded(tmp_path: Path) -> None:
    # a 2-block prompt seen twice with a 1-block host pool between them flushed by another prompt:
    # the second time both blocks come from the tier, 63 tokens (the last one is computed)
    path = write_mooncake(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 64, "output_length": 1, "hash_ids": [5]},
            {"timestamp": 1, "input_length": 64, "output_length": 1, "hash_ids": [9]},
            {"timestamp": 2, "input_length": 64, "output_length": 1, "hash_ids": [5]},
        ],
    )
    bt = BlockTrace.from_mooncake(read_mooncake_trace(path, 64), 64, 32)
    r = replay_cache(bt, "lru", 2, tier_capacity=10)
    assert r.per_request.tolist() == [0, 0, 2]
    assert r.tier_per_request.tolist() == [0, 0, 2]
    assert (r.hit_tokens, r.tier_hit_tokens, r.host_hit_tokens) == (63, 63, 0)
    assert r.tier_evictions == 0
    assert replay_cache(bt, "lru", 2).hit_tokens == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_an_unbounded_tier_reaches_the_infinite_cache(tmp_path: Path, policy: str) -> None:
    """With room in the host pool for any one request (no store or promotion is ever refused) and
    a tier that never evicts, every block ever stored stays reachable: the infinite line."""
    for seed in range(3):
        bt = _trace(tmp_path, 150, 70 + seed, max_blocks=8)
        inf = replay_infinite(bt)
        for host in (16, 40):  # a request has at most 8 x 2 blocks
            r = replay_cache(bt, policy, host, tier_capacity=bt.num_blocks)
            assert r.failed_stores == r.refused_promotions == 0
            assert r.per_request.tolist() == inf.per_request.tolist(), (seed, host)
            assert r.hit_tokens == inf.hit_tokens


def test_lru_tier_model_touch_rules() -> None:
    t = LRUTierModel(3)
    t.write([1, 2, 3])
    assert t.contains(1)  # EXISTS does not refresh: 1 stays least recent
    t.write([4])
    assert not t.contains(1) and t.evictions == 1
    t.write([2])  # SET NX of a present block: kept, most recent
    t.write([5])
    assert not t.contains(3) and t.contains(2)
    t.read([4])  # GET: most recent
    t.write([6])
    assert [b for b in (2, 4, 5, 6) if t.contains(b)] == [4, 5, 6]
    assert t.writes == 6 and len(t) == 3
    with pytest.raises(InvalidArgumentError, match="tier capacity"):
        LRUTierModel(-1)
    assert np.array_equal(np.zeros(0), np.zeros(0))


def test_more_tier_capacity_can_load_less(tmp_path: Path) -> None:
    """Not monotone, so not claimed: a larger tier promotes more blocks, each promotion evicts in
    host memory, and the blocks it evicts may be gone from the tier too. On this trace 30 tier
    blocks (over 12 host blocks) load fewer blocks than 27; both stay within the infinite cache."""
    bt = _trace(tmp_path, 200, 500, max_blocks=12)
    small, large = (replay_cache(bt, "lru", 12, tier_capacity=t) for t in (27, 30))
    assert large.hit_blocks < small.hit_blocks
    reqs = _requests(bt)
    assert [sum(reference_two_tier(reqs, 12, t)[0]) for t in (27, 30)] == [small.hit_blocks, large.hit_blocks]
    assert small.hit_blocks <= replay_infinite(bt).hit_blocks
