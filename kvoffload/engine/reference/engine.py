"""The reference engine loop: a small paged-KV engine driving the offloading scheduler.

One :meth:`Engine.step`:

1. collect the workers' finished jobs and complete them in the scheduler; a finished load is
   verified block by block and its request becomes ready to run;
2. schedule: running requests first (chunked prefill or one decode token each, preempting from
   the back of the running list when GPU blocks run out), then loaded requests, then waiting
   requests (GPU prefix-cache hit, then ``get_num_new_matched_tokens``: a load, a deferral, or
   compute) within the token budget;
3. ``build_step``: wait for the flush jobs, submit the load jobs, "compute" (write the
   deterministic KV of every scheduled token), submit the store jobs;
4. sample one token per request that reached its end, finish requests (``request_finished``,
   blocks freed at once).

:meth:`Engine.abort_request` (between steps) aborts a request in any state, as vLLM's
``finish_requests`` does: the scheduler's ``request_finished`` is called also for a waiting
request it never saw, and again for a request that already finished (both are no-ops there).

The transfer worker moves the real bytes between the KV tensors and the host pool.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kvoffload.engine.reference.blocks import GPUBlockCache
from kvoffload.engine.reference.config import EngineConfig, max_request_tokens
from kvoffload.engine.reference.delayed import DelayedWorker
from kvoffload.engine.reference.kvcache import GroupKVSpec, SimKVCache
from kvoffload.engine.reference.request import SimRequest
from kvoffload.engine.reference.scheduling import EngineScheduling
from kvoffload.engine.reference.seq import FINISHED, LOADING, READY, WAITING, Seq
from kvoffload.engine.reference.stats import EngineStats, StepStats, TransferRecord
from kvoffload.engine.reference.transfers import TransferHandling
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.engine.tiered import TieredManager
from kvoffload.engine.tiered_options import TieredOptions
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

if TYPE_CHECKING:
    from kvoffload.tiers.registry import TierSpec

logger = logging.getLogger(__name__)

__all__ = ["Engine"]


class Engine:
    """A paged-KV engine with a CPU offloading tier (see the module docstring).

    Args:
        config: the engine configuration (default :class:`EngineConfig`).
        manager: the offloading manager (default ``CPUOffloadingManager(num_cpu_blocks,
            config.cache_policy, enable_events=True)``).
        worker: the transfer worker (default ``TransferWorker`` over this engine's KV tensors,
            ``num_cpu_blocks`` slots, backend ``worker_backend or config.worker_backend``).
        worker_backend: kernel backend name for the default worker.
        tiers: secondary tiers beneath the host pool, as specs (``redis://host:6379``,
            ``disk:/path?max_bytes=N``, any registered scheme; see :func:`kvoffload.tiers.open_tier`),
            first asked first.
            The manager is then wrapped in a :class:`~kvoffload.engine.tiered.TieredManager` over
            tiers built on the worker's host pool records (the worker needs a ``host_pool``).
        tier_options: keyword options for every tier (``integrity_key``, ``io_threads``...).
        tiered_options: the :class:`~kvoffload.engine.tiered.TieredManager`'s options
            (:class:`~kvoffload.engine.tiered_options.TieredOptions`; default: the manager's defaults).

    Attributes:
        stats: cumulative :class:`EngineStats`.
        transfer_log: :class:`TransferRecord` per submitted job (``record_transfers=True``).
        flush_log: ``(step, job_id)`` per flushed job (``record_transfers=True``).
        stored_keys: every key that became ready in the CPU tier (``track_stored_keys=True``,
            from the manager's events; else None).
        tiered: the :class:`~kvoffload.engine.tiered.TieredManager` when ``tiers`` were given, else None.
        scheduler / manager / worker / kv: the parts, for inspection.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        manager: Any = None,
        worker: Any = None,
        *,
        worker_backend: str | None = None,
        tiers: Sequence[TierSpec] = (),
        tier_options: dict[str, Any] | None = None,
        tiered_options: TieredOptions | None = None,
    ) -> None:
        cfg = config if config is not None else EngineConfig()
        if not isinstance(cfg, EngineConfig):
            raise InvalidTypeError(f"config must be an EngineConfig, got {type(cfg).__name__}")
        self.config = cfg
        self.device = (
            torch.device(cfg.device) if cfg.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.sched_config = cfg.scheduler_config()
        self.hash_block_size = self.sched_config.effective_hash_block_size
        self.groups = cfg.groups
        self.kv = SimKVCache(
            [
                GroupKVSpec(cfg.num_gpu_blocks, g.gpu_block_size, g.num_layers, cfg.num_heads, cfg.head_dim, g.layout)
                for g in cfg.groups
            ],
            cfg.dtype,
            self.device,
            cfg.seed,
        )
        if manager is None:
            from kvoffload.cache.manager import CPUOffloadingManager

            manager = CPUOffloadingManager(cfg.num_cpu_blocks, cfg.cache_policy, enable_events=True)
        nb = getattr(manager, "num_blocks", None)
        if isinstance(nb, int) and nb > cfg.num_cpu_blocks:
            raise InvalidArgumentError(
                f"the manager has {nb} CPU blocks but the host pool only num_cpu_blocks={cfg.num_cpu_blocks}"
            )
        tiered_options = TieredOptions.check(tiered_options, "tiered_options")
        if tiers:
            from kvoffload.engine.reference.tiers import check_tier_specs, tiered_manager  # imports redis-py

            check_tier_specs(tiers)
        if worker is None:
            from kvoffload.kernels.layout import KVCacheTable
            from kvoffload.transfer.worker import TransferWorker

            table = KVCacheTable.from_tensors(self.kv.tensors, self.kv.layouts)
            worker = TransferWorker(
                table,
                cfg.num_cpu_blocks,
                [g.block_size_factor for g in cfg.groups],
                backend=worker_backend or cfg.worker_backend,
            )
        self.tiered: TieredManager | None = None
        if tiers:
            self.tiered = manager = tiered_manager(manager, worker, tiers, cfg, tier_options, tiered_options)
        self.manager = manager
        self.worker = DelayedWorker(worker, cfg.transfer_latency_steps) if cfg.transfer_latency_steps else worker
        self.scheduler = OffloadingScheduler(self.sched_config, manager)
        self.gpu = GPUBlockCache(cfg.groups, cfg.num_gpu_blocks, self.hash_block_size, cfg.enable_gpu_prefix_cache)
        self.pools = self.gpu.pools
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.ready: list[Seq] = []
        self.loading: dict[str, Seq] = {}
        self.requests: dict[str, SimRequest] = {}
        self._seqs: dict[str, Seq] = {}
        self.stats = EngineStats()
        self.transfer_log: list[TransferRecord] = []
        self._transfers = TransferHandling(
            cfg, self.scheduler, self.kv, self.gpu, self.stats, self.loading, self.ready, self.transfer_log, self.tiered
        )
        self._scheduling = EngineScheduling(
            cfg,
            self.scheduler,
            self.gpu,
            self.stats,
            self._transfers,
            self.waiting,
            self.running,
            self.ready,
            self.loading,
        )
        self.flush_log: list[tuple[int, int]] = []
        self.stored_keys: set[bytes] | None = set() if cfg.track_stored_keys else None
        self._step = 0
        self._idle_steps = 0

    # ------------------------------------------------------------------ requests
    def add_request(self, request: SimRequest | Any) -> SimRequest:
        """Queue a request: a :class:`SimRequest`, or anything with ``request_id``,
        ``prompt_token_ids`` and ``max_tokens`` (e.g. a ``ChatTurn``). Returns the SimRequest."""
        req = request if isinstance(request, SimRequest) else SimRequest.from_chat_turn(request)
        if req.request_id in self.requests:
            raise InvalidArgumentError(f"request id {req.request_id!r} was already added")
        req.bind(self.hash_block_size)
        total = req.num_prompt_tokens + req.max_tokens
        for g, gc in enumerate(self.groups):
            if total > max_request_tokens(self.config.num_gpu_blocks, gc.gpu_block_size):
                need = -(-total // gc.gpu_block_size)
                raise InvalidArgumentError(
                    f"request {req.request_id} needs {need} GPU blocks of group {g}, the engine has "
                    f"{self.config.num_gpu_blocks - 1}"
                )
        seq = Seq(req, len(self.groups))
        self.requests[req.request_id] = req
        self._seqs[req.request_id] = seq
        self.waiting.append(seq)
        self.stats.requests_added += 1
        self.stats.prompt_tokens += req.num_prompt_tokens
        return req

    def abort_request(self, request_id: str) -> bool:
        """Abort a request between steps, whatever its state; its GPU blocks are freed at once.

        The scheduler is told in every case (``request_finished``), as an engine does: a waiting
        request it never looked up, and a request that finished already, are no-ops there. A
        loading request's job still completes (the scheduler flushes it before its blocks are
        written again); its blocks are not used. Work the current admission computed counts as
        ``discarded_tokens``.

        Returns:
            True if the request was aborted, False if it had finished already.

        Raises:
            InvalidArgumentError: ``request_id`` was never added.
        """
        seq = self._seqs.get(request_id)
        if seq is None:
            raise InvalidArgumentError(f"request_id {request_id!r} was never added to this engine")
        self.scheduler.request_finished(seq.req)
        if seq.status == FINISHED:
            return False
        if seq.status == WAITING:  # a preemption already counted what it had computed
            self.waiting.remove(seq)
        else:
            if seq.status == LOADING:
                del self.loading[request_id]
            elif seq.status == READY:
                self.ready.remove(seq)
            else:
                self.running.remove(seq)
            self.stats.discarded_tokens += seq.prefill + seq.decode
        self.gpu.free(seq.tables)
        seq.status = FINISHED
        self.stats.requests_aborted += 1
        return True

    def get_request(self, request_id: str) -> SimRequest:
        return self.requests[request_id]

    def status_of(self, request_id: str) -> str:
        """``"waiting" | "loading" | "ready" | "running" | "finished"``."""
        return self._seqs[request_id].status

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.ready or self.loading)

    # ------------------------------------------------------------------ step
    def step(self) -> StepStats:
        """Run one engine step (see the module docstring)."""
        t0 = time.perf_counter()
        self._step += 1
        st = StepStats(self._step)
        if isinstance(self.worker, DelayedWorker):
            self.worker.tick()
        self._transfers.handle_results(self.worker.get_finished(), st)
        new, running, preempted = self._scheduling.schedule(st)
        out = self.scheduler.build_step(new, running, preempted)
        if out.flush_job_ids:
            self.worker.wait(out.flush_job_ids)
            st.flushed_jobs = list(out.flush_job_ids)
            self.stats.flushed_jobs += len(out.flush_job_ids)
            if self.config.record_transfers:
                self.flush_log.extend((self._step, j) for j in out.flush_job_ids)
        for job in out.load_jobs:
            self._transfers.submit(self.worker, job, st, self._step)
        self._compute(new + running)
        for job in out.store_jobs:
            self._transfers.submit(self.worker, job, st, self._step)
        self._finish_step(new + running, st)
        for ev in self.scheduler.take_events():
            if ev.removed:
                self.stats.cpu_evictions += len(ev.keys)
            elif self.stored_keys is not None:
                self.stored_keys.update(ev.keys)
                self.stats.distinct_blocks_stored = len(self.stored_keys)
        self.stats.gpu_evictions = self.gpu.num_evicted
        st.num_running, st.num_waiting, st.num_loading = len(self.running), len(self.waiting), len(self.loading)
        st.seconds = time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.wall_seconds += st.seconds
        busy = st.num_scheduled_tokens or self.scheduler.num_in_flight_jobs or st.completed_jobs
        if not busy and self.tiered is not None and self.tiered.busy:
            # only tier work (promotions the waiting requests need, writes) is in flight: give the
            # tier's threads the CPU for a moment instead of spinning (not counted as step time)
            busy = True
            time.sleep(0.0005)
        self._idle_steps = 0 if busy else self._idle_steps + 1
        return st

    def run_until_done(self, max_steps: int | None = None) -> EngineStats:
        """Step until every request finished (and every transfer completed).

        Raises:
            RuntimeError: ``max_steps`` reached, or 1000 steps in a row did nothing.
        """
        n = 0
        while self.has_unfinished_requests() or self.scheduler.num_in_flight_jobs:
            if max_steps is not None and n >= max_steps:
                raise RuntimeError(f"requests still unfinished after {max_steps} steps")
            self.step()
            n += 1
            if self._idle_steps >= 1000:
                raise RuntimeError("engine stalled: 1000 steps without scheduling or transfers")
        return self.stats

    def shutdown(self) -> None:
        """Finish the tiers' jobs and close them (they use the host pool), then stop the worker and
        the manager."""
        if self.tiered is not None:
            self.tiered.close()
        self.worker.shutdown()
        shutdown = getattr(self.manager, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ------------------------------------------------------------------ compute
    def _compute(self, scheduled: list[ScheduledRequest]) -> None:
        """The step's "forward pass": write the KV of every scheduled token."""
        if scheduled:
            self.kv.write_tokens(
                [
                    (
                        self._seqs[sr.request.request_id].tables,
                        sr.request.token_keys,
                        sr.num_computed_tokens,
                        sr.num_scheduled_tokens,
                    )
                    for sr in scheduled
                ]
            )

    def _finish_step(self, scheduled: list[ScheduledRequest], st: StepStats) -> None:
        for sr in scheduled:
            seq = self._seqs[sr.request.request_id]
            req = seq.req
            c0 = seq.num_computed
            seq.num_computed = c0 + sr.num_scheduled_tokens
            self.stats.computed_tokens += sr.num_scheduled_tokens
            prefill = max(0, min(seq.num_computed, seq.admit_len) - c0)
            seq.prefill += prefill
            seq.decode += sr.num_scheduled_tokens - prefill
            for g, gc in enumerate(self.groups):
                bs = gc.gpu_block_size
                self.gpu.cache_blocks(req, seq.tables, g, c0 // bs, seq.num_computed // bs)
            if seq.num_computed < req.num_tokens:
                continue
            if len(req.output_token_ids) < req.max_tokens:
                req.append_output(req.next_token())
                self.stats.generated_tokens += 1
            if len(req.output_token_ids) >= req.max_tokens:
                self._finish(seq, st)

    def _finish(self, seq: Seq, st: StepStats) -> None:
        self.running.remove(seq)
        self.scheduler.request_finished(seq.req)
        self.gpu.free(seq.tables)
        seq.status = FINISHED
        st.finished.append(seq.req.request_id)
        s = self.stats
        s.requests_finished += 1
        s.prefill_gpu_hit_tokens += seq.hit
        s.prefill_loaded_tokens += seq.loaded
        s.prefill_computed_tokens += seq.prefill
        s.decode_tokens += seq.decode
        s.readmitted_output_tokens += seq.admit_len - seq.req.num_prompt_tokens
