"""GPU blocks shared across groups, blocks freed mid-request, the null block, changed hashes.

Each test drives the scheduler the way an engine does and checks the job specs / flush ids it
emits against the physical blocks involved (worked examples).
"""

from __future__ import annotations

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import OffloadKey, ReqContext
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.errors import InvalidArgumentError
from tests.engine.scheduler.conftest import key, make_req, put


def two_groups(pools: tuple[int, int] | None = None) -> OffloadingSchedulerConfig:
    if pools is None:  # the default: every group names blocks of one shared pool
        return OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4), GroupOffloadConfig(1, 4, 4)))
    return OffloadingSchedulerConfig(
        (GroupOffloadConfig(0, 4, 4, block_pool=pools[0]), GroupOffloadConfig(1, 4, 4, block_pool=pools[1]))
    )


def admit(sched: OffloadingScheduler, req, tables: list[list[int]]) -> None:
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, tables, 0)


# ---------------------------------------------------------------- one pool, any group
def test_flush_follows_the_physical_block_across_groups() -> None:
    sched = OffloadingScheduler(two_groups(), CPUOffloadingManager(64))
    a = make_req("A", 8, 4, tag="a")
    admit(sched, a, [[1, 2], [3, 4]])
    (store,) = sched.build_step([ScheduledRequest(a, 0, 8, [[1, 2], [3, 4]])]).store_jobs
    assert store.gpu_spec.block_ids.tolist() == [1, 2, 3, 4]
    sched.request_finished(a)
    # B gets the same physical blocks, the groups swapped: A's store reads all four
    b = make_req("B", 8, 4, tag="b")
    admit(sched, b, [[3, 4], [1, 2]])
    out = sched.build_step([ScheduledRequest(b, 0, 8, [[3, 4], [1, 2]])])
    assert out.flush_job_ids == [store.job_id]


def test_separate_pools_do_not_flush_each_other() -> None:
    sched = OffloadingScheduler(two_groups((0, 1)), CPUOffloadingManager(64))
    a = make_req("A", 8, 4, tag="a")
    admit(sched, a, [[1, 2], [3, 4]])
    (store,) = sched.build_step([ScheduledRequest(a, 0, 8, [[1, 2], [3, 4]])]).store_jobs
    sched.request_finished(a)
    b = make_req("B", 8, 4, tag="b")
    admit(sched, b, [[3, 4], [1, 2]])  # other memory: group 0's block 3 is not group 1's block 3
    assert sched.build_step([ScheduledRequest(b, 0, 8, [[3, 4], [1, 2]])]).flush_job_ids == []
    c = make_req("C", 4, 4, tag="c")
    admit(sched, c, [[2], [9]])  # group 0's block 2 is what A's store reads
    assert sched.build_step([ScheduledRequest(c, 0, 4, [[2], [9]])]).flush_job_ids == [store.job_id]


def test_block_pool_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="block_pool"):
        GroupOffloadConfig(0, 4, 4, block_pool=-1)
    with pytest.raises(InvalidArgumentError, match="null_block_id"):
        OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),), null_block_id=-1)


# ---------------------------------------------------------------- blocks leaving the window
def sw_config(null: int | None = 0, window: int = 2) -> OffloadingSchedulerConfig:
    return OffloadingSchedulerConfig(
        (GroupOffloadConfig(0, 4, 4), GroupOffloadConfig(1, 4, 4, window)), null_block_id=null
    )


def test_null_padded_table_stores_no_null_block() -> None:
    sched = OffloadingScheduler(sw_config(), CPUOffloadingManager(64))
    r = make_req("r", 32, 4)
    full = [11, 12, 13, 14, 15, 16, 17, 18]
    sw = [0, 0, 0, 0, 0, 0, 7, 8]
    admit(sched, r, [full, sw])
    (job,) = sched.build_step([ScheduledRequest(r, 0, 32, [full, sw])]).store_jobs
    gpu = job.gpu_spec
    assert 0 not in gpu.block_ids.tolist()
    assert gpu.group_block_ids(0).tolist() == full and gpu.group_block_ids(1).tolist() == [7, 8]
    assert job.keys == [key(h, 0) for h in r.block_hashes] + [key(h, 1) for h in r.block_hashes[6:]]
    assert gpu.block_indices.tolist() == [0, 6]


def test_store_retry_skips_blocks_freed_meanwhile() -> None:
    mgr = CPUOffloadingManager(6)
    other = make_req("pin", 24, 4, tag="p")
    pinned = [OffloadKey(key(h)) for h in other.block_hashes]
    put(mgr, pinned)
    mgr.prepare_load(pinned, ReqContext("pin"))  # the tier is full of pinned blocks
    sched = OffloadingScheduler(sw_config(), mgr)
    r = make_req("r", 16, 4)
    tables = [[21, 22, 23, 24], [1, 2, 3, 4]]
    admit(sched, r, tables)
    assert sched.build_step([ScheduledRequest(r, 0, 16, tables)]).store_jobs == []  # prepare_store: None
    # blocks 1 and 2 of the sliding-window group leave the window and go to another request
    sched.free_blocks(r, [[], [1, 2]])
    mgr.complete_load(pinned, ReqContext("pin"))
    b = make_req("B", 8, 4, tag="b", kv_transfer_params={"max_offload_tokens": 0})
    admit(sched, b, [[1, 2], [31, 32]])
    out = sched.build_step([ScheduledRequest(b, 0, 8, [[1, 2], [31, 32]])], [ScheduledRequest(r, 16, 0)])
    # the retry stores what is still on the GPU, nothing of blocks 1 and 2
    (job,) = out.store_jobs
    assert job.req_id == "r"
    assert job.gpu_spec.group_block_ids(0).tolist() == [21, 22, 23, 24]
    assert job.gpu_spec.group_block_ids(1).tolist() == [3, 4]
    assert job.gpu_spec.block_indices.tolist() == [0, 2]
    assert job.keys == [key(h, 0) for h in r.block_hashes] + [key(h, 1) for h in r.block_hashes[2:]]


