"""vLLM 0.33's additions (``make test-vllm-033``): expedited loads and ``canonical_layout``.

* With ``sync_load_budget_bytes``, vLLM 0.33's scheduler loads a hit that fits the budget within
  the step (``submit_load(..., expedited=True)``, then ``wait``); kvoffload runs such a load on the
  transfer worker's second stream, ahead of the transfers queued before it (on CUDA; on this CPU
  harness every job runs at submission). Every computed position is checked, with vLLM's
  ``async_scheduling`` off and on.
* ``canonical_layout`` is refused at start with a typed error naming the key.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as vllm_scheduler  # noqa: E402

from kvoffload.errors import InvalidArgumentError  # noqa: E402
from tests.integrations.test_vllm_e2e import extra, prompt, run_twice  # noqa: E402
from tests.integrations.vllm_harness import Engine  # noqa: E402

HAS_SYNC_LOADS = "sync_load_budget_bytes" in vllm_scheduler.SchedulerOffloadConfig._fields
needs_033 = pytest.mark.skipif(not HAS_SYNC_LOADS, reason="vLLM < 0.33 has no expedited (sync) loads")


@needs_033
def test_expedited_loads_within_the_step(async_scheduling: bool) -> None:
    e = Engine(extra(sync_load_budget_bytes=1 << 20), async_scheduling=async_scheduling)
    try:
        run_twice(e, {"a": prompt(1, 29), "b": prompt(2, 41)})
        c = e.worker.counts
        assert c["expedited_loads"] == c["loads"] == 2  # both reloads fit the budget: expedited
        assert c["failed_loads"] == 0
    finally:
        e.close()


@needs_033
def test_loads_beyond_the_budget_are_not_expedited(async_scheduling: bool) -> None:
    e = Engine(extra(sync_load_budget_bytes=1), async_scheduling=async_scheduling)
    try:
        run_twice(e, {"a": prompt(3, 29)})
        assert e.worker.counts["loads"] == 1 and e.worker.counts["expedited_loads"] == 0
    finally:
        e.close()


def test_canonical_layout_is_refused_at_start() -> None:
    with pytest.raises(InvalidArgumentError, match=r"kv_connector_extra_config\['canonical_layout'\]"):
        Engine(extra(canonical_layout=True))
