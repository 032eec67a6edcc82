"""Job completion of :class:`~kvoffload.scheduler.scheduler.OffloadingScheduler` (docs/contract.md §6).

A job completes once every one of the ``num_workers`` transfer workers reported it; then the
manager hears of it with the request's ``ReqContext``: ``complete_store(keys, ctx, success)`` for
a store (a failed store removes its still-pending keys), ``complete_load`` for a load whatever its
outcome (``success=False`` tells the engine to recompute those tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from kvoffload.errors import InvalidArgumentError
from kvoffload.scheduler.config import OffloadingSchedulerConfig
from kvoffload.scheduler.deferral import DeferredLookups
from kvoffload.scheduler.flush import FlushTracker
from kvoffload.scheduler.jobs import FinishedJob, JobRecord, TransferJob
from kvoffload.scheduler.state import RequestOffloadState
from kvoffload.scheduler.validation import parse_results

logger = logging.getLogger(__name__)

__all__ = ["JobCompletion"]


class JobCompletion:
    """Counts worker reports and completes jobs; the scheduler's job book is set up by its subclass."""

    config: OffloadingSchedulerConfig
    manager: Any
    _states: dict[str, RequestOffloadState]
    _jobs: dict[int, JobRecord]
    _pending_loads: list[TransferJob]
    _loading_keys: dict[bytes, int]
    _flush: FlushTracker
    _deferred: DeferredLookups | None

    def complete_jobs(self, results: Iterable[Any]) -> list[FinishedJob]:
        """Count worker reports; complete the jobs every worker reported.

        Args:
            results: worker results -- objects with ``job_id`` and ``success`` (a
                ``TransferResult``) or ``(job_id, success)`` pairs; one per worker per job.

        Returns:
            The jobs completed by these reports, in report order. A store completes with
            ``complete_store(keys, ctx, success)``; a failed store (any worker failed) removes its
            still-pending keys. A load completes with ``complete_load`` whatever its outcome;
            ``success=False`` tells the engine the loaded tokens must be recomputed.
        """
        pairs = parse_results(results)
        counts: dict[int, int] = {}
        for jid, _ in pairs:
            counts[jid] = counts.get(jid, 0) + 1
        unsent = {j.job_id for j in self._pending_loads}
        for jid, c in counts.items():
            rec = self._jobs.get(jid)
            if rec is None or jid in unsent:
                raise InvalidArgumentError(f"results name job {jid}, which is not in flight")
            if rec.reports + c > self.config.num_workers:
                raise InvalidArgumentError(
                    f"job {jid} reported {rec.reports + c} times, more than num_workers={self.config.num_workers}"
                )
        done: list[FinishedJob] = []
        for jid, ok in pairs:
            rec = self._jobs[jid]
            rec.reports += 1
            rec.failed |= not ok
            if rec.reports == self.config.num_workers:
                done.append(self._finish(rec))
        return done

    def _finish(self, rec: JobRecord) -> FinishedJob:
        job = rec.job
        del self._jobs[job.job_id]
        self._flush.remove(job.job_id)
        st = self._states.get(job.req_id)
        if st is not None:
            st.in_flight.discard(job.job_id)
        if job.is_store:
            self.manager.complete_store(job.keys, rec.req_context, success=not rec.failed)
            if self._deferred is not None:
                self._deferred.resolve(job.keys)
        else:
            self._unmark_loading(job.keys)
            self.manager.complete_load(job.keys, rec.req_context)
            if st is not None and st.load_job_id == job.job_id:
                st.load_job_id = None
        if rec.failed:
            kind = "store" if job.is_store else "load"
            logger.warning("%s job %d of request %s failed", kind, job.job_id, job.req_id)
        return FinishedJob(job.job_id, job.req_id, job.is_store, not rec.failed, job.keys)

    def _unmark_loading(self, keys: Sequence[bytes]) -> None:
        if self._deferred is not None:
            self._deferred.resolve(keys)
        lk = self._loading_keys
        for k in keys:
            c = lk[k] - 1
            if c:
                lk[k] = c
            else:
                del lk[k]
