"""Load/store jobs, completion over several workers, flushes, finish, reset, config, bad input."""

from __future__ import annotations

import logging

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec, ReqContext
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.engine.scheduler.state import parse_max_offload_tokens
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.engine.scheduler.conftest import RecordingManager, key, make_req, put

CTX = ReqContext()


def cfg(factor: int = 3, num_workers: int = 1, bs: int = 4) -> OffloadingSchedulerConfig:
    return OffloadingSchedulerConfig((GroupOffloadConfig(0, bs, bs * factor),), num_workers=num_workers)


def new(r, n_comp: int, n: int, table: list[int]) -> ScheduledRequest:
    return ScheduledRequest(r, n_comp, n, [table])


def run_(r, n_comp: int, n: int, appended: list[int]) -> ScheduledRequest:
    return ScheduledRequest(r, n_comp, n, [appended])


# ---------------------------------------------------------------- load job
def test_load_job_spec_and_no_restore(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(), manager)
    r = make_req("r", 40, 4)
    put(manager, [key(r.block_hashes[j]) for j in (2, 5, 8)])
    assert sched.get_num_new_matched_tokens(r, 4) == (32, True)
    table = [50 + i for i in range(10)]
    sched.update_state_after_alloc(r, [table], 32)
    out = sched.build_step()
    (job,) = out.load_jobs
    cpu, gpu = job.spec
    assert isinstance(cpu, CPULoadStoreSpec) and isinstance(gpu, GPULoadStoreSpec)
    assert gpu.block_ids.tolist() == table[1:9]  # GPU block 0 was computed already
    assert gpu.group_sizes.tolist() == [8] and gpu.block_indices.tolist() == [1]
    assert job.keys == [key(r.block_hashes[j]) for j in (2, 5, 8)]
    slots = {k: s for k, s in zip(job.keys, cpu.block_ids.tolist(), strict=True)}
    assert len(set(slots.values())) == 3
    assert job.block_offsets[0].tolist() == list(range(1, 9))
    assert sched.build_step().load_jobs == []  # handed out once
    # the request then computes tokens 36..39; the loaded prefix is not offered to prepare_store
    sched.complete_jobs([(job.job_id, True)])
    manager.calls.clear()
    out = sched.build_step([new(r, 36, 4, table)])
    assert out.store_jobs == [] and manager.keys_of("prepare_store") == []


def test_update_state_after_alloc_rejects_mismatch_without_pinning(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(), manager)
    r = make_req("r", 40, 4)
    put(manager, [key(r.block_hashes[j]) for j in (2, 5, 8)])
    sched.get_num_new_matched_tokens(r, 0)
    with pytest.raises(InvalidArgumentError, match="offered"):
        sched.update_state_after_alloc(r, [list(range(10))], 24)
    with pytest.raises(InvalidArgumentError, match="needs at least 9"):
        sched.update_state_after_alloc(r, [list(range(5))], 36)
    with pytest.raises(InvalidTypeError, match=r"block_ids_per_group\[0\]\[1\]"):
        sched.update_state_after_alloc(r, [[1, True, 3]], 36)
    with pytest.raises(InvalidArgumentError, match="one entry per group"):
        sched.update_state_after_alloc(r, [[1], [2]], 36)
    assert "prepare_load" not in manager.names()
    assert manager.inner.get_stats().num_pinned == 0
    sched.update_state_after_alloc(r, [list(range(10))], 36)
    assert manager.inner.get_stats().num_pinned == 3


