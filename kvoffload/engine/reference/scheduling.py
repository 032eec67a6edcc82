"""Scheduling of the reference engine: which requests compute in a step, with how many tokens.

:class:`EngineScheduling` is a part that :class:`~kvoffload.engine.reference.engine.Engine` holds: it is handed
the engine's parts and request queues and moves requests between the queues. One
:meth:`EngineScheduling.schedule`: running requests first (chunked prefill or one decode token
each, preempting from the back of the running list when GPU blocks run out), then loaded requests,
then waiting requests (GPU prefix-cache hit, then ``get_num_new_matched_tokens``: a load, a
deferral, or compute) within the token budget.
"""

from __future__ import annotations

from collections import deque

from kvoffload.engine.reference.blocks import GPUBlockCache
from kvoffload.engine.reference.config import EngineConfig
from kvoffload.engine.reference.seq import LOADING, RUNNING, WAITING, Seq
from kvoffload.engine.reference.stats import EngineStats, StepStats
from kvoffload.engine.reference.transfers import TransferHandling
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler

__all__ = ["EngineScheduling"]


class EngineScheduling:
    """The reference engine's per-step choice of requests and tokens (see the module docstring).

    Args:
        config: the engine's configuration (``max_num_batched_tokens``, ``max_num_seqs``,
            ``verify_gpu_hits``).
        scheduler: the engine's offloading scheduler (lookups and allocations of waiting requests).
        gpu: the engine's GPU block cache (prefix hits, block tables grown and freed).
        stats: the engine's cumulative stats, updated in place.
        transfers: the engine's transfer handling (GPU prefix-cache hits are verified there).
        waiting / running / ready / loading: the engine's request queues (loading: request id ->
            Seq), updated in place.

    A preempted request gives its GPU blocks back and goes to the front of ``waiting``; what it
    had computed counts as ``discarded_tokens``.
    """

    def __init__(
        self,
        config: EngineConfig,
        scheduler: OffloadingScheduler,
        gpu: GPUBlockCache,
        stats: EngineStats,
        transfers: TransferHandling,
        waiting: deque[Seq],
        running: list[Seq],
        ready: list[Seq],
        loading: dict[str, Seq],
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.gpu = gpu
        self.stats = stats
        self.transfers = transfers
        self.waiting = waiting
        self.running = running
        self.ready = ready
        self.loading = loading

    def schedule(self, st: StepStats) -> tuple[list[ScheduledRequest], list[ScheduledRequest], list[str]]:
        """This step's ``(new, running, preempted)`` for ``build_step``; the admitted, deferred and
        preempted request ids and the number of scheduled tokens are recorded in ``st``."""
        budget = self.config.max_num_batched_tokens
        new: list[ScheduledRequest] = []
        running: list[ScheduledRequest] = []
        preempted: list[str] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.req.num_tokens - seq.num_computed, budget)
            before = [len(t) for t in seq.tables]
            ok = True
            while not self.gpu.grow(seq.tables, seq.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.req.request_id)
                if victim is seq:
                    ok = False
                    break
            if not ok:
                break
            running.append(
                ScheduledRequest(
                    seq.req, seq.num_computed, n, [t[b:] for t, b in zip(seq.tables, before, strict=False)]
                )
            )
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(budget, new, preempted, st)
        st.preempted = preempted
        st.num_scheduled_tokens = self.config.max_num_batched_tokens - budget
        return new, running, preempted

    def _admit(self, budget: int, new: list[ScheduledRequest], preempted: list[str], st: StepStats) -> int:
        # loaded requests first: they hold their blocks already. When one cannot grow, the loaded
        # requests behind it give their blocks back (else loaded requests could hold every block
        # while none of them can run).
        while self.ready and budget > 0:
            seq = self.ready[0]
            n = min(seq.req.num_tokens - seq.num_computed, budget)
            grown = self.gpu.grow(seq.tables, seq.num_computed + n)
            while not grown and len(self.ready) > 1:
                victim = self.ready.pop()
                self._preempt(victim)
                preempted.append(victim.req.request_id)
                grown = self.gpu.grow(seq.tables, seq.num_computed + n)
            if not grown:
                return budget
            self.ready.pop(0)
            seq.status = RUNNING
            self.running.append(seq)
            new.append(ScheduledRequest(seq.req, seq.num_computed, n, [list(t) for t in seq.tables]))
            budget -= n
        skipped: list[Seq] = []
        while self.waiting and budget > 0:
            if len(self.running) + len(self.loading) + len(self.ready) >= self.config.max_num_seqs:
                break
            seq = self.waiting.popleft()
            req = seq.req
            hit = self.gpu.hit(req)
            ext, _ = self.scheduler.get_num_new_matched_tokens(req, hit)
            if ext is None:
                st.deferred.append(req.request_id)
                self.stats.deferrals += 1
                skipped.append(seq)
                continue
            self.gpu.take_hit(req, hit, seq.tables)
            if hit and self.config.verify_gpu_hits:
                self.transfers.verify_gpu_hit(seq, hit)
            n = ext if ext else min(req.num_tokens - hit, budget)
            if not self.gpu.grow(seq.tables, hit + n):
                self.gpu.free(seq.tables)
                self.waiting.appendleft(seq)
                break
            self.scheduler.update_state_after_alloc(req, seq.tables, ext)
            seq.admit(req.num_tokens, hit, ext)
            seq.num_computed = hit
            self.stats.admitted_tokens += req.num_tokens
            self.stats.gpu_hit_tokens += hit
            st.admitted.append(req.request_id)
            if ext:
                seq.status = LOADING
                self.loading[req.request_id] = seq
                continue
            seq.status = RUNNING
            self.running.append(seq)
            new.append(ScheduledRequest(req, hit, n, [list(t) for t in seq.tables]))
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _preempt(self, seq: Seq) -> None:
        self.stats.discarded_tokens += seq.prefill + seq.decode
        self.gpu.free(seq.tables)
        seq.num_computed = 0
        seq.status = WAITING
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1
