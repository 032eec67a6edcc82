"""Transfer handling of the reference engine: submit jobs, complete them, verify loaded blocks.

A mixin of :class:`~kvoffload.sim.engine.Engine` (it uses the engine's ``worker``,
``scheduler``, ``kv``, ``groups``, ``stats``, ``config`` and request bookkeeping).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kvoffload.scheduler.jobs import FinishedJob, TransferJob
from kvoffload.sim.blocks import NULL_BLOCK
from kvoffload.sim.seq import FINISHED, READY, Seq
from kvoffload.sim.stats import StepStats, TransferRecord

logger = logging.getLogger("kvoffload.sim.engine")

__all__ = ["TransferHandling"]


class TransferHandling:
    """Job submission, completion and load verification (mixed into the engine)."""

    config: Any
    worker: Any
    scheduler: Any
    kv: Any
    gpu: Any
    groups: Any
    stats: Any
    loading: dict[str, Seq]
    ready: list[Seq]
    transfer_log: list[TransferRecord]
    _jobs: dict[int, TransferJob]
    _load_seq: dict[int, Seq]
    _step: int
    tiered: Any

    def _submit(self, job: TransferJob, st: StepStats) -> None:
        self._jobs[job.job_id] = job
        if job.is_store:
            st.store_jobs.append(job.job_id)
            self.stats.store_jobs += 1
        else:
            st.load_jobs.append(job.job_id)
            self.stats.load_jobs += 1
            self._load_seq[job.job_id] = self.loading[job.req_id]
        if self.config.record_transfers:
            self.transfer_log.append(TransferRecord.from_job(self._step, job))
        if not self.worker.transfer_async(job.job_id, job.spec):
            logger.warning("worker refused job %d", job.job_id)
            self._handle_results([(job.job_id, False)], st)

    def _handle_results(self, results: Iterable[Any], st: StepStats) -> None:
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

    def _verify_gpu_hit(self, seq: Seq, hit: int) -> None:
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
