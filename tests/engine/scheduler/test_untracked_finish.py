"""``request_finished`` for a request the scheduler does not track is a no-op (issue 15, item 1).

vLLM's scheduler calls the connector's ``request_finished`` for every request it frees: also one
aborted while still waiting (never scheduled, maybe never looked up), and its offloading
connector treats an untracked request as "offloading never started" (``(False, None)``, nothing
changes). A second finish of the same request is just as harmless. The scheduler does the same:
nothing changes and nothing is logged above debug.
"""

from __future__ import annotations

import logging

import pytest

from kvoffload.core.base import ReqContext
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from tests.engine.scheduler.conftest import make_req, manager_state, sched_state


def test_finishing_a_request_never_seen_changes_nothing(busy, caplog: pytest.LogCaptureFixture) -> None:
    """Aborted while waiting, before the engine ever looked it up: as an object and as an id."""
    sched, manager = busy
    before, mbefore = sched_state(sched), manager_state(manager)
    caplog.set_level(logging.DEBUG)
    sched.request_finished(make_req("W", 8, 4, tag="w"))
    sched.request_finished("W")
    sched.request_finished(make_req("W", 8, 4, tag="w"), [[1, 2]])  # block ids as some engines pass them
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    assert [r.levelno for r in caplog.records if r.name.startswith("kvoffload")] == [logging.DEBUG] * 3


def test_finishing_twice_changes_nothing(busy, caplog: pytest.LogCaptureFixture) -> None:
    """A running request with a store in flight, finished twice: the second call is a no-op and
    the store still completes normally afterwards."""
    sched, manager = busy
    sched.request_finished(sched.a)
    before, mbefore = sched_state(sched), manager_state(manager)
    caplog.set_level(logging.DEBUG)
    sched.request_finished(sched.a)
    sched.request_finished("A")
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
    (done,) = sched.complete_jobs([(sched.store.job_id, True)])
    assert done.req_id == "A" and done.success and done.is_store
    assert manager.inner.lookup(sched.store.keys[0], ReqContext("x")) is True


def test_aborted_while_waiting_after_a_lookup(busy) -> None:
    """A request looked up (the scheduler tracks it) and aborted before it was scheduled: the
    finish forgets it, a second finish is a no-op, and the same id can come back."""
    sched, manager = busy
    c = make_req("C", 8, 4, tag="c")
    assert sched.get_num_new_matched_tokens(c, 0) == (0, False)
    assert sched.get_request_state("C") is not None
    sched.request_finished(c)
    assert sched.get_request_state("C") is None
    before, mbefore = sched_state(sched), manager_state(manager)
    sched.request_finished(c)
    assert sched_state(sched) == before and manager_state(manager) == mbefore
    sched.update_state_after_alloc(c, [[8, 9]], 0)  # re-submitted under the same id
    out = sched.build_step([ScheduledRequest(c, 0, 8, [[8, 9]])])
    assert [j.req_id for j in out.store_jobs] == ["C"]
