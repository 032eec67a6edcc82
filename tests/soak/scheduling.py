"""The soak engine's scheduling, a part :class:`~tests.soak.engine.SoakEngine` holds.

:meth:`SoakScheduling.schedule` picks a step's work as an engine does, with random token counts:
requests whose load failed give their blocks back (to be admitted and recomputed again), one random
preemption now and then, running requests first (preempting from the back when blocks run out),
loaded requests, then waiting requests through ``get_num_new_matched_tokens`` /
``update_state_after_alloc`` (a load, a deferral, or compute).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from tests.soak.blocks import GPUBlocks
from tests.soak.kv import BLOCK
from tests.soak.model import Seq, SoakConfig


class SoakScheduling:
    """The soak engine's choice of requests and tokens per step (see the module docstring).

    Args:
        rng: the run's random generator (shared with the engine: one seed, one sequence of draws).
        cfg: the run's configuration (``token_budget``, ``max_running``, ``p_preempt``).
        sched: the offloading scheduler under test.
        blocks: the GPU block pools.
        seqs: every request of the run, by id.
        waiting / running / ready: the engine's request queues, updated in place.
        count: the engine's counter (``count(name, n=1)``).
    """

    def __init__(
        self,
        rng: random.Random,
        cfg: SoakConfig,
        sched: OffloadingScheduler,
        blocks: GPUBlocks,
        seqs: dict[str, Seq],
        waiting: deque[Seq],
        running: list[Seq],
        ready: list[Seq],
        count: Callable[..., None],
    ) -> None:
        self.rng = rng
        self.cfg = cfg
        self.sched = sched
        self.blocks = blocks
        self.seqs = seqs
        self.waiting = waiting
        self.running = running
        self.ready = ready
        self._count = count

    def schedule(self) -> tuple[list[ScheduledRequest], list[ScheduledRequest], list[str], list[tuple[Seq, int]]]:
        """This step's ``(new, running, preempted)`` for ``build_step``, and the ``(seq, tokens)``
        the step computes."""
        rng, cfg = self.rng, self.cfg
        new: list[ScheduledRequest] = []
        running: list[ScheduledRequest] = []
        preempted: list[str] = []
        scheduled: list[tuple[Seq, int]] = []
        budget = cfg.token_budget
        for seq in [s for s in self.seqs.values() if s.status == "failed_load"]:
            self._count("recompute_after_failed_load")
            self._preempt(seq, preempted)  # gives its blocks back, to be admitted (and recomputed) again
        if self.running and rng.random() < cfg.p_preempt:
            self._preempt(rng.choice(self.running), preempted)
        for seq in list(self.running):
            if seq not in self.running or budget <= 0:
                continue
            left = seq.req.num_tokens - seq.num_computed
            n = min(left, rng.randint(1, 24), budget)
            nb = -(-(seq.num_computed + n) // BLOCK)
            need = [nb - len(t) for t in seq.tables]
            while not self.blocks.fits(need) and self.running[-1] is not seq:
                self._preempt(self.running[-1], preempted)
            if not self.blocks.fits(need):
                self._preempt(seq, preempted)
                continue
            appended = [self.blocks.alloc(g, nb - len(t)) for g, t in enumerate(seq.tables)]
            for t, a in zip(seq.tables, appended, strict=True):
                t.extend(a)
            running.append(ScheduledRequest(seq.req, seq.num_computed, n, appended))
            scheduled.append((seq, n))
            budget -= n
        for seq in list(self.ready):
            if budget <= 0 or len(self.running) >= cfg.max_running:
                break
            n = min(seq.req.num_tokens - seq.num_computed, rng.randint(1, 24), budget)
            nb = -(-(seq.num_computed + n) // BLOCK)
            if not self.blocks.fits([nb - len(t) for t in seq.tables]):
                break
            for g, t in enumerate(seq.tables):
                t.extend(self.blocks.alloc(g, nb - len(t)))
            new.append(ScheduledRequest(seq.req, seq.num_computed, n, [list(t) for t in seq.tables]))
            scheduled.append((seq, n))
            self.ready.remove(seq)
            self.running.append(seq)
            seq.status = "running"
            budget -= n
        for _ in range(len(self.waiting)):
            if budget <= 0 or len(self.running) >= cfg.max_running or not self.waiting:
                break
            seq = self.waiting.popleft()
            if seq.req.request_id in preempted:
                self.waiting.append(seq)
                continue
            got, _ = self.sched.get_num_new_matched_tokens(seq.req, 0)
            if got is None:
                self._count("lookup_deferred")
                self.waiting.append(seq)
                continue
            if got > 0:
                tables = self.blocks.tables_for(got, got)
                if tables is None:
                    self.waiting.appendleft(seq)
                    break
                self.sched.update_state_after_alloc(seq.req, tables, got)
                seq.tables, seq.status, seq.load_end = tables, "loading", got
                self._count("loads_admitted")
                continue
            n = min(seq.req.num_tokens, rng.randint(1, 24), budget)
            tables = self.blocks.tables_for(n, 0)
            if tables is None:
                self.waiting.appendleft(seq)
                break
            self.sched.update_state_after_alloc(seq.req, tables, 0)
            seq.tables, seq.status = tables, "running"
            self.running.append(seq)
            new.append(ScheduledRequest(seq.req, 0, n, [list(t) for t in tables]))
            scheduled.append((seq, n))
            budget -= n
        return new, running, preempted, scheduled

    def _preempt(self, seq: Seq, preempted: list[str]) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.ready:
            self.ready.remove(seq)
        if seq.status != "failed_load":
            self._count(f"preempt_{seq.status}")
        self.blocks.release(seq)
        seq.status, seq.num_computed, seq.load_job = "waiting", 0, None
        self.waiting.appendleft(seq)
        preempted.append(seq.req.request_id)
