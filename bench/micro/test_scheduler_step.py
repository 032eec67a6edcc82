"""The scheduler's decode step: 256 running requests with 8k-token prompts (16-token GPU blocks),
a CPU tier filled to capacity (every store evicts), one token per request per step.

Timed per step: ``build_step`` + ``complete_jobs`` of the previous step's store jobs, with
kvoffload's manager (``ours``) and with the OrderedDict baseline manager behind the same scheduler
(``baseline``); ``bare`` is what the engine spends just to describe the step (building and reading
the 256 ``ScheduledRequest`` objects). Pool: 10^6 blocks, capped by ``KVOFFLOAD_MICRO_MAX_BLOCKS``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench.baseline_manager import OrderedDictLRUManager
from bench.bench_scheduler import BLOCK, PROMPT, BenchRequest, _fill
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler

CAPACITY = min(1_000_000, int(os.environ.get("KVOFFLOAD_MICRO_MAX_BLOCKS", "1000000")))
RUNNING = 256
GROUP = f"scheduler-decode-{RUNNING}req-{CAPACITY:.0e}".replace("+0", "")


class Decode:
    """256 admitted, prefilled requests; :meth:`next_step` describes the next decode step."""

    def __init__(self, manager: Any) -> None:
        self.sched = OffloadingScheduler(OffloadingSchedulerConfig.from_block_sizes([BLOCK], 1), manager)
        _fill(manager, CAPACITY)
        self.reqs = [BenchRequest(f"r{i}", PROMPT + (i * 7) % BLOCK) for i in range(RUNNING)]
        self.next_block = 1
        for r in self.reqs:
            n, _ = self.sched.get_num_new_matched_tokens(r, 0)
            assert n == 0
            nb = -(-r.num_tokens // BLOCK)
            table = list(range(self.next_block, self.next_block + nb))
            self.next_block += nb
            self.sched.update_state_after_alloc(r, [table], 0)
            out = self.sched.build_step([ScheduledRequest(r, 0, r.num_tokens, [table])])
            self.sched.complete_jobs([(j.job_id, True) for j in out.store_jobs])
            self._sample(r)
        self.computed = [r.num_tokens - 1 for r in self.reqs]
        self.pending: list[int] = []
        self.stores = 0

    @staticmethod
    def _sample(r: BenchRequest) -> None:
        r.num_tokens += 1
        if r.num_tokens % BLOCK == 0:
            r.block_hashes.append(os.urandom(16))

    def next_step(self) -> tuple[list[ScheduledRequest], list[tuple[int, bool]]]:
        running = []
        for i, r in enumerate(self.reqs):
            c = self.computed[i]
            appended: list[int] = []
            if c % BLOCK == 0:  # this token opens a new GPU block
                appended = [self.next_block]
                self.next_block += 1
            running.append(ScheduledRequest(r, c, 1, [appended]))
        return running, [(j, True) for j in self.pending]

    def step(self, running: list[ScheduledRequest], results: list[tuple[int, bool]]) -> None:
        out = self.sched.build_step((), running)
        self.sched.complete_jobs(results)
        self.pending = [j.job_id for j in out.store_jobs]
        self.stores += len(self.pending)

    def advance(self) -> None:
        """The engine samples one token per request (untimed)."""
        for i, r in enumerate(self.reqs):
            self.computed[i] += 1
            self._sample(r)


@pytest.mark.parametrize("impl", ["ours", "baseline"])
def test_decode_step(record: Any, impl: str) -> None:
    d = Decode(CPUOffloadingManager(CAPACITY) if impl == "ours" else OrderedDictLRUManager(CAPACITY))
    started = [False]

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        if started[0]:
            d.advance()
        started[0] = True
        return d.next_step(), {}

    record(GROUP, impl, d.step, setup=setup, rounds=64)
    assert d.stores > 0  # blocks filled and were stored (evicting) during the timed steps


def test_decode_step_bare(record: Any) -> None:
    reqs = [BenchRequest(f"b{i}", BLOCK) for i in range(RUNNING)]
    computed = [PROMPT] * RUNNING

    def bare() -> int:
        running = [ScheduledRequest(r, computed[i], 1, [[]]) for i, r in enumerate(reqs)]
        total = 0
        for sr in running:
            total += sr.num_computed_tokens + sr.num_scheduled_tokens
        return total

    record(GROUP, "bare", bare)
    assert bare() == RUNNING * (PROMPT + 1)
