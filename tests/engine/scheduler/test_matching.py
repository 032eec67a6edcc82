"""get_num_new_matched_tokens: thresholds, multi-group re-validation, deferral, touch, contexts."""

from __future__ import annotations

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.engine.scheduler.conftest import RecordingManager, key, make_req, put


def one_group(bs: int = 4, factor: int = 3, window: int | None = None) -> OffloadingSchedulerConfig:
    return OffloadingSchedulerConfig((GroupOffloadConfig(0, bs, bs * factor, window),))


def test_keys_are_the_hash_of_the_last_hash_block(manager: RecordingManager) -> None:
    cfg = OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 12),), hash_block_size=2)
    sched = OffloadingScheduler(cfg, manager)
    r = make_req("r", 36, 2)
    sched.get_num_new_matched_tokens(r, 0)
    st = sched.get_request_state("r")
    assert st.groups[0].keys == [key(r.block_hashes[j]) for j in (5, 11, 17)]


def test_full_and_partial_hits(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(one_group(), manager)
    r = make_req("r", 48, 4)  # 4 offloaded blocks of 12
    put(manager, [key(r.block_hashes[j]) for j in (2, 5)])  # blocks 0, 1
    assert sched.get_num_new_matched_tokens(r, 0) == (24, True)
    # GPU already holds 16 tokens: the load starts mid block 1
    assert sched.get_num_new_matched_tokens(r, 16) == (0, False)  # 8 tokens < one offloaded block
    assert sched.get_num_new_matched_tokens(r, 8) == (16, True)
    put(manager, [key(r.block_hashes[j]) for j in (8, 11)])
    assert sched.get_num_new_matched_tokens(r, 0) == (48, True)  # the whole prompt (full attention)


def test_less_than_one_offloaded_block_is_not_looked_up(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(one_group(), manager)
    r = make_req("r", 47, 4)
    put(manager, [key(h) for h in r.block_hashes])
    manager.calls.clear()
    assert sched.get_num_new_matched_tokens(r, 36) == (0, False)
    assert "lookup_batch" not in manager.names() and "lookup" not in manager.names()


def test_pending_key_defers(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(one_group(), manager)
    r = make_req("r", 36, 4)
    put(manager, [key(r.block_hashes[2])])
    put(manager, [key(r.block_hashes[5])], pending=True)
    assert sched.get_num_new_matched_tokens(r, 0) == (None, False)
    manager.inner.complete_store([key(r.block_hashes[5])], ReqContext())
    assert sched.get_num_new_matched_tokens(r, 0) == (24, True)


def test_every_manager_call_carries_the_request_context(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(one_group(), manager)
    params = {"max_offload_tokens": 1000, "x": 1}
    r = make_req("req-7", 36, 4, kv_transfer_params=params)
    put(manager, [key(r.block_hashes[2])])
    manager.calls.clear()
    n, _ = sched.get_num_new_matched_tokens(r, 0)
    sched.update_state_after_alloc(r, [list(range(1, 10))], n)
    out = sched.build_step()
    sched.complete_jobs([(j.job_id, True) for j in out.load_jobs])
    assert {"lookup_batch", "touch", "prepare_load", "complete_load"} <= set(manager.names())
    for _, ctx, _ in manager.calls:
        assert ctx.req_id == "req-7" and ctx.kv_transfer_params is params


def test_manager_without_lookup_batch_gives_the_same_answers() -> None:
    inner = CPUOffloadingManager(64)
    plain = RecordingManager(inner, batch=False)
    sched = OffloadingScheduler(one_group(), plain)
    r = make_req("r", 60, 4)
    put(inner, [key(r.block_hashes[j]) for j in (2, 5, 11)])  # blocks 0, 1, 3 (2 missing)
    assert sched.get_num_new_matched_tokens(r, 0) == (24, True)
    # looked up key by key, stopping at the first miss (block 2)
    assert plain.keys_of("lookup") == [[key(r.block_hashes[j])] for j in (2, 5, 8)]


# ---------------------------------------------------------------- touch (seed 000 rule)
def test_touch_full_attention_all_keys_sliding_window_from_hit_minus_window() -> None:
    cfg = OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4), GroupOffloadConfig(1, 4, 4, 2)))
    manager = RecordingManager(CPUOffloadingManager(64))
    sched = OffloadingScheduler(cfg, manager)
    r = make_req("r", 41, 4)  # 10 full blocks; the last prompt token is never loaded -> 40 max
    put(manager, [key(h, 0) for h in r.block_hashes[:6]] + [key(h, 1) for h in r.block_hashes[:6]])
    assert sched.get_num_new_matched_tokens(r, 0) == (24, True)
    touched = manager.keys_of("touch")
    assert touched[0] == [key(h, 0) for h in r.block_hashes]  # all 10 keys of group 0
    assert touched[1] == [key(h, 1) for h in r.block_hashes[4:]]  # group 1 skips 6 - 2 blocks


def test_touch_makes_the_first_key_most_recent() -> None:
    inner = CPUOffloadingManager(3)
    sched = OffloadingScheduler(one_group(4, 1), inner)
    r = make_req("r", 13, 4)
    put(inner, [key(h) for h in reversed(r.block_hashes)])
    sched.get_num_new_matched_tokens(r, 0)
    # a new store evicts the least recent: the tail key of the prefix
    from kvoffload.core.base import ReqContext

    out = inner.prepare_store([b"z" * 20], ReqContext())
    assert out.evicted_keys == [key(r.block_hashes[2])]


# ---------------------------------------------------------------- multi-group
def test_sliding_window_only_the_last_window_counts() -> None:
    manager = CPUOffloadingManager(64)
    sched = OffloadingScheduler(one_group(4, 1, window=2), manager)
    r = make_req("r", 41, 4)
    put(manager, [key(r.block_hashes[j]) for j in (0, 1, 2, 5, 6, 7)])
    # blocks 8, 9 missing -> window [6, 8) -> 32 tokens
    assert sched.get_num_new_matched_tokens(r, 0) == (32, True)
    off = sched.get_request_state("r").offer
    assert off.gpu_ranges == ((6, 8),)


def test_full_attention_shrink_revalidates_the_window() -> None:
    cfg = OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4), GroupOffloadConfig(1, 4, 4, 2)))
    manager = CPUOffloadingManager(64)
    sched = OffloadingScheduler(cfg, manager)
    r = make_req("r", 41, 4)
    put(manager, [key(h, 0) for h in r.block_hashes[:6]])  # FA: 6 blocks
    # SW: everything but block 4 -> with end 6 the last full window is [2, 4)
    put(manager, [key(h, 1) for j, h in enumerate(r.block_hashes) if j != 4])
    assert sched.get_num_new_matched_tokens(r, 0) == (16, True)
    assert sched.get_request_state("r").offer.gpu_ranges == ((0, 4), (2, 4))


