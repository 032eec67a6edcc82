"""Jobs of one direction waiting to go out in one launch (the transfer worker's ``merge`` mode).

A :class:`JobBatch` owns one job table; each job appends its rows after the previous job's, so the
batch's rows are one job of the kernel. What each job must wait for is kept as events: a job
submitted without ``after`` waits for the work enqueued on the current stream *at its submit*,
so the batch re-records one event per stream at each submit (a later point of the same stream
covers every earlier one) and the launch waits on those events.
"""

from __future__ import annotations

from typing import Any

import torch

from kvoffload.transfer.cuda_jobs import JobEntry
from kvoffload.transfer.job_tables import JobTable

__all__ = ["JobBatch"]


class JobBatch:
    """Jobs of one direction (``store``) in ``table``'s first ``rows`` rows, launched together.

    Attributes:
        store: the direction of every job in it.
        table: the job table the rows are written to.
        rows: rows written so far (the next job's rows start here).
        jobs: the batch's jobs, in submit order.
        producers: what the launch waits for: events, one per stream named by default.
    """

    def __init__(self, store: bool, table: JobTable) -> None:
        self.store = store
        self.table = table
        self.rows = 0
        self.jobs: list[JobEntry] = []
        self.producers: list[Any] = []
        self._by_stream: dict[Any, Any] = {}

    def add(self, entry: JobEntry, rows: int, producers: list[Any], device: torch.device | None) -> None:
        """Append a job whose ``rows`` rows were written after the batch's; ``producers`` as
        ``transfer_async``'s ``after`` (events or streams; empty: the current stream of
        ``device``; ``device`` None: no CUDA, nothing to wait for)."""
        self.jobs.append(entry)
        self.rows += rows
        if device is None:
            return
        for p in producers or (torch.cuda.current_stream(device),):
            if not isinstance(p, torch.cuda.Stream):
                self.producers.append(p)
                continue
            event = self._by_stream.get(p)
            if event is None:
                event = self._by_stream[p] = torch.cuda.Event()
                self.producers.append(event)
            event.record(p)
