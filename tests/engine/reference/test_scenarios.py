"""Scenario tests through the reference engine loop.

Each asserts which GPU block offsets (per group) were stored, loaded and flushed, and that every
loaded block holds exactly the KV that was computed for its prefix.
"""

from __future__ import annotations

import logging

import pytest

from kvoffload.core.base import ReqContext
from kvoffload.engine.reference.config import GroupConfig
from kvoffload.engine.reference.request import SimRequest
from kvoffload.engine.scheduler.flush import FlushTracker
from tests.engine.reference.helpers import (
    FailingWorker,
    HidingManager,
    expected_key,
    make_engine,
    offsets,
    records,
    run,
    tokens,
)


# ---------------------------------------------------------------- stores
def test_stores_36_token_prompt_block4_factor3_chunked() -> None:
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=16)
    a = SimRequest("a", tokens(36), max_tokens=2)
    run(eng, a)
    recs = records(eng, "a", "store")
    # 16 tokens a step: offloaded blocks (12 tokens = GPU blocks of 4 x 3) fill at steps 1, 2, 3
    assert [r.step for r in recs] == [1, 2, 3]
    assert [r.block_offsets for r in recs] == [((0, 1, 2),), ((3, 4, 5),), ((6, 7, 8),)]
    assert [r.keys for r in recs] == [(expected_key(a, 0, i, 12, 4),) for i in range(3)]
    assert [r.cpu_slots for r in recs] == [(0,), (1,), (2,)]
    assert records(eng, kind="load") == []
    assert eng.stats.blocks_stored == 3 and eng.stats.failed_stores == 0
    assert len(eng.manager) == 3


def test_stores_36_token_prompt_one_step() -> None:
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=64)
    a = SimRequest("a", tokens(36), max_tokens=0)
    run(eng, a)
    assert offsets(eng, "a", "store") == [((0, 1, 2, 3, 4, 5, 6, 7, 8),)]
    assert records(eng, "a", "store")[0].keys == tuple(expected_key(a, 0, i, 12, 4) for i in range(3))


def test_decode_tokens_fill_and_store_a_block() -> None:
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=64)
    run(eng, SimRequest("a", tokens(30), max_tokens=10))  # 30 prompt + 9 computed outputs = 39 tokens
    assert offsets(eng, "a", "store") == [((0, 1, 2, 3, 4, 5),), ((6, 7, 8),)]


# ---------------------------------------------------------------- shared prefix: load instead of recompute
@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer", "mla"])
def test_second_request_loads_shared_prefix(layout: str) -> None:
    eng = make_engine([GroupConfig(4, 3, layout=layout)], enable_gpu_prefix_cache=False)
    p = tokens(36)
    run(eng, SimRequest("a", p, max_tokens=1))
    computed_a = eng.stats.computed_tokens
    b = SimRequest("b", p + tokens(12, seed=1), max_tokens=1)
    run(eng, b)
    load = records(eng, "b", "load")
    assert [r.block_offsets for r in load] == [((0, 1, 2, 3, 4, 5, 6, 7, 8),)]
    assert load[0].keys == tuple(expected_key(b, 0, i, 12, 4) for i in range(3))
    # only the 12 new tokens were computed for b; its loaded prefix is not stored again
    assert eng.stats.computed_tokens - computed_a == 12
    assert offsets(eng, "b", "store") == [((9, 10, 11),)]
    assert eng.stats.loaded_tokens == 36
    assert eng.stats.verified_blocks == 9 and eng.stats.verification_failures == 0


def test_partial_gpu_hit_then_unaligned_load() -> None:
    """GPU cache holds 4 GPU blocks (16 tokens): the load starts mid offloaded block."""
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=64)
    p = tokens(36)
    a = SimRequest("a", p, max_tokens=0)
    run(eng, a)
    pool = eng.pools[0]
    for i in range(4, 9):  # forget GPU blocks 4.. of the prefix
        h = a.block_hashes[i]
        b = pool.cached.pop(h)
        pool.block_hash[b] = None
    b = SimRequest("b", p + tokens(8, seed=3), max_tokens=0)
    run(eng, b)
    assert eng.stats.gpu_hit_tokens == 16
    load = records(eng, "b", "load")
    assert [r.block_offsets for r in load] == [((4, 5, 6, 7, 8),)]
    assert load[0].keys == tuple(expected_key(b, 0, i, 12, 4) for i in (1, 2))
    assert eng.stats.verified_blocks == 5 and eng.stats.verification_failures == 0


