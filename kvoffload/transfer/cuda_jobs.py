"""The transfer worker's jobs on CUDA: its two streams, and each job from submit to report.

A job runs on the worker's stream (``expedited`` loads on the second one) after the producers it
must follow, between two timing events; its end event is polled with ``event.query()`` and the job
is reported once, with the time between its events. A CUDA error at submit, completion or while
polling fails that job (reported, never raised). See :mod:`kvoffload.transfer.worker` for the
ordering guarantees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvoffload.transfer.job_mapping import JobArrays
from kvoffload.transfer.result import TransferResult

__all__ = ["CudaJobs", "STREAM_PRIORITY"]

logger = logging.getLogger(__name__)

#: Priority of the worker's CUDA streams (lower is higher; CUDA clamps to the device's range): KV
#: transfers are latency-critical for the requests waiting on them.
STREAM_PRIORITY = -1


@dataclass
class _InFlight:
    """A CUDA job between submit and report. Holds its arrays so they outlive the launch."""

    job_id: int
    transfer_type: tuple[str, str]
    transfer_size: int
    start: Any  # torch.cuda.Event
    end: Any  # torch.cuda.Event
    ok: bool
    arrays: JobArrays


class CudaJobs:
    """The jobs of one transfer worker on ``device``, from submit until reported.

    Attributes:
        stream: the stream jobs run on, in submission order.
        expedited_stream: the stream of expedited loads (same priority), so they do not queue
            behind the jobs submitted before them.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: Any = torch.cuda.Stream(device=device, priority=STREAM_PRIORITY)
        self.expedited_stream: Any = torch.cuda.Stream(device=device, priority=STREAM_PRIORITY)
        self._inflight: dict[int, _InFlight] = {}

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._inflight

    def __len__(self) -> int:
        return len(self._inflight)

    def submit(
        self,
        jid: int,
        arrays: JobArrays,
        kind: tuple[str, str],
        producers: list[Any],
        expedited: bool,
        launch: Callable[[], None],
    ) -> TransferResult | None:
        """Enqueue ``launch()`` for job ``jid`` after ``producers`` (events or streams; none: the
        current stream). None: the job is in flight; a failed result: CUDA itself failed at submit."""
        stream = self.expedited_stream if expedited else self.stream
        ok = True
        try:
            with torch.cuda.device(self.device):
                for p in producers or [torch.cuda.current_stream(self.device)]:
                    if isinstance(p, torch.cuda.Stream):
                        ready = torch.cuda.Event()
                        ready.record(p)
                        stream.wait_event(ready)
                    else:
                        stream.wait_event(p)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream):
                    start.record(stream)
                    try:
                        launch()
                    except Exception:
                        # Report only once whatever the backend may have enqueued has drained.
                        logger.exception("transfer job %d (%s->%s) failed at launch", jid, *kind)
                        ok = False
                    end.record(stream)
        except Exception:  # CUDA itself failed (e.g. a sticky error): report at once
            logger.exception("transfer job %d (%s->%s): CUDA error at submit", jid, *kind)
            return TransferResult(jid, False, 0, 0.0, kind)
        self._inflight[jid] = _InFlight(jid, kind, arrays.transfer_size, start, end, ok, arrays)
        return None

    def finished(self) -> list[TransferResult]:
        """The jobs whose end event has passed, each reported once; never blocks."""
        out = []
        for jid, job in list(self._inflight.items()):
            try:
                done = bool(job.end.query())
            except Exception:
                logger.exception("transfer job %d: CUDA error while polling", jid)
                job.ok, done = False, True
            if done:
                del self._inflight[jid]
                out.append(self._complete(job))
        return out

    def wait(self, job_ids: list[int]) -> None:
        """Block until the jobs ``job_ids`` that are in flight have finished (others are ignored)."""
        for jid in job_ids:
            job = self._inflight.get(jid)
            if job is None:
                continue
            try:
                job.end.synchronize()
            except Exception:
                logger.exception("transfer job %d: CUDA error while waiting", jid)
                job.ok = False

    def drain(self) -> None:
        """Block until both streams are idle; on a CUDA error every job in flight fails."""
        if not self._inflight:
            return
        try:
            self.stream.synchronize()
            self.expedited_stream.synchronize()
        except Exception:
            logger.exception("transfer worker: CUDA error while draining at shutdown")
            for job in self._inflight.values():
                job.ok = False

    def _complete(self, job: _InFlight) -> TransferResult:
        if not job.ok:
            return TransferResult(job.job_id, False, 0, 0.0, job.transfer_type)
        try:
            seconds = job.start.elapsed_time(job.end) / 1000.0
        except Exception:
            logger.exception("transfer job %d: CUDA error at completion", job.job_id)
            return TransferResult(job.job_id, False, 0, 0.0, job.transfer_type)
        return TransferResult(job.job_id, True, job.transfer_size, seconds, job.transfer_type)
