"""KVOffloadManager against vLLM's own CPUOffloadingManager inside vLLM's engine loop, with vLLM's
``async_scheduling`` off and on.

vLLM's Scheduler (``AsyncScheduler`` with async scheduling, steps overlapped as vLLM's engine core
overlaps them) and connector drive both managers through :class:`~tests.integrations.
lockstep_manager.LockstepManager`: every call the connector makes, in the order it makes it, runs
on both, and every answer is compared at once (lookups, load and store slots, keys to store,
evictions, stats, pending work); kvoffload's slots drive the worker, and the harness checks the
KV of every computed position at every step. The workload (``engine_workload``) has shared
prefixes, evictions, preemptions, requests that stop or are aborted with a step in flight, and
reloads from the CPU tier. At the end every key ever offered is looked up on both.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import ReqContext  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager  # noqa: E402

from tests.integrations.engine_workload import run_workload  # noqa: E402
from tests.integrations.lockstep_manager import LockstepManager  # noqa: E402
from tests.integrations.test_vllm_e2e import extra  # noqa: E402
from tests.integrations.vllm_harness import Engine  # noqa: E402


def lockstep_engine(policy: str, threshold: int, chunks: int, async_scheduling: bool) -> tuple[Engine, LockstepManager]:
    """An engine whose connector drives kvoffload's manager and vLLM's (built alike) in lockstep."""
    e = Engine(
        extra(chunks=chunks, eviction_policy=policy, store_threshold=threshold),
        num_gpu_blocks=16,
        async_scheduling=async_scheduling,
    )
    sched = e.connector.connector_scheduler
    lock = LockstepManager(sched.manager, VLLMManager(chunks, cache_policy=policy, store_threshold=threshold))
    sched.manager = lock
    return e, lock


@pytest.mark.parametrize(("policy", "threshold", "chunks"), [("lru", 0, 12), ("arc", 0, 12), ("lru", 2, 6)])
def test_manager_decides_as_vllms_inside_the_engine(
    policy: str, threshold: int, chunks: int, async_scheduling: bool
) -> None:
    e, lock = lockstep_engine(policy, threshold, chunks, async_scheduling)
    run = run_workload(e, seed=1)
    # the run reached what the comparison is for
    assert run.preempted > 0 and run.aborted and run.stopped_early
    assert lock.evicted > 0 and lock.calls["prepare_load"] > 0 and lock.calls["complete_store"] > 0
    assert e.worker.counts["loads"] > 0 and e.worker.counts["failed_loads"] == e.worker.counts["failed_stores"] == 0
    # the end state: every key ever offered, as both managers answer for it
    probe: Any = ReqContext(req_id="probe")
    keys = lock.offered
    assert keys
    ours = [lock.ours.lookup(k, probe) for k in sorted(keys)]
    theirs = [lock.theirs.lookup(k, ReqContext(req_id="probe")) for k in sorted(keys)]
    assert ours == theirs
    assert not lock.ours.has_pending_work() and lock.ours.core.num_tracked_requests == 0
