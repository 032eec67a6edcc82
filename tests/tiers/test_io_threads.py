"""The tier's I/O threads take queued loads before queued stores, in order within each kind."""

from __future__ import annotations

import threading

from kvoffload.tiers.workers import LOAD, STORE, IOThreads


def test_queued_loads_go_before_queued_stores() -> None:
    pool = IOThreads(1, "test-io")
    release = threading.Event()
    ran: list[str] = []
    pool.submit(STORE, release.wait)  # the one thread is busy: everything below queues
    for name, prio in (("s1", STORE), ("l1", LOAD), ("s2", STORE), ("l2", LOAD)):
        pool.submit(prio, ran.append, name)
    release.set()
    pool.shutdown()  # runs what is queued, then stops
    assert ran == ["l1", "l2", "s1", "s2"]


def test_a_failing_task_does_not_stop_its_thread() -> None:
    pool = IOThreads(1, "test-io-fail")
    ran: list[int] = []
    pool.submit(LOAD, lambda: 1 / 0)
    pool.submit(LOAD, ran.append, 1)
    pool.shutdown()
    assert ran == [1]