def test_in_flight_store_of_a_freed_block_is_flushed() -> None:
    sched = OffloadingScheduler(sw_config(), CPUOffloadingManager(64))
    r = make_req("r", 24, 4)
    admit(sched, r, [[21, 22, 23, 24], [1, 2, 3, 4]])
    (store,) = sched.build_step([ScheduledRequest(r, 0, 16, [[21, 22, 23, 24], [1, 2, 3, 4]])]).store_jobs
    sched.free_blocks(r, [[], [1, 2]])
    b = make_req("B", 4, 4, tag="b")
    admit(sched, b, [[41], [2]])
    out = sched.build_step([ScheduledRequest(b, 0, 4, [[41], [2]])], [ScheduledRequest(r, 16, 4, [[25], [5]])])
    assert out.flush_job_ids == [store.job_id]


def test_free_blocks_rejects_blocks_the_request_does_not_hold() -> None:
    sched = OffloadingScheduler(sw_config(), CPUOffloadingManager(64))
    r = make_req("r", 16, 4)
    admit(sched, r, [[21, 22, 23, 24], [1, 2, 3, 4]])
    with pytest.raises(InvalidArgumentError, match=r"block_ids_per_group\[1\]"):
        sched.free_blocks(r, [[], [1, 9]])
    with pytest.raises(InvalidArgumentError, match="not running"):
        sched.free_blocks("nobody", [[], [1]])
    # nothing changed: both blocks are still stored
    (job,) = sched.build_step([ScheduledRequest(r, 0, 16, [[21, 22, 23, 24], [1, 2, 3, 4]])]).store_jobs
    assert job.gpu_spec.group_block_ids(1).tolist() == [1, 2, 3, 4]


def test_load_skips_leading_null_blocks_of_a_window() -> None:
    mgr = CPUOffloadingManager(64)
    sched = OffloadingScheduler(sw_config(window=3), mgr)
    r = make_req("r", 33, 4)
    put(mgr, [key(h, g) for g in (0, 1) for h in r.block_hashes])
    assert sched.get_num_new_matched_tokens(r, 0) == (32, True)
    # the engine keeps only the last 2 blocks of the window group: the first load block is null
    tables = [list(range(11, 20)), [0, 0, 0, 0, 0, 0, 7, 8, 9]]
    sched.update_state_after_alloc(r, tables, 32)
    (job,) = sched.build_step().load_jobs
    assert 0 not in job.gpu_spec.block_ids.tolist()
    assert job.gpu_spec.group_block_ids(1).tolist() == [7, 8]
    assert job.gpu_spec.block_indices.tolist() == [0, 6]


# ---------------------------------------------------------------- hashes that change
def test_second_lookup_follows_the_current_hashes() -> None:
    mgr = CPUOffloadingManager(64)
    sched = OffloadingScheduler(OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 16),)), mgr)
    first = make_req("r", 68, 4, tag="x")
    assert sched.get_num_new_matched_tokens(first, 0) == (0, False)
    second = make_req("r", 68, 4, tag="y")
    put(mgr, [key(second.block_hashes[j]) for j in (3, 7, 11, 15)])
    assert sched.get_num_new_matched_tokens(second, 0) == (64, True)
    # the same object whose hashes changed in place (e.g. a prompt edited before resuming)
    first.block_hashes[:] = second.block_hashes
    assert sched.get_num_new_matched_tokens(first, 0) == (64, True)
    sched.update_state_after_alloc(first, [list(range(17))], 64)
    (job,) = sched.build_step().load_jobs
    assert job.keys == [key(second.block_hashes[j]) for j in (3, 7, 11, 15)]


def test_preempted_request_resubmitted_with_other_hashes() -> None:
    mgr = CPUOffloadingManager(64)
    sched = OffloadingScheduler(OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),)), mgr)
    r = make_req("r", 8, 4, tag="x")
    admit(sched, r, [[1, 2]])
    (job,) = sched.build_step([ScheduledRequest(r, 0, 8, [[1, 2]])]).store_jobs
    sched.complete_jobs([(job.job_id, True)])
    sched.build_step(preempted_req_ids=["r"])
    r2 = make_req("r", 12, 4, tag="y")  # the engine re-submits the id with another prompt
    admit(sched, r2, [[3, 4, 5]])
    (job,) = sched.build_step([ScheduledRequest(r2, 0, 12, [[3, 4, 5]])]).store_jobs
    assert job.keys == [key(h) for h in r2.block_hashes]
    assert job.gpu_spec.block_ids.tolist() == [3, 4, 5]