def test_full_prompt_hit_recomputes_last_token() -> None:
    eng = make_engine([GroupConfig(4, 3)], enable_gpu_prefix_cache=False, max_num_batched_tokens=64)
    p = tokens(36)
    run(eng, SimRequest("a", p, max_tokens=0))
    before = eng.stats.computed_tokens
    run(eng, SimRequest("b", list(p), max_tokens=3))
    assert offsets(eng, "b", "load") == [((0, 1, 2, 3, 4, 5, 6, 7, 8),)]
    # the whole prompt was loaded; the engine recomputes its last token, then decodes 2 tokens
    assert eng.stats.computed_tokens - before == 3
    assert eng.stats.verification_failures == 0


def test_outputs_do_not_depend_on_where_the_kv_came_from() -> None:
    p = tokens(40, seed=5)
    eng1 = make_engine([GroupConfig(4, 3)], enable_gpu_prefix_cache=False)
    run(eng1, SimRequest("a", p, max_tokens=0), SimRequest("b", p + [7, 8, 9], max_tokens=5))
    eng2 = make_engine([GroupConfig(4, 3)])
    run(eng2, SimRequest("b", p + [7, 8, 9], max_tokens=5))
    assert eng1.stats.loaded_tokens > 0 and eng2.stats.loaded_tokens == 0
    assert eng1.get_request("b").output_token_ids == eng2.get_request("b").output_token_ids


# ---------------------------------------------------------------- preemption with stores in flight
def _preemption_engine(flush: bool, monkeypatch: pytest.MonkeyPatch):
    if not flush:
        monkeypatch.setattr(FlushTracker, "collect", lambda self, group, blocks, out: None)
    # 10 usable GPU blocks of 4 tokens; stores run 3 steps after submission
    eng = make_engine(
        [GroupConfig(4, 1)],
        num_gpu_blocks=11,
        max_num_batched_tokens=64,
        transfer_latency_steps=3,
        enable_gpu_prefix_cache=False,
    )
    b = SimRequest("b", tokens(8, seed=1), max_tokens=6)
    a = SimRequest("a", tokens(32, seed=2), max_tokens=2)
    run(eng, b, a)
    return eng