# ---------------------------------------------------------------- store jobs
def test_store_when_blocks_fill_chunked(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(), manager)
    r = make_req("r", 36, 4)
    sched.get_num_new_matched_tokens(r, 0)
    sched.update_state_after_alloc(r, [[1, 2, 3, 4]], 0)
    o1 = sched.build_step([new(r, 0, 16, [1, 2, 3, 4])])
    o2 = sched.build_step([], [run_(r, 16, 16, [5, 6, 7, 8])])
    o3 = sched.build_step([], [run_(r, 32, 4, [9])])
    got = [
        (j.gpu_spec.block_ids.tolist(), j.gpu_spec.block_indices.tolist(), j.keys)
        for o in (o1, o2, o3)
        for j in o.store_jobs
    ]
    assert got == [
        ([1, 2, 3], [0], [key(r.block_hashes[2])]),
        ([4, 5, 6], [3], [key(r.block_hashes[5])]),
        ([7, 8, 9], [6], [key(r.block_hashes[8])]),
    ]
    for o in (o1, o2, o3):
        (j,) = o.store_jobs
        assert j.cpu_spec.block_ids.size == 1
    # completing with exactly the job's keys
    sched.complete_jobs([(o.store_jobs[0].job_id, True) for o in (o1, o2, o3)])
    assert manager.keys_of("complete_store") == [[key(r.block_hashes[j])] for j in (2, 5, 8)]


def test_present_keys_are_skipped_in_the_job(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(), manager)
    r = make_req("r", 36, 4)
    put(manager, [key(r.block_hashes[5])])  # block 1 present already
    table = list(range(20, 29))
    sched.update_state_after_alloc(r, [table], 0)
    (job,) = sched.build_step([new(r, 0, 36, table)]).store_jobs
    assert job.keys == [key(r.block_hashes[2]), key(r.block_hashes[8])]
    assert job.gpu_spec.block_ids.tolist() == [20, 21, 22, 26, 27, 28]
    assert job.block_offsets[0].tolist() == [0, 1, 2, 6, 7, 8]
    assert job.gpu_spec.block_indices.tolist() == [0]


def test_prepare_store_none_retries_next_step() -> None:
    inner = CPUOffloadingManager(2)
    manager = RecordingManager(inner)
    sched = OffloadingScheduler(cfg(factor=1), manager)
    other = make_req("o", 8, 4, tag="o")
    put(inner, [key(h) for h in other.block_hashes])
    inner.prepare_load([key(h) for h in other.block_hashes], CTX)  # both slots pinned
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    out = sched.build_step([new(r, 0, 4, [1, 2])])
    assert out.store_jobs == [] and len(manager.keys_of("prepare_store")) == 1
    inner.complete_load([key(h) for h in other.block_hashes], CTX)
    out = sched.build_step([], [run_(r, 4, 4, [])])
    (job,) = out.store_jobs  # the block of the failed attempt comes again, with the new one
    assert job.keys == [key(h) for h in r.block_hashes]
    assert job.gpu_spec.block_ids.tolist() == [1, 2]


def test_empty_keys_to_store_advances() -> None:
    manager = RecordingManager(CPUOffloadingManager(8))
    sched = OffloadingScheduler(cfg(factor=1), manager)
    r = make_req("r", 12, 4)
    put(manager, [key(r.block_hashes[0])])
    manager.calls.clear()
    sched.update_state_after_alloc(r, [[1]], 0)
    assert sched.build_step([new(r, 0, 4, [1])]).store_jobs == []
    (job,) = sched.build_step([], [run_(r, 4, 4, [2])]).store_jobs
    assert job.keys == [key(r.block_hashes[1])]  # block 0 not offered again
    assert manager.keys_of("prepare_store") == [[key(r.block_hashes[0])], [key(r.block_hashes[1])]]


@pytest.mark.parametrize(
    ("params", "cap"),
    [
        (None, None),
        ({}, None),
        ({"max_offload_tokens": None}, None),
        ({"max_offload_tokens": 0}, 0),
        ({"max_offload_tokens": 24}, 24),
        ({"max_offload_tokens": "24"}, None),
        ({"max_offload_tokens": 24.5}, None),
        ({"max_offload_tokens": -1}, None),
        ({"max_offload_tokens": True}, None),
        ({"max_offload_tokens": False}, None),
        (["max_offload_tokens"], None),
    ],
)
def test_parse_max_offload_tokens(params, cap, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="kvoffload.engine.scheduler.state"):
        assert parse_max_offload_tokens(params, "r") == cap
    bad = cap is None and params not in (None, {}, {"max_offload_tokens": None})
    assert bool(caplog.records) == bad


