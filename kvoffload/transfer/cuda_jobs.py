"""The transfer worker's launches on CUDA: its two streams, and each launch from submit to report.

A launch carries one job, or several jobs of one direction merged into it. It runs on the
worker's stream (``expedited`` loads on the second one) after the producers it must follow,
between two timing events; its end event is polled with ``event.query()`` and each of its jobs is
reported once, with the launch's time shared by bytes. A CUDA error at submit, completion or
while polling fails that launch's jobs (reported, never raised). See
:mod:`kvoffload.transfer.worker` for the ordering guarantees.

Per launch the host does: one wait per producer (an event recorded on the current stream by
default), two event records around the launch. Events are reused once their launch is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from kvoffload.transfer.result import JobEntry, TransferResult, launch_results

__all__ = ["CudaJobs", "STREAM_PRIORITY"]

logger = logging.getLogger(__name__)

#: Priority of the worker's CUDA streams (lower is higher; CUDA clamps to the device's range): KV
#: transfers are latency-critical for the requests waiting on them.
STREAM_PRIORITY = -1


class _Launch:
    """A launch between submit and report: ``table`` goes to ``release`` once it is reported,
    ``keep`` (what else the device reads) is only held until then."""

    __slots__ = ("jobs", "start", "end", "ok", "table", "keep")

    def __init__(self, jobs: list[JobEntry], start: Any, end: Any, ok: bool, table: Any, keep: Any) -> None:
        self.jobs, self.start, self.end, self.ok, self.table, self.keep = jobs, start, end, ok, table, keep


class CudaJobs:
    """The launches of one transfer worker on ``device``, from submit until reported.

    Args:
        device: the KV cache's CUDA device.
        release: called with a launch's ``table`` once the launch is reported (to reuse it).

    Attributes:
        stream: the stream jobs run on, in submission order.
        expedited_stream: the stream of expedited loads (same priority), so they do not queue
            behind the jobs submitted before them.
    """

    def __init__(self, device: torch.device, release: Callable[[Any], None] = lambda table: None) -> None:
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self.stream: Any = torch.cuda.Stream(device=device, priority=STREAM_PRIORITY)
        self.expedited_stream: Any = torch.cuda.Stream(device=device, priority=STREAM_PRIORITY)
        self._release = release
        self._launches: dict[int, _Launch] = {}  # by submit order
        self._next = 0
        self._job_launch: dict[int, _Launch] = {}
        self._timing: list[Any] = []  # free timing events
        self._ready = torch.cuda.Event()  # reused: a stream waits on the record made just before

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._job_launch

    def __len__(self) -> int:
        """Jobs in flight."""
        return len(self._job_launch)

    def submit(
        self,
        jobs: list[JobEntry],
        producers: list[Any],
        expedited: bool,
        launch: Callable[[Any], None],
        table: Any = None,
        keep: Any = None,
    ) -> list[TransferResult]:
        """Enqueue ``launch(stream)`` for ``jobs`` after ``producers`` (events or streams; none:
        the current stream). ``table``: released once the launch is reported; ``keep``: held until
        then. Returns failed results if CUDA itself failed at submit (``table`` is then released
        at once), else an empty list: the jobs are in flight."""
        stream = self.expedited_stream if expedited else self.stream
        try:
            if torch.cuda.current_device() != self._index:
                with torch.cuda.device(self._index):
                    start, end, ok = self._enqueue(jobs, producers, stream, launch)
            else:
                start, end, ok = self._enqueue(jobs, producers, stream, launch)
        except Exception:  # CUDA itself failed (e.g. a sticky error): report at once
            logger.exception("transfer jobs %s: CUDA error at submit", [j[0] for j in jobs])
            if table is not None:
                self._release(table)
            return launch_results(jobs, False, 0.0)
        entry = _Launch(jobs, start, end, ok, table, keep)
        self._launches[self._next] = entry
        self._next += 1
        for jid, _, _ in jobs:
            self._job_launch[jid] = entry
        return []

    def _enqueue(
        self, jobs: list[JobEntry], producers: list[Any], stream: Any, launch: Callable[[Any], None]
    ) -> tuple[Any, Any, bool]:
        ready = self._ready
        if not producers:
            ready.record(torch.cuda.current_stream(self.device))
            stream.wait_event(ready)
        for p in producers:
            if isinstance(p, torch.cuda.Stream):
                ready.record(p)
                stream.wait_event(ready)
            else:
                stream.wait_event(p)
        timing = self._timing
        start = timing.pop() if timing else torch.cuda.Event(enable_timing=True)
        end = timing.pop() if timing else torch.cuda.Event(enable_timing=True)
        start.record(stream)
        ok = True
        try:
            launch(stream)
        except Exception:
            # Report only once whatever the backend may have enqueued has drained.
            logger.exception("transfer jobs %s failed at launch", [j[0] for j in jobs])
            ok = False
        end.record(stream)
        return start, end, ok

    def finished(self) -> list[TransferResult]:
        """The jobs whose launch's end event has passed, each reported once; never blocks."""
        out: list[TransferResult] = []
        for key, entry in list(self._launches.items()):
            try:
                done = bool(entry.end.query())
            except Exception:
                logger.exception("transfer jobs %s: CUDA error while polling", [j[0] for j in entry.jobs])
                entry.ok, done = False, True
            if done:
                del self._launches[key]
                self._complete(entry, out)
        return out

    def wait(self, job_ids: list[int]) -> None:
        """Block until the jobs ``job_ids`` that are in flight have finished (others are ignored)."""
        for jid in job_ids:
            entry = self._job_launch.get(jid)
            if entry is None:
                continue
            try:
                entry.end.synchronize()
            except Exception:
                logger.exception("transfer job %d: CUDA error while waiting", jid)
                entry.ok = False

    def drain(self) -> None:
        """Block until both streams are idle; on a CUDA error every job in flight fails."""
        if not self._launches:
            return
        try:
            self.stream.synchronize()
            self.expedited_stream.synchronize()
        except Exception:
            logger.exception("transfer worker: CUDA error while draining at shutdown")
            for entry in self._launches.values():
                entry.ok = False

    def _complete(self, entry: _Launch, out: list[TransferResult]) -> None:
        for jid, _, _ in entry.jobs:
            del self._job_launch[jid]
        seconds = 0.0
        if entry.ok:
            try:
                seconds = entry.start.elapsed_time(entry.end) / 1000.0
            except Exception:
                logger.exception("transfer jobs %s: CUDA error at completion", [j[0] for j in entry.jobs])
                entry.ok = False
        out += launch_results(entry.jobs, entry.ok, seconds)
        if entry.ok:
            self._timing += (entry.start, entry.end)
        if entry.table is not None:
            self._release(entry.table)
