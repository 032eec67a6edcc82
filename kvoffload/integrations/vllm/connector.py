"""``KVOffloadConnector``: vLLM's ``OffloadingConnector`` that also handles failed transfers.

vLLM's ``OffloadingConnector`` assumes every transfer succeeds (it asserts ``success``). This
subclass changes two things, both through vLLM's own channels, and nothing else:

* worker role: ``get_block_ids_with_load_errors`` returns the GPU block ids of loads that failed
  (collected by :class:`~kvoffload.integrations.vllm.worker.KVOffloadWorker`); with
  ``kv_load_failure_policy="recompute"`` vLLM's scheduler recomputes from the first bad block.
* failed stores and loads travel from the workers to the scheduler in the worker metadata
  (:class:`KVOffloadWorkerMetadata`, a subclass of vLLM's). The scheduler role completes failed
  stores with ``success=False`` before vLLM completes them as successful, so the chunks are
  freed and never become loadable (vLLM's later completion ignores the then absent keys); after
  vLLM completed a failed load (unpinning its chunks) it drops those chunks from the manager, so
  the recomputed blocks are stored afresh instead of the bad copy being loaded again.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from kvoffload.integrations.vllm.worker import KVOffloadWorker

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadConnector", "KVOffloadWorkerMetadata"]


@dataclass
class KVOffloadWorkerMetadata(OffloadingWorkerMetadata):
    """vLLM's worker metadata plus the ids of store and load jobs that failed on some worker."""

    failed_store_jobs: set[int] = field(default_factory=set)
    failed_load_jobs: set[int] = field(default_factory=set)

    def aggregate(self, other: Any) -> KVOffloadWorkerMetadata:
        base = super().aggregate(other)
        return KVOffloadWorkerMetadata(
            completed_jobs=base.completed_jobs,  # type: ignore[attr-defined]
            transfer_stats=base.transfer_stats,  # type: ignore[attr-defined]
            failed_store_jobs=self.failed_store_jobs | set(getattr(other, "failed_store_jobs", ())),
            failed_load_jobs=self.failed_load_jobs | set(getattr(other, "failed_load_jobs", ())),
        )


class KVOffloadConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` plus failed-load and failed-store handling for kvoffload."""

    def _kvoffload_worker(self) -> KVOffloadWorker | None:
        w = getattr(getattr(self, "connector_worker", None), "worker", None)
        return w if isinstance(w, KVOffloadWorker) else None

    # ------------------------------------------------------------------ worker role
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        w = self._kvoffload_worker()
        if w is not None:
            w.report_load_errors = True

    def get_block_ids_with_load_errors(self) -> set[int]:
        w = self._kvoffload_worker()
        return set() if w is None else w.take_load_errors()

    def build_connector_worker_meta(self) -> Any:
        """vLLM's metadata of this worker as a :class:`KVOffloadWorkerMetadata` with the jobs that
        failed here; None when there is nothing to report. Never vLLM's own class: vLLM folds the
        workers' metadata into the first worker's (``first.aggregate(other)``), and vLLM's
        ``aggregate`` would drop the failed jobs of a later worker."""
        meta = super().build_connector_worker_meta()
        w = self._kvoffload_worker()
        if w is None:
            return meta
        stores, loads = w.take_failed_stores(), w.take_failed_loads()
        if meta is None and not (stores or loads):
            return None
        return KVOffloadWorkerMetadata(
            completed_jobs=dict(meta.completed_jobs) if meta is not None else {},
            transfer_stats=meta.transfer_stats if meta is not None else KVOffloadWorkerMetadata().transfer_stats,
            failed_store_jobs=stores,
            failed_load_jobs=loads,
        )

    # ------------------------------------------------------------------ scheduler role
    def update_connector_output(self, connector_output: Any) -> None:
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        sched = getattr(self, "connector_scheduler", None)
        failed_stores = getattr(meta, "failed_store_jobs", None)
        failed_loads = getattr(meta, "failed_load_jobs", None)
        if sched is None or not (failed_stores or failed_loads):
            super().update_connector_output(connector_output)
            return
        jobs, reqs = getattr(sched, "_jobs", {}), getattr(sched, "_req_status", {})
        lock = getattr(sched.manager, "lock", contextlib.nullcontext())  # vLLM 0.33: callers hold it
        bad_loads = [(j, list(jobs[j].keys)) for j in sorted(failed_loads or ()) if j in jobs and not jobs[j].is_store]
        with lock:
            for job_id in sorted(failed_stores or ()):
                job = jobs.get(job_id)
                if job is None or not job.is_store or job.req_id not in reqs:
                    continue
                logger.warning("offloading store job %d failed: its %d chunk(s) are dropped", job_id, len(job.keys))
                fail_store = getattr(sched.manager, "fail_store", None)  # KVOffloadTieringManager
                if fail_store is not None:
                    fail_store(list(job.keys), reqs[job.req_id].req_context)
                else:
                    sched.manager.complete_store(list(job.keys), reqs[job.req_id].req_context, success=False)
        super().update_connector_output(connector_output)  # completes (unpins) the failed loads too
        discard = getattr(getattr(sched.manager, "core", None), "discard", None)
        if bad_loads and discard is not None:
            with lock:
                for job_id, keys in bad_loads:
                    dropped = discard(keys, None)
                    logger.warning("offloading load job %d failed: %d chunk(s) dropped", job_id, len(dropped))