# ---------------------------------------------------------------- completion
def test_job_completes_when_all_workers_reported(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1, num_workers=2), manager)
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    (job,) = sched.build_step([new(r, 0, 8, [1, 2])]).store_jobs
    assert sched.complete_jobs([(job.job_id, True)]) == []
    assert manager.inner.lookup(job.keys[0], CTX) is None  # still pending
    (done,) = sched.complete_jobs([(job.job_id, True)])
    assert done.success and done.is_store and done.req_id == "r"
    assert all(manager.inner.lookup(k, CTX) for k in job.keys)


def test_one_failed_worker_fails_the_store(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1, num_workers=2), manager)
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    (job,) = sched.build_step([new(r, 0, 8, [1, 2])]).store_jobs
    (done,) = sched.complete_jobs([(job.job_id, True), (job.job_id, False)])
    assert not done.success
    assert manager.keys_of("complete_store_failed") == [job.keys]
    assert len(manager.inner) == 0 and sched.num_in_flight_jobs == 0


def test_bad_reports_change_nothing(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    (job,) = sched.build_step([new(r, 0, 8, [1, 2])]).store_jobs
    with pytest.raises(InvalidArgumentError, match="not in flight"):
        sched.complete_jobs([(job.job_id, True), (999, True)])
    with pytest.raises(InvalidArgumentError, match="num_workers"):
        sched.complete_jobs([(job.job_id, True), (job.job_id, True)])
    with pytest.raises(InvalidTypeError, match="success"):
        sched.complete_jobs([(job.job_id, 1)])
    with pytest.raises(InvalidTypeError, match="job_id"):
        sched.complete_jobs([(True, True)])
    assert "complete_store" not in manager.names() and sched.num_in_flight_jobs == 1
    (done,) = sched.complete_jobs([(job.job_id, True)])
    assert done.success


# ---------------------------------------------------------------- finish, preemption, flush
def test_finished_request_blocks_flush_when_reused_for_writing(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    a = make_req("a", 8, 4, tag="a")
    sched.update_state_after_alloc(a, [[1, 2]], 0)
    (job,) = sched.build_step([new(a, 0, 8, [1, 2])]).store_jobs
    sched.request_finished(a)
    assert sched.get_request_state("a") is None
    b = make_req("b", 12, 4, tag="a")  # shares a's 2 blocks: a prefix hit reads them
    out = sched.build_step([new(b, 8, 4, [1, 2, 3])])
    assert out.flush_job_ids == []  # blocks 1, 2 are only read (below num_computed)
    c = make_req("c", 8, 4, tag="c")
    out = sched.build_step([new(c, 0, 8, [2, 4])])
    assert out.flush_job_ids == [job.job_id]  # block 2 will be written
    out = sched.build_step([new(make_req("d", 8, 4, tag="d"), 0, 8, [1, 5])])
    assert out.flush_job_ids == []  # flushed once: the engine waited for it
    (done,) = sched.complete_jobs([(job.job_id, True)])  # completes with a's context
    assert done.req_id == "a" and manager.calls[-1][1].req_id == "a"


def test_preempted_request_blocks_flush_and_state_resets(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    a = make_req("a", 16, 4, tag="a")
    sched.update_state_after_alloc(a, [[1, 2]], 0)
    (job,) = sched.build_step([new(a, 0, 8, [1, 2])]).store_jobs
    b = make_req("b", 8, 4, tag="b")
    sched.update_state_after_alloc(b, [[7]], 0)
    sched.build_step([new(b, 0, 4, [7])])
    out = sched.build_step([], [run_(b, 4, 4, [2])], preempted_req_ids=["a"])
    assert out.flush_job_ids == [job.job_id]
    st = sched.get_request_state("a")
    assert st is not None and st.groups[0].block_ids == []
    sched.complete_jobs([(job.job_id, True)])
    # re-admission finds a's blocks in the CPU tier
    assert sched.get_num_new_matched_tokens(a, 0) == (8, True)


def test_load_in_flight_of_a_finished_request_is_flushed(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    a = make_req("a", 12, 4)
    put(manager, [key(h) for h in a.block_hashes[:2]])
    n, _ = sched.get_num_new_matched_tokens(a, 0)
    sched.update_state_after_alloc(a, [[3, 4, 5]], n)
    (load,) = sched.build_step().load_jobs
    sched.request_finished(a)
    out = sched.build_step([new(make_req("x", 4, 4, tag="x"), 0, 4, [4])])
    assert out.flush_job_ids == [load.job_id]
    sched.complete_jobs([(load.job_id, True)])
    assert manager.inner.get_stats().num_pinned == 0


def test_unsent_load_of_a_finished_request_is_cancelled(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    a = make_req("a", 12, 4)
    put(manager, [key(h) for h in a.block_hashes[:2]])
    n, _ = sched.get_num_new_matched_tokens(a, 0)
    sched.update_state_after_alloc(a, [[3, 4, 5]], n)
    sched.request_finished(a)
    assert sched.build_step().load_jobs == []
    assert manager.inner.get_stats().num_pinned == 0 and sched.num_in_flight_jobs == 0


def test_build_step_bad_input_changes_nothing(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    r = make_req("r", 8, 4)
    with pytest.raises(InvalidTypeError, match="num_scheduled_tokens"):
        sched.build_step([new(r, 0, True, [1, 2])])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="group 0 has 1 GPU blocks"):
        sched.build_step([new(r, 0, 8, [1])])
    with pytest.raises(InvalidArgumentError, match="exceed num_tokens"):
        sched.build_step([new(r, 4, 8, [1, 2, 3])])
    with pytest.raises(InvalidArgumentError, match="not running"):
        sched.build_step([], [run_(r, 0, 4, [1])])
    with pytest.raises(InvalidTypeError, match="ScheduledRequest"):
        sched.build_step([r])
    assert sched.get_request_state("r") is None and manager.calls == []


# ---------------------------------------------------------------- reset, events, config
def test_reset_cache_refused_while_jobs_in_flight(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(factor=1), manager)
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    (job,) = sched.build_step([new(r, 0, 8, [1, 2])]).store_jobs
    assert sched.reset_cache() is False and len(manager.inner) == 2
    sched.complete_jobs([(job.job_id, True)])
    events = sched.take_events()
    assert [(e.keys, e.removed) for e in events] == [(job.keys, False)]
    assert sched.reset_cache() is True and len(manager.inner) == 0


def test_config_validation() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple"):
        GroupOffloadConfig(0, 4, 10)
    with pytest.raises(InvalidTypeError, match="gpu_block_size"):
        GroupOffloadConfig(0, True, 4)
    with pytest.raises(InvalidArgumentError, match=r"groups\[0\].group_idx must be 0"):
        OffloadingSchedulerConfig((GroupOffloadConfig(1, 4, 4),))
    with pytest.raises(InvalidArgumentError, match="hash_block_size"):
        OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),), hash_block_size=3)
    with pytest.raises(InvalidTypeError, match="num_workers"):
        OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),), num_workers=True)
    with pytest.raises(InvalidArgumentError, match="sliding_window"):
        GroupOffloadConfig(0, 4, 4, 0)
    c = OffloadingSchedulerConfig.from_block_sizes([16, 32], [2, 1], [None, 4], num_workers=2)
    assert c.effective_hash_block_size == 16 and c.has_sliding_window
    assert [(g.offloaded_block_size, g.block_size_factor) for g in c.groups] == [(32, 2), (32, 1)]
