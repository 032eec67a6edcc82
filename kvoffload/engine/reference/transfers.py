"""Transfer handling of the reference engine: submit jobs, complete them, verify loaded blocks.

:class:`TransferHandling` is a part that :class:`~kvoffload.engine.reference.engine.Engine` holds: it owns
the in-flight job book and is handed the engine's parts and request bookkeeping it updates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kvoffload.engine.reference.blocks import NULL_BLOCK, GPUBlockCache
from kvoffload.engine.reference.config import EngineConfig
from kvoffload.engine.reference.kvcache import SimKVCache
from kvoffload.engine.reference.seq import FINISHED, READY, Seq
from kvoffload.engine.reference.stats import EngineStats, StepStats, TransferRecord
from kvoffload.engine.scheduler.jobs import FinishedJob, TransferJob
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler

logger = logging.getLogger("kvoffload.engine.reference.engine")

__all__ = ["TransferHandling"]


class TransferHandling:
    """Job submission, completion and load verification for the reference engine.

    Args:
        config: the engine's configuration (``groups``, ``record_transfers``, ``verify_loads``).
        scheduler: the engine's scheduler (``complete_jobs``).
        kv: the engine's KV tensors (loaded blocks are checked on them).
        gpu: the engine's GPU block cache (loaded blocks are cached in it).
        stats: the engine's cumulative stats, updated in place.
        loading: the engine's loading requests, request id -> Seq; a finished load removes its own.
        ready: the engine's loaded requests; a finished load appends its Seq.
        transfer_log: a :class:`TransferRecord` is appended per submitted job (``record_transfers``).
        tiered: the engine's tiered manager (loads of blocks it promoted from a tier are counted in
            ``stats.tier_blocks_loaded``), or None without tiers.

    It owns the jobs in flight (job id -> job) and, per load job, the Seq it loads into.
    """

    def __init__(
        self,
        config: EngineConfig,
        scheduler: OffloadingScheduler,
        kv: SimKVCache,
        gpu: GPUBlockCache,
        stats: EngineStats,
        loading: dict[str, Seq],
        ready: list[Seq],
        transfer_log: list[TransferRecord],
        tiered: Any = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.kv = kv
        self.gpu = gpu
        self.groups = config.groups
        self.stats = stats
        self.loading = loading
        self.ready = ready
        self.transfer_log = transfer_log
        self.tiered = tiered
        self._jobs: dict[int, TransferJob] = {}
        self._load_seq: dict[int, Seq] = {}

    def submit(self, worker: Any, job: TransferJob, st: StepStats, step: int) -> None:
        """Hand ``job`` to ``worker`` (recorded in ``st`` as step ``step``); a refused job fails at once."""
        self._jobs[job.job_id] = job
        if job.is_store:
            st.store_jobs.append(job.job_id)
            self.stats.store_jobs += 1
        else:
            st.load_jobs.append(job.job_id)
            self.stats.load_jobs += 1
            self._load_seq[job.job_id] = self.loading[job.req_id]
        if self.config.record_transfers:
            self.transfer_log.append(TransferRecord.from_job(step, job))
        if not worker.transfer_async(job.job_id, job.spec):
            logger.warning("worker refused job %d", job.job_id)
            self.handle_results([(job.job_id, False)], st)

    def handle_results(self, results: Iterable[Any], st: StepStats) -> None:
        """Count the workers' results, complete the finished jobs in the scheduler; a finished
        load is verified (``verify_loads``) and cached, and its request becomes ready."""
        results = list(results)
        if not results:
            return
        for r in results:
            size = getattr(r, "transfer_size", 0)
            secs = getattr(r, "transfer_time", 0.0)
            job = self._jobs.get(r[0] if isinstance(r, tuple) else r.job_id)
            if job is None:
                continue
            if job.is_store:
                self.stats.bytes_stored += size
                self.stats.store_seconds += secs
            else:
                self.stats.bytes_loaded += size
                self.stats.load_seconds += secs
        for fj in self.scheduler.complete_jobs(results):
            st.completed_jobs.append(fj.job_id)
            job = self._jobs.pop(fj.job_id)
            if fj.is_store:
                if fj.success:
                    self.stats.blocks_stored += len(fj.keys)
                else:
                    self.stats.failed_stores += 1
            else:
                self._on_load_done(self._load_seq.pop(fj.job_id), job, fj)

    def _on_load_done(self, seq: Seq, job: TransferJob, fj: FinishedJob) -> None:
        if seq.status == FINISHED:  # aborted while loading: its blocks went back to the pool
            return
        req = seq.req
        del self.loading[req.request_id]
        if fj.success:
            for g, offs in enumerate(job.block_offsets):
                if offs.size == 0:
                    continue
                lo, hi = int(offs[0]), int(offs[-1]) + 1
                if self.config.verify_loads:
                    self._verify(seq, g, lo, hi)
                self.gpu.cache_blocks(req, seq.tables, g, lo, hi)
            self.stats.blocks_loaded += len(fj.keys)
            if self.tiered is not None:
                promoted = self.tiered.promoted
                self.stats.tier_blocks_loaded += sum(k in promoted for k in fj.keys)
            self.stats.loaded_tokens += seq.ext
            seq.num_computed = min(seq.hit + seq.ext, req.num_tokens - 1)
            seq.loaded = seq.num_computed - seq.hit
        else:
            self.stats.failed_loads += 1
            seq.num_computed = seq.hit
        seq.status = READY
        self.ready.append(seq)

    def verify_gpu_hit(self, seq: Seq, hit: int) -> None:
        """Check the GPU prefix-cache blocks ``seq`` was given cover its first ``hit`` tokens' KV."""
        for g, gc in enumerate(self.groups):
            table = seq.tables[g]
            lo = next((i for i, b in enumerate(table) if b != NULL_BLOCK), len(table))
            self._verify(seq, g, lo, hit // gc.gpu_block_size, gpu_hit=True)

    def _verify(self, seq: Seq, g: int, lo: int, hi: int, gpu_hit: bool = False) -> None:
        """Check GPU blocks ``[lo, hi)`` of ``seq`` (group g) hold exactly the KV computed for them."""
        bs = self.groups[g].gpu_block_size
        ok = self.kv.check_blocks(g, seq.tables[g][lo:hi], seq.req.token_keys[lo * bs : hi * bs])
        if gpu_hit:
            self.stats.verified_gpu_hit_blocks += int(ok.size)
        else:
            self.stats.verified_blocks += int(ok.size)
        bad = int(ok.size - ok.sum())
        if bad:
            self.stats.verification_failures += bad
            logger.error(
                "request %s group %d: %d of %d %s blocks differ from the computed KV",
                seq.req.request_id,
                g,
                bad,
                ok.size,
                "GPU prefix-cache" if gpu_hit else "loaded",
            )
