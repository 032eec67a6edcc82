"""The scheduler over a TieredManager with a real Redis tier: a deferred request's repeat lookups
are answered without looking up again until a key it waits on resolves (a probe answered, a
promotion finished, a store completed), and then it gets what a fresh scheduler gets."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.engine.tiered import TieredManager
from kvoffload.tiers import RedisTier
from tests.engine.scheduler.conftest import key, make_req
from tests.tiers.conftest import ASYNC, NS, make_records

RB = 4096 + 24
CFG = OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),))


class CountingTieredManager(TieredManager):
    """A TieredManager that counts its ``lookup_batch`` calls."""

    lookups = 0

    def lookup_batch(self, keys: Sequence[Any], req_context: ReqContext) -> np.ndarray:
        self.lookups += 1
        return super().lookup_batch(keys, req_context)


def _write(url: str, keys: list[bytes], tag: bytes) -> None:
    """Another engine wrote ``keys`` to the tier (GPU store, write-through)."""
    rec = np.zeros((8, RB), np.uint8)
    a = TieredManager(CPUOffloadingManager(8), [RedisTier(rec, NS, url, name="writer")])
    out = a.prepare_store(keys, ReqContext("w"))
    assert out is not None
    rec[out.store_spec.block_ids] = make_records(len(keys), RB, seed=len(tag))
    a.complete_store(keys, ReqContext("w"))
    assert a.drain(30) and a.usage()[0].blocks_written == len(keys)
    a.close()


def _manager(url: str, name: str) -> CountingTieredManager:
    tier = RedisTier(np.zeros((16, RB), np.uint8), NS, url, name=name)
    return CountingTieredManager(CPUOffloadingManager(16), [tier], **ASYNC)


def test_repeat_lookups_of_a_deferred_request_wait_for_its_keys(redis_url: str) -> None:
    req = make_req("R", 16, 4, tag="rp")
    keys = [key(h) for h in req.block_hashes]
    _write(redis_url, keys[:3], b"rp")  # the tier holds 3 of the request's 4 blocks
    m = _manager(redis_url, "b")
    sched = OffloadingScheduler(CFG, m)
    tier = m.tiers[0]

    assert sched.get_num_new_matched_tokens(req, 0) == (None, False)  # probe queued
    assert m.lookups == 1
    assert sched.get_num_new_matched_tokens(req, 0) == (None, False)  # nothing resolved: no lookup
    assert m.lookups == 1 and tier.stats().lookup_round_trips == 0
    sched.build_step()  # sends the probe
    assert tier.drain(10)
    assert sched.get_num_new_matched_tokens(req, 0) == (None, False)  # answered: promotion reserved
    assert m.lookups == 2 and m.num_reserved() == 3
    assert sched.get_num_new_matched_tokens(req, 0) == (None, False)
    assert m.lookups == 2
    sched.build_step()  # sends the promotion
    assert tier.drain(10)
    assert sched.get_num_new_matched_tokens(req, 0) == (12, True)  # promoted: 3 blocks load
    assert m.lookups == 3

    # a scheduler that never deferred this request answers the same
    other = OffloadingScheduler(CFG, m)
    assert other.get_num_new_matched_tokens(make_req("R2", 16, 4, tag="rp"), 0) == (12, True)
    sched.update_state_after_alloc(req, [[1, 2, 3, 4]], 12)
    (load,) = sched.build_step().load_jobs
    sched.complete_jobs([(load.job_id, True)])
    sched.request_finished(req)
    other.request_finished(make_req("R2", 16, 4, tag="rp"))
    assert m.drain(30)
    st = m.primary.get_stats()
    assert (st.num_pending, st.num_pinned, m.num_reserved(), m.num_write_pinned()) == (0, 0, 0, 0)
    m.close()


def test_a_request_deferred_on_a_store_in_flight_looks_up_when_it_completes(redis_url: str) -> None:
    m = _manager(redis_url, "c")
    sched = OffloadingScheduler(CFG, m)
    a = make_req("A", 16, 4, tag="st")
    sched.update_state_after_alloc(a, [[1, 2, 3, 4]], 0)
    (store,) = sched.build_step([ScheduledRequest(a, 0, 8, [[1, 2, 3, 4]])]).store_jobs  # 2 blocks pending
    b = make_req("B", 16, 4, tag="st")  # same prefix: 2 blocks pending, 2 asked of the tier
    assert sched.get_num_new_matched_tokens(b, 0) == (None, False)
    sched.build_step()
    assert m.tiers[0].drain(10)
    n = m.lookups
    assert sched.get_num_new_matched_tokens(b, 0) == (None, False)  # the probe answered: looked up
    assert m.lookups == n + 1
    n = m.lookups
    other = make_req("O", 16, 4, tag="ot")
    for _ in range(3):
        assert sched.get_num_new_matched_tokens(b, 0) == (None, False)
        sched.get_num_new_matched_tokens(other, 0)  # other keys probed and answered meanwhile
        sched.build_step()
        assert m.tiers[0].drain(10)
    n_other = 3  # "O" looks up every time: deferred (probe), then answered twice (nothing to load)
    assert m.lookups == n + n_other  # b waits on its pending store only: no lookup
    n = m.lookups
    # asked otherwise (fewer computed tokens known on the GPU is another question): looked up
    b.num_tokens = 12
    assert sched.get_num_new_matched_tokens(b, 0) == (None, False) and m.lookups == n + 1
    b.num_tokens = 16
    assert sched.get_num_new_matched_tokens(b, 0) == (None, False) and m.lookups == n + 2
    sched.complete_jobs([(store.job_id, True)])  # the store completes: b's keys resolve
    assert sched.get_num_new_matched_tokens(b, 0) == (8, True)
    assert m.lookups == n + 3
    sched.request_finished(a)
    sched.request_finished(b)
    sched.request_finished(other)
    assert m.drain(30)
    m.close()


def test_take_answered_reports_probed_keys_once(redis_url: str) -> None:
    tier = RedisTier(np.zeros((4, RB), np.uint8), NS, redis_url, name="ans")
    assert tier.take_answered() == []  # starts the record
    keys = [b"ans-%d" % i for i in range(5)]
    tier.lookup(keys)
    tier.end_step()
    assert tier.drain(10)
    assert tier.take_answered() == keys
    assert tier.take_answered() == []
    tier.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this OS")
def test_the_lookup_thread_never_preempts_the_engine_thread(redis_url: str) -> None:
    tier = RedisTier(np.zeros((4, RB), np.uint8), NS, redis_url, name="sched")
    tier.lookup([b"x"])
    tier.end_step()
    assert tier.drain(10)
    (t,) = [t for t in threading.enumerate() if t.name == "kvoffload-tier-sched-lookup"]
    assert t.native_id is not None
    assert os.sched_getscheduler(t.native_id) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the caller's own policy is untouched
    tier.close()