def test_preemption_flushes_in_flight_stores_and_reloads(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _preemption_engine(True, monkeypatch)
    stores_a = records(eng, "a", "store")
    assert [r.step for r in stores_a][:1] == [1]
    assert stores_a[0].block_offsets == ((0, 1, 2, 3, 4, 5, 6, 7),)
    # step 2: b needs a block, a (last in the running list) is preempted, its last block goes to b
    # while a's store of blocks 0..7 is still queued: that store is flushed first
    assert eng.stats.preemptions >= 1
    assert (2, stores_a[0].job_id) in eng.flush_log
    # re-admission loads a's prefix back from the CPU, and every loaded byte is right
    loads_a = records(eng, "a", "load")
    assert loads_a and loads_a[0].block_offsets == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert eng.stats.verified_blocks >= 8
    assert eng.stats.verification_failures == 0


def test_without_flush_the_reloaded_block_is_corrupt(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """Negative control: the same run with flushing disabled stores a block b overwrote."""
    with caplog.at_level(logging.ERROR, logger="kvoffload.engine.reference.engine"):
        eng = _preemption_engine(False, monkeypatch)
    assert eng.flush_log == []
    assert eng.stats.verification_failures >= 1
    assert "differ from the computed KV" in caplog.text


# ---------------------------------------------------------------- sliding window
def test_full_attention_plus_sliding_window_loads_only_the_window() -> None:
    groups = [GroupConfig(4, 1), GroupConfig(4, 1, sliding_window_blocks=2)]
    eng = make_engine(groups, enable_gpu_prefix_cache=False, max_num_batched_tokens=64)
    p = tokens(32)
    run(eng, SimRequest("a", p, max_tokens=0))
    assert offsets(eng, "a", "store") == [(tuple(range(8)), tuple(range(8)))]
    run(eng, SimRequest("b", list(p), max_tokens=0))
    # the last prompt token is never loaded with a sliding-window group: 7 blocks (28 tokens),
    # the full-attention group loads all 7, the sliding-window group only the last 2
    assert offsets(eng, "b", "load") == [((0, 1, 2, 3, 4, 5, 6), (5, 6))]
    assert eng.stats.loaded_tokens == 28
    assert eng.stats.verified_blocks == 9 and eng.stats.verification_failures == 0


def test_sliding_window_group_finds_the_last_window() -> None:
    eng = make_engine(
        [GroupConfig(4, 1, sliding_window_blocks=2)], enable_gpu_prefix_cache=False, max_num_batched_tokens=64
    )
    p = tokens(40)
    a = SimRequest("a", p, max_tokens=0)
    run(eng, a)
    hidden = {expected_key(a, 0, i, 4, 4) for i in range(4)}  # early blocks absent from the CPU
    eng.scheduler.manager = HidingManager(eng.manager, hidden)
    run(eng, SimRequest("b", p + [1, 2, 3], max_tokens=0))
    # 43 tokens -> 42 loadable -> 10 full blocks; the last full window is blocks 8, 9
    assert offsets(eng, "b", "load") == [((8, 9),)]
    assert eng.stats.loaded_tokens == 40
    assert eng.stats.verification_failures == 0


# ---------------------------------------------------------------- groups with different block sizes
def test_two_groups_store_when_their_own_block_fills() -> None:
    groups = [GroupConfig(4, 2), GroupConfig(8, 2)]  # offloaded blocks of 8 and 16 tokens
    eng = make_engine(groups, max_num_batched_tokens=8, enable_gpu_prefix_cache=False)
    a = SimRequest("a", tokens(32), max_tokens=0)
    run(eng, a)
    recs = records(eng, "a", "store")
    assert [(r.step, r.block_offsets) for r in recs] == [
        (1, ((0, 1), ())),
        (2, ((2, 3), (0, 1))),
        (3, ((4, 5), ())),
        (4, ((6, 7), (2, 3))),
    ]
    assert recs[1].keys == (expected_key(a, 0, 1, 8, 4), expected_key(a, 1, 0, 16, 4))
    # both groups come back in one load (33 tokens: 4 blocks of 8 and 2 blocks of 16)
    run(eng, SimRequest("b", a.all_token_ids + [5], max_tokens=0))
    assert offsets(eng, "b", "load") == [((0, 1, 2, 3, 4, 5, 6, 7), (0, 1, 2, 3))]
    assert eng.stats.verified_blocks == 12 and eng.stats.verification_failures == 0


# ---------------------------------------------------------------- max_offload_tokens
@pytest.mark.parametrize("value", [None, "24", 24.5, -1, True])
def test_max_offload_tokens_invalid_means_no_cap(value: object, caplog) -> None:
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=64)
    params = None if value is None else {"max_offload_tokens": value}
    with caplog.at_level(logging.WARNING, logger="kvoffload.engine.scheduler.state"):
        run(eng, SimRequest("a", tokens(36), max_tokens=0, kv_transfer_params=params))
    assert offsets(eng, "a", "store") == [((0, 1, 2, 3, 4, 5, 6, 7, 8),)]
    assert ("max_offload_tokens" in caplog.text) == (value is not None)


@pytest.mark.parametrize(
    ("cap", "stored"),
    [
        (0, []),
        (24, [tuple(range(6))]),
        (25, [tuple(range(6))]),
        (36, [tuple(range(9))]),
        (1000, [tuple(range(9)), (9, 10, 11)]),
    ],
)
def test_max_offload_tokens_caps_stores(cap: int, stored: list) -> None:
    eng = make_engine([GroupConfig(4, 3)], max_num_batched_tokens=64)
    run(eng, SimRequest("a", tokens(36), max_tokens=20, kv_transfer_params={"max_offload_tokens": cap}))
    assert offsets(eng, "a", "store") == [(s,) for s in stored]


# ---------------------------------------------------------------- failed store
def test_failed_store_leaves_nothing_loadable_and_leaks_nothing() -> None:
    # 3 CPU slots: exactly one 36-token prompt
    eng = make_engine([GroupConfig(4, 3)], enable_gpu_prefix_cache=False, max_num_batched_tokens=64, num_cpu_blocks=3)
    eng.worker = FailingWorker(eng.worker, lambda jid, spec: jid == 0)
    p = tokens(36)
    a = SimRequest("a", p, max_tokens=0)
    run(eng, a)
    assert offsets(eng, "a", "store") == [((0, 1, 2, 3, 4, 5, 6, 7, 8),)]
    assert eng.stats.failed_stores == 1 and eng.stats.blocks_stored == 0
    assert len(eng.manager) == 0  # the pending keys were removed
    stats = eng.manager.get_stats()
    assert stats.num_used == 0 and stats.num_pending == 0 and stats.num_pinned == 0
    assert eng.scheduler.num_in_flight_jobs == 0
    assert not any(eng.manager.lookup(expected_key(a, 0, i, 12, 4), ReqContext()) for i in range(3))
    # b recomputes everything (nothing loadable), and its store gets the 3 slots back
    run(eng, SimRequest("b", list(p), max_tokens=0))
    assert records(eng, "b", "load") == []
    assert eng.stats.loaded_tokens == 0
    assert sorted(records(eng, "b", "store")[0].cpu_slots) == [0, 1, 2]
    assert eng.stats.blocks_stored == 3 and len(eng.manager) == 3
