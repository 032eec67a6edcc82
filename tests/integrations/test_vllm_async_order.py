"""The connector's calls in the order vLLM's engine makes them, with ``async_scheduling`` off and on.

vLLM turns async scheduling on by default on GPUs; its CPU platform turns it off, so no vLLM
``LLM`` on a CPU build runs with it, and letting it through would not help: the GPU model runner's
async output (``AsyncGPUModelRunnerOutput``, which vLLM's CPU model runner inherits) creates a CUDA
event and copy stream at every step, which a CPU-only torch refuses (the CPU runner stands in
placeholders for them only while it starts). The harness therefore runs
vLLM's own ``AsyncScheduler`` and overlaps steps as vLLM's engine core does with its batch queue
(``EngineCore.step_with_batch_queue``): step N+1 is scheduled (``build_connector_meta``) and
executed (the worker's ``start_load_kv`` ... ``get_finished``) before step N's output reaches
``update_from_output`` (``request_finished``, then ``update_connector_output``). These tests check
that the harness really gives kvoffload's connector that order (else the async variants of the
other tests would run synchronously), that requests stopped or aborted with a step in flight
leave nothing behind in the connector, the manager or the worker, and that the tokens generated
with offloading are vLLM's without it.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from tests.integrations.engine_workload import Run, run_workload  # noqa: E402
from tests.integrations.test_vllm_e2e import extra  # noqa: E402
from tests.integrations.vllm_harness import Engine  # noqa: E402

WAVES = 3


def record_calls(e: Engine) -> list[tuple[str, Any]]:
    """Record the connector's calls of both roles, in order: ``("build", scheduled request ids)``,
    ``("update", None)``, ``("finished", request id)``, ``("get_finished", None)``."""
    calls: list[tuple[str, Any]] = []

    def wrap(obj: Any, name: str, tag: str, what: Any) -> None:
        fn = getattr(obj, name)

        def recorded(*a: Any, **kw: Any) -> Any:
            calls.append((tag, what(*a)))
            return fn(*a, **kw)

        setattr(obj, name, recorded)

    wrap(e.connector, "build_connector_meta", "build", lambda so: set(so.num_scheduled_tokens))
    wrap(e.connector, "update_connector_output", "update", lambda out: None)
    for name in ("request_finished", "request_finished_all_groups"):  # vLLM calls one (hybrid models: the second)
        wrap(e.connector, name, "finished", lambda req, *a: req.request_id)
    wrap(e.worker_connector, "get_finished", "get_finished", lambda *a: None)
    return calls


def lags(calls: list[tuple[str, Any]], ahead: str) -> Counter[int]:
    """For each ``update_connector_output`` (of step k, the k-th): how many ``ahead`` calls (steps
    scheduled, or run by the worker) there were beyond k at that moment."""
    steps = updates = 0
    out: Counter[int] = Counter()
    for tag, _ in calls:
        steps += tag == ahead
        if tag == "update":
            updates += 1
            out[steps - updates] += 1
    return out


def test_the_connector_gets_its_calls_in_the_engines_order(async_scheduling: bool) -> None:
    e = Engine(extra(chunks=12), num_gpu_blocks=16, async_scheduling=async_scheduling)
    calls = record_calls(e)
    run = run_workload(e, seed=1, waves=WAVES)
    assert run.preempted > 0 and run.aborted and run.stopped_early
    # steps scheduled and run by the worker ahead of the output being taken: one with async
    # scheduling (but for the last step of each wave, taken once nothing is left to schedule), none
    # without
    total = sum(lags(calls, "build").values())
    expected = Counter({1: total - WAVES, 0: WAVES}) if async_scheduling else Counter({0: total})
    assert lags(calls, "build") == lags(calls, "get_finished") == expected
    ahead = _ahead(calls, run)
    # a stopped request had its next step scheduled (async) when the stop reached the scheduler;
    # an aborted one had a step in flight
    stopped = {ahead[r] for r in run.stopped_early if r in ahead}
    aborted = {ahead[r] for r in run.aborted}
    assert (stopped, aborted) == (({1}, {1}) if async_scheduling else ({0}, {0}))
    assert_nothing_left(e)


def _ahead(calls: list[tuple[str, Any]], run: Run) -> dict[str, int]:
    """Per finished request: steps scheduled for it beyond the last step whose output the
    scheduler had taken when it finished (a stop is seen while taking its step's output)."""
    builds = updates = 0
    last_build: dict[str, int] = {}
    out: dict[str, int] = {}
    for tag, what in calls:
        if tag == "build":
            builds += 1
            for rid in what:
                last_build[rid] = builds
        elif tag == "update":
            updates += 1
        elif tag == "finished" and what in last_build:
            taken = updates if what in run.aborted else updates + 1  # the step being taken counts
            out[what] = last_build[what] - taken
    return out


def assert_nothing_left(e: Engine) -> None:
    """No request, job or pin left in the connector, the manager or the worker."""
    sched = e.connector.connector_scheduler
    assert not sched._req_status and not sched._jobs
    core = e.manager.core
    assert core.num_tracked_requests == 0 and core.table.num_pending == 0 and core.table.num_pinned == 0
    assert not e.worker._jobs and not e.manager.has_pending_work()


@pytest.fixture(scope="module")
def without_offloading() -> dict[str, list[int]]:
    """The workload's tokens from vLLM without a KV connector (no aborts: every request runs to its end)."""
    e = Engine({}, num_gpu_blocks=16, connector=None)
    run_workload(e, seed=1, waves=WAVES, aborts=False)
    return e.outputs


@pytest.mark.parametrize("connector", ["KVOffloadConnector", None])
def test_tokens_are_vllms_without_offloading(
    without_offloading: dict[str, list[int]], connector: str | None, async_scheduling: bool
) -> None:
    """With offloading (loads checked byte for byte at every step) or without, sync or async: the
    tokens of vLLM without offloading."""
    e = Engine(extra(chunks=12), num_gpu_blocks=16, connector=connector, async_scheduling=async_scheduling)
    run = run_workload(e, seed=1, waves=WAVES, aborts=False)
    assert run.preempted > 0 and run.stopped_early
    assert e.outputs == without_offloading
    assert all(0 < len(toks) <= 7 for toks in e.outputs.values())
    if connector is not None:
        assert e.worker.counts["loads"] > 0
        assert_nothing_left(e)
