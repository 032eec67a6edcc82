"""The scheduler's input checks (kvoffload.engine.scheduler.validation) on every entry point.

Each bad input raises a ``KVOffloadError`` (also ``ValueError``/``TypeError``) naming the argument,
before the scheduler or the manager changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.engine.scheduler.conftest import RecordingManager, hashes, key, make_req, manager_state, put, sched_state


def cfg(factor: int = 1, bs: int = 4) -> OffloadingSchedulerConfig:
    return OffloadingSchedulerConfig((GroupOffloadConfig(0, bs, bs * factor),))


def new(r: Any, n_comp: int, n: int, table: list[int]) -> ScheduledRequest:
    return ScheduledRequest(r, n_comp, n, [table])


def run_(r: Any, n_comp: int, n: int, appended: list[int]) -> ScheduledRequest:
    return ScheduledRequest(r, n_comp, n, [appended])


# ------------------------------------------------------------------ preempted_req_ids
@pytest.mark.parametrize(
    "preempted,exc,match",
    [
        ("A", InvalidTypeError, "preempted_req_ids must be .*not a single str"),
        (b"A", InvalidTypeError, "preempted_req_ids"),
        (5, InvalidTypeError, "preempted_req_ids"),
        (["A", "zz"], InvalidArgumentError, r"preempted_req_ids\[1\].*'zz'"),
        (["A", 5], InvalidTypeError, r"preempted_req_ids\[1\] must be a str"),
        ([None], InvalidTypeError, r"preempted_req_ids\[0\]"),
    ],
)
def test_bad_preempted_req_ids_change_nothing(busy, preempted: object, exc: type, match: str) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(exc, match=match):
        sched.build_step([], [], preempted)  # type: ignore[arg-type]
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    # A still owns its blocks: a request writing block 2 is not flushed against A's store
    out = sched.build_step([new(make_req("C", 4, 4, tag="c"), 0, 4, [2])])
    assert out.flush_job_ids == []


def test_preempted_ids_as_any_iterable_of_str_still_work(busy) -> None:
    sched, _ = busy
    out = sched.build_step([], [], (r for r in ["A"]))
    assert out.flush_job_ids == []
    assert sched.get_request_state("A").groups[0].block_ids == []  # type: ignore[union-attr]


# ------------------------------------------------------------------ compute while loading
def test_compute_in_the_same_step_as_its_own_unsent_load_job(manager: RecordingManager) -> None:
    sched = OffloadingScheduler(cfg(), manager)
    b = make_req("B", 12, 4, tag="b")
    put(manager, [key(h) for h in b.block_hashes[:2]])
    n, _ = sched.get_num_new_matched_tokens(b, 0)
    sched.update_state_after_alloc(b, [[5, 6, 7]], n)
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidArgumentError, match=r"new_requests\[0\].*'B'.*load job"):
        sched.build_step([new(b, 8, 4, [5, 6, 7])])
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    (load,) = sched.build_step().load_jobs  # the load job is still handed out, once
    sched.complete_jobs([(load.job_id, True)])
    out = sched.build_step([new(b, 8, 4, [5, 6, 7])])  # now it may compute
    assert out.load_jobs == [] and [j.keys for j in out.store_jobs] == [[key(b.block_hashes[2])]]


def test_compute_while_its_load_job_is_in_flight(busy) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidArgumentError, match=r"new_requests\[0\].*load job"):
        sched.build_step([new(sched.b, 8, 4, [5, 6, 7])])
    with pytest.raises(InvalidArgumentError, match=r"running_requests\[1\].*load job"):
        sched.build_step([], [run_(sched.a, 8, 4, []), run_(sched.b, 8, 4, [])])
    assert sched_state(sched) == before and manager_state(manager) == mbefore


# ------------------------------------------------------------------ request_finished
def test_request_finished_with_a_malformed_request(busy) -> None:
    """Not a request nor an id: a typed error (an unknown or finished request is a no-op:
    tests/engine/scheduler/test_untracked_finish.py)."""
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match="request"):
        sched.request_finished(5)
    with pytest.raises(InvalidTypeError, match="request"):
        sched.request_finished(None)
    assert sched_state(sched) == before and manager_state(manager) == mbefore


# ------------------------------------------------------------------ malformed requests
@dataclass
class NoHashes:
    request_id: str
    num_tokens: int
    num_prompt_tokens: int = 0


@dataclass
class NoTokens:
    request_id: str
    block_hashes: list[bytes]


@dataclass
class NoId:
    block_hashes: list[bytes]
    num_tokens: int


@dataclass
class Req:
    request_id: Any
    block_hashes: Any
    num_tokens: Any
    num_prompt_tokens: int = 0
    kv_transfer_params: Any = None


BAD_REQUESTS = [
    (lambda: NoHashes("x", 8), "block_hashes"),
    (lambda: NoTokens("x", hashes(2)), "num_tokens"),
    (lambda: NoId(hashes(2), 8), "request_id"),
    (lambda: Req("x", "h0h1", 8), "block_hashes"),  # a str: was a TypeError from str + bytes
    (lambda: Req("x", b"h0h1h2h3", 8), "block_hashes"),
    (lambda: Req("x", np.array(hashes(2)), 8), "block_hashes"),  # numpy strips trailing NULs
    (lambda: Req("x", [np.bytes_(h) for h in hashes(2)], 8), r"block_hashes\[0\]"),
    (lambda: Req("x", hashes(1) + ["h1"], 8), r"block_hashes\[1\]"),
    (lambda: Req("x", None, 8), "block_hashes"),
    (lambda: Req("x", hashes(2), 8.0), "num_tokens"),
    (lambda: Req(7, hashes(2), 8), "request_id"),
]


@pytest.mark.parametrize("make,match", BAD_REQUESTS)
def test_malformed_request_in_get_num_new_matched_tokens(busy, make, match: str) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match=match):
        sched.get_num_new_matched_tokens(make(), 0)
    assert sched_state(sched) == before and manager_state(manager) == mbefore


@pytest.mark.parametrize("make,match", BAD_REQUESTS)
def test_malformed_request_in_update_state_after_alloc(busy, make, match: str) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match=match):
        sched.update_state_after_alloc(make(), [[8, 9]], 0)
    assert sched_state(sched) == before and manager_state(manager) == mbefore


@pytest.mark.parametrize("make,match", BAD_REQUESTS)
def test_malformed_request_in_build_step(busy, make, match: str) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match=rf"new_requests\[1\].*{match}"):
        sched.build_step([new(make_req("C", 8, 4, tag="c"), 0, 8, [8, 9]), new(make(), 0, 8, [10, 11])])
    assert sched_state(sched) == before and manager_state(manager) == mbefore


def test_malformed_request_in_request_finished(busy) -> None:
    sched, _ = busy
    with pytest.raises(InvalidTypeError, match="request_id"):
        sched.request_finished(NoId(hashes(2), 8))


def test_running_request_whose_hashes_go_bad_in_decode(busy) -> None:
    """block_hashes grow while a request runs: a bad hash appended later is caught before the
    store that would read it, and nothing changes."""
    sched, manager = busy
    a = sched.a
    a.block_hashes[2] = np.bytes_(a.block_hashes[2])  # the engine appended a numpy hash
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match=r"running_requests\[0\].*block_hashes\[2\]"):
        sched.build_step([], [run_(a, 8, 4, [])])
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    a.block_hashes[2] = bytes(a.block_hashes[2])
    (job,) = sched.build_step([], [run_(a, 8, 4, [])]).store_jobs
    assert job.keys == [key(a.block_hashes[2])]


def test_running_request_that_lost_an_attribute(busy) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    with pytest.raises(InvalidTypeError, match=r"running_requests\[0\].*num_tokens"):
        sched.build_step([], [run_(NoTokens("A", sched.a.block_hashes), 8, 4, [])])
    assert sched_state(sched) == before and manager_state(manager) == mbefore


# ------------------------------------------------------------------ block ids beyond int64
@pytest.mark.parametrize("big", [2**63, 2**70, np.uint64(2**63)])
def test_block_id_beyond_int64_is_rejected_before_any_state_change(busy, big: object) -> None:
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    c = make_req("C", 8, 4, tag="c")
    with pytest.raises(InvalidArgumentError, match=r"new_requests\[0\]\.block_ids\[0\]"):
        sched.build_step([new(c, 0, 8, [8, big])])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match=r"block_ids_per_group\[0\]"):
        sched.update_state_after_alloc(c, [[8, big]], 0)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match=r"running_requests\[0\]\.block_ids\[0\]"):
        sched.build_step([], [run_(sched.a, 8, 8, [big])])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="block_ids"):
        sched.build_step([new(c, 0, 8, np.array([8, 2**63], dtype=np.uint64))])  # type: ignore[arg-type]
    assert sched_state(sched) == before and manager_state(manager) == mbefore


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "args,match",
    [
        ((16,), "gpu_block_sizes"),
        (("16",), "gpu_block_sizes"),
        (([16], "2"), "block_size_factor"),
        (([16], None), "block_size_factor"),
        (([16], 1, 4), "sliding_windows"),
        (([16], 1, "4"), "sliding_windows"),
    ],
)
def test_from_block_sizes_non_sequences(args: tuple, match: str) -> None:
    with pytest.raises(InvalidTypeError, match=match):
        OffloadingSchedulerConfig.from_block_sizes(*args)


def test_manager_with_the_numpy_keys_the_scheduler_never_builds() -> None:
    # the scheduler builds keys as bytes from validated hashes: a whole run stays consistent
    m = CPUOffloadingManager(16)
    sched = OffloadingScheduler(cfg(), m)
    r = make_req("r", 8, 4)
    sched.update_state_after_alloc(r, [[1, 2]], 0)
    (job,) = sched.build_step([new(r, 0, 8, [1, 2])]).store_jobs
    assert all(type(k) is bytes for k in job.keys)
    sched.complete_jobs([(job.job_id, True)])
    assert m.get_stats().num_pending == 0 and len(m) == 2
