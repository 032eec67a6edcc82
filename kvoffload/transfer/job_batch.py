"""Jobs of one direction waiting to go out in one launch (the transfer worker's ``merge`` mode).

A :class:`JobBatch` keeps each checked job's arrays (:class:`~kvoffload.transfer.job_mapping.
MappedJob`); at the launch they are written into one job table, one after another
(:meth:`~kvoffload.transfer.job_mapping.JobMapper.write`), so the batch is one job of the kernel.
What each job must wait for is kept as events: a job submitted without ``after`` waits for the work
enqueued on the current stream *at its submit*, so the batch re-records one event per stream at each
submit (a later point of the same stream covers every earlier one) and the launch waits on those
events."""

from __future__ import annotations

from typing import Any

import torch

from kvoffload.transfer.job_mapping import MappedJob
from kvoffload.transfer.result import JobEntry

__all__ = ["JobBatch"]


class JobBatch:
    """Jobs of one direction (``store``), launched together.

    Attributes:
        store: the direction of every job in it.
        rows: the job table rows of all its jobs.
        jobs: the batch's jobs, in submit order; ``mapped``: their arrays, in the same order.
        producers: what the launch waits for: events, one per stream named by default.
    """

    def __init__(self, store: bool) -> None:
        self.store = store
        self.rows = 0
        self.jobs: list[JobEntry] = []
        self.mapped: list[MappedJob] = []
        self.producers: list[Any] = []
        self._by_stream: dict[int, Any] = {}  # stream handle -> its event

    def add(self, entry: JobEntry, job: MappedJob, producers: list[Any], device: torch.device | None) -> None:
        """Append a checked job; ``producers`` as ``transfer_async``'s ``after`` (events or
        streams; empty: the current stream of ``device``; ``device`` None: no CUDA, nothing to
        wait for)."""
        self.jobs.append(entry)
        self.mapped.append(job)
        self.rows += job.ids.size
        if device is None:
            return
        for p in producers or (torch.cuda.current_stream(device),):
            if not isinstance(p, torch.cuda.Stream):
                self.producers.append(p)
                continue
            handle = p.cuda_stream  # an int: cheaper to hash than the stream object
            event = self._by_stream.get(handle)
            if event is None:
                event = self._by_stream[handle] = torch.cuda.Event()
                self.producers.append(event)
            event.record(p)

    def split(self, k: int) -> JobBatch:
        """Keep the first ``k`` jobs; return a batch of the others (same producers: waiting for
        more is safe)."""
        rest = JobBatch(self.store)
        rest.jobs, self.jobs = self.jobs[k:], self.jobs[:k]
        rest.mapped, self.mapped = self.mapped[k:], self.mapped[:k]
        rest.rows = sum(m.ids.size for m in rest.mapped)
        self.rows -= rest.rows
        rest.producers = self.producers
        return rest
