"""Job completion for :class:`~kvoffload.engine.scheduler.scheduler.OffloadingScheduler` (docs/contract.md §6).

A job completes once every one of the ``num_workers`` transfer workers reported it; then the
manager hears of it with the request's ``ReqContext``: ``complete_store(keys, ctx, success)`` for
a store (a failed store removes its still-pending keys), ``complete_load`` for a load whatever its
outcome (``success=False`` tells the engine to recompute those tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from kvoffload.engine.scheduler.deferral import DeferredLookups
from kvoffload.engine.scheduler.flush import FlushTracker
from kvoffload.engine.scheduler.jobs import FinishedJob, JobRecord, TransferJob
from kvoffload.engine.scheduler.state import RequestOffloadState
from kvoffload.engine.scheduler.validation import parse_results
from kvoffload.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

__all__ = ["JobCompletion", "unmark_loading"]


def unmark_loading(loading_keys: dict[bytes, int], keys: Sequence[bytes]) -> None:
    """Decrement each key's count of in-flight loads in ``loading_keys``; drop keys reaching 0."""
    for k in keys:
        c = loading_keys[k] - 1
        if c:
            loading_keys[k] = c
        else:
            del loading_keys[k]


class JobCompletion:
    """Counts worker reports and completes jobs of a scheduler's job book.

    Args:
        num_workers: reports each job needs before it completes.
        manager: the scheduler's manager (``complete_store`` / ``complete_load`` are called).
        jobs: the scheduler's in-flight jobs, job id -> record; completed jobs are removed.
        loading_keys: key -> number of in-flight loads of it; a completed load is subtracted.
        flush: the scheduler's flush tracker; a completed job stops being tracked.
        states: the scheduler's live request states, request id -> state; a completed job leaves
            its request's ``in_flight`` (and ``load_job_id`` for its load).
        deferred: the scheduler's deferred lookups (with a tiered manager), told of the keys of
            every completed job; None without one.

    The containers are the scheduler's own, updated in place; this object keeps no other state.
    """

    __slots__ = ("_deferred", "_flush", "_jobs", "_loading_keys", "_manager", "_num_workers", "_states")

    def __init__(
        self,
        num_workers: int,
        manager: Any,
        jobs: dict[int, JobRecord],
        loading_keys: dict[bytes, int],
        flush: FlushTracker,
        states: dict[str, RequestOffloadState],
        deferred: DeferredLookups | None = None,
    ) -> None:
        self._num_workers = num_workers
        self._manager = manager
        self._jobs = jobs
        self._loading_keys = loading_keys
        self._flush = flush
        self._states = states
        self._deferred = deferred

    def complete(self, results: Iterable[Any], unsent: Iterable[TransferJob]) -> list[FinishedJob]:
        """Count worker reports; complete the jobs every worker reported.

        Args:
            results: worker results -- objects with ``job_id`` and ``success`` (a
                ``TransferResult``) or ``(job_id, success)`` pairs; one per worker per job.
            unsent: the load jobs not yet handed to the engine (no report may name them).

        Returns:
            The jobs completed by these reports, in report order. A store completes with
            ``complete_store(keys, ctx, success)``; a failed store (any worker failed) removes its
            still-pending keys. A load completes with ``complete_load`` whatever its outcome;
            ``success=False`` tells the engine the loaded tokens must be recomputed. Raises
            :class:`~kvoffload.errors.InvalidArgumentError` (nothing changed) when a report names
            a job not in flight or a job gets more than ``num_workers`` reports.
        """
        pairs = parse_results(results)
        counts: dict[int, int] = {}
        for jid, _ in pairs:
            counts[jid] = counts.get(jid, 0) + 1
        unsent_ids = {j.job_id for j in unsent}
        for jid, c in counts.items():
            rec = self._jobs.get(jid)
            if rec is None or jid in unsent_ids:
                raise InvalidArgumentError(f"results name job {jid}, which is not in flight")
            if rec.reports + c > self._num_workers:
                raise InvalidArgumentError(
                    f"job {jid} reported {rec.reports + c} times, more than num_workers={self._num_workers}"
                )
        done: list[FinishedJob] = []
        for jid, ok in pairs:
            rec = self._jobs[jid]
            rec.reports += 1
            rec.failed |= not ok
            if rec.reports == self._num_workers:
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
            self._manager.complete_store(job.keys, rec.req_context, success=not rec.failed)
            if self._deferred is not None:
                self._deferred.resolve(job.keys)
        else:
            unmark_loading(self._loading_keys, job.keys)
            if self._deferred is not None:
                self._deferred.resolve(job.keys)
            self._manager.complete_load(job.keys, rec.req_context)
            if st is not None and st.load_job_id == job.job_id:
                st.load_job_id = None
        if rec.failed:
            kind = "store" if job.is_store else "load"
            logger.warning("%s job %d of request %s failed", kind, job.job_id, job.req_id)
        return FinishedJob(job.job_id, job.req_id, job.is_store, not rec.failed, job.keys)