def test_groups_with_different_offloaded_block_sizes_align_to_both() -> None:
    cfg = OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 8), GroupOffloadConfig(1, 4, 12)))
    manager = CPUOffloadingManager(64)
    sched = OffloadingScheduler(cfg, manager)
    r = make_req("r", 48, 4)
    put(manager, [key(r.block_hashes[j], 0) for j in (1, 3, 5, 7, 9)])  # 40 tokens of group 0
    put(manager, [key(r.block_hashes[j], 1) for j in (2, 5, 8, 11)])  # 48 tokens of group 1
    # 40 -> group 1 aligns down to 36 -> group 0 re-validates to 32 -> group 1 to 24 -> stable
    assert sched.get_num_new_matched_tokens(r, 0) == (24, True)
    assert sched.get_request_state("r").offer.gpu_ranges == ((0, 6), (0, 6))


# ---------------------------------------------------------------- deferral on loads in flight (convoy)
def _admit(sched: OffloadingScheduler, r, n_comp: int) -> int:
    n, _ = sched.get_num_new_matched_tokens(r, n_comp)
    assert n
    sched.update_state_after_alloc(r, [list(range(100, 100 + (n_comp + n) // 4))], n)
    return n


def test_hit_on_blocks_being_loaded_defers_without_convoy() -> None:
    manager = RecordingManager(CPUOffloadingManager(64))
    sched = OffloadingScheduler(one_group(4, 1), manager)
    a = make_req("a", 33, 4, tag="p")
    put(manager, [key(h) for h in a.block_hashes])
    assert _admit(sched, a, 0) == 32
    out = sched.build_step()
    assert [j.req_id for j in out.load_jobs] == ["a"]
    b = make_req("b", 41, 4, tag="p")  # same 8-block prefix, more tokens
    # b would load blocks a is loading: deferred
    assert sched.get_num_new_matched_tokens(b, 0) == (None, False)
    # c holds the shared prefix on the GPU already: no reason to wait for a's load
    c = make_req("c", 41, 4, tag="p")
    put(manager, [key(c.block_hashes[8]), key(c.block_hashes[9])])
    assert sched.get_num_new_matched_tokens(c, 32) == (8, True)
    # deferred requests register nothing: another waiter is deferred by a's load only
    d = make_req("d", 41, 4, tag="p")
    assert sched.get_num_new_matched_tokens(d, 0) == (None, False)
    sched.complete_jobs([(out.load_jobs[0].job_id, True)])
    # a's load done: every waiter is released in the same step
    assert sched.get_num_new_matched_tokens(b, 0) == (40, True)
    assert sched.get_num_new_matched_tokens(d, 0) == (40, True)


# ---------------------------------------------------------------- bad input
def test_bad_arguments(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(one_group(), manager)
    r = make_req("r", 36, 4)
    with pytest.raises(InvalidTypeError, match="num_computed_tokens"):
        sched.get_num_new_matched_tokens(r, True)
    with pytest.raises(InvalidArgumentError, match="multiple"):
        sched.get_num_new_matched_tokens(r, 6)
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        sched.get_num_new_matched_tokens(r, 40)
    with pytest.raises(InvalidTypeError, match="request_id"):
        sched.get_num_new_matched_tokens(make_req(7, 36, 4), 0)  # type: ignore[arg-type]
    assert sched.get_request_state("r") is None  # nothing was created by the failing calls
    with pytest.raises(InvalidTypeError, match="manager"):
        OffloadingScheduler(one_group(), object())
    with pytest.raises(InvalidTypeError, match="config"):
        OffloadingScheduler({"groups": []}, manager)  # type: ignore[arg-type]
