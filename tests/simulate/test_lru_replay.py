"""The one-tier LRU replay without the manager's calls makes the manager's decisions: every
request's hit, the stores, evictions and failed stores agree with the replay through
``CPUOffloadingManager(capacity, "lru")``, down to one block (failed stores, evictions of blocks
the request just hit, present blocks after a miss spared)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import ReplayResult, replay_cache
from kvoffload.simulate.lru_replay import replay_lru
from kvoffload.simulate.mooncake import read_mooncake_trace
from tests.simulate.mooncake_traces import random_mooncake, system_prompt_headed, write_mooncake

FIELDS = ("prompt_tokens", "hit_blocks", "hit_tokens", "stored_blocks", "evictions", "failed_stores", "distinct_stored")


def _trace(tmp_path: object, lines: list[dict[str, object]], block: int) -> BlockTrace:
    path = write_mooncake(tmp_path / "t.jsonl", lines)  # type: ignore[operator]
    return BlockTrace.from_mooncake(read_mooncake_trace(path, 64), 64, block)


def _same(a: ReplayResult, b: ReplayResult) -> None:
    assert {f: getattr(a, f) for f in FIELDS} == {f: getattr(b, f) for f in FIELDS}
    assert np.array_equal(a.per_request, b.per_request)
    assert not a.tier_per_request.any() and len(a.tier_per_request) == len(b.tier_per_request)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [32, 64])
def test_lru_replay_makes_the_managers_decisions(seed: int, block: int, tmp_path: object) -> None:
    bt = _trace(tmp_path, random_mooncake(300, seed, block_tokens=64, max_blocks=14), block)
    lists = bt.key_lists()
    caps = sorted({1, 2, 3, 5, 8, 13, 21, 40, 80, bt.num_blocks // 2, bt.num_blocks, bt.num_blocks + 7})
    seen_failed = seen_spared = False
    for cap in caps:
        fast = replay_cache(bt, "lru", cap)
        ref = replay_cache(bt, "lru", cap, lists, manager=True)
        _same(fast, ref)
        seen_failed |= fast.failed_stores > 0
        seen_spared |= fast.evictions > 0 and fast.failed_stores == 0
    assert seen_failed and seen_spared  # the sweep reached both regimes


def test_a_shared_system_prompt_and_long_requests(tmp_path: object) -> None:
    bt = _trace(tmp_path, system_prompt_headed(200, 4, max_blocks=30, gap_ms=10), 64)
    lists = bt.key_lists()
    for cap in (1, 4, 16, 31, 64, 200):
        _same(replay_cache(bt, "lru", cap), replay_cache(bt, "lru", cap, lists, manager=True))


def test_a_request_repeating_a_block_is_seen(tmp_path: object) -> None:
    """(The readers refuse such traces; a hand-built one is left to the manager.)"""
    bt = _trace(tmp_path, random_mooncake(40, 2, block_tokens=64), 64)
    assert not bt.has_repeats
    ids = bt.ids.copy()
    r = next(i for i in range(bt.num_requests) if bt.starts[i + 1] - bt.starts[i] >= 2)
    ids[bt.starts[r] + 1] = ids[bt.starts[r]]
    assert replace(bt, ids=ids).has_repeats


@pytest.mark.parametrize("cap", [0, -1, True, 2.0])
def test_lru_replay_refuses_a_bad_capacity(cap: object, tmp_path: object) -> None:
    bt = _trace(tmp_path, random_mooncake(10, 1, block_tokens=64), 64)
    with pytest.raises(InvalidArgumentError, match="capacity"):
        replay_lru(bt, cap)  # type: ignore[arg-type]
