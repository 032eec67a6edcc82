"""A tier's jobs: one submitted store/load job (its keys, its batches, per-key outcomes as batches
finish), and the book of all of them with the probes in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Literal

from kvoffload.tiers.types import TierJobResult

__all__ = ["Job", "JobBook"]


class Job:
    """Bookkeeping of one job (mutated by tier threads under the tier's lock)."""

    def __init__(self, job_id: int, kind: Literal["store", "load"], keys: list[bytes], n: int, batch_keys: int) -> None:
        self.job_id = job_id
        self.kind: Literal["store", "load"] = kind
        self.keys = keys
        self.ok = [False] * n
        self.batch_keys = batch_keys
        self.remaining = max(1, -(-n // batch_keys))
        self.nbytes = 0
        self.t0 = time.perf_counter()

    def batches(self) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of each batch of at most ``batch_keys`` keys."""
        n = len(self.keys)
        for start in range(0, n, self.batch_keys):
            yield start, min(n, start + self.batch_keys)

    def record(self, start: int, ok: list[bool], nbytes: int) -> bool:
        """Store one batch's outcome; True when it was the job's last batch."""
        self.ok[start : start + len(ok)] = ok
        self.nbytes += nbytes
        self.remaining -= 1
        return self.remaining == 0

    def result(self) -> TierJobResult:
        """The finished job's result."""
        return TierJobResult(
            self.job_id, self.kind, tuple(self.keys), tuple(self.ok), self.nbytes, time.perf_counter() - self.t0
        )


class JobBook:
    """The jobs in flight by id, the results not reported yet, the probes in flight and the record
    bytes of unfinished stores, under the tier's ``lock``; :meth:`wait_idle` waits for them all."""

    def __init__(self, lock: threading.Lock) -> None:
        self.idle = threading.Condition(lock)
        self.jobs: dict[int, Job] = {}
        self.finished: list[TierJobResult] = []
        self.probes_in_flight = 0
        self.pending_write_bytes = 0

    def finish_now(self, job_id: int, kind: Literal["store", "load"], keys: list[bytes], ok: bool) -> None:
        """A job finished at submission (no keys, or dropped: ``ok`` False), every key ``ok``
        (caller holds the lock)."""
        self.finished.append(TierJobResult(job_id, kind, tuple(keys), (ok,) * len(keys), 0, 0.0))

    def record(self, job: Job, start: int, ok: list[bool], nbytes: int) -> None:
        """Record one batch's outcome (caller holds the lock); completes the job after its last batch."""
        if job.record(start, ok, nbytes):
            del self.jobs[job.job_id]
            self.finished.append(job.result())
            self.idle.notify_all()

    def probe_done(self) -> None:
        """A probe counted in ``probes_in_flight`` has returned."""
        with self.idle:
            self.probes_in_flight -= 1
            self.idle.notify_all()

    def take_finished(self) -> list[TierJobResult]:
        """The results recorded since the last call."""
        with self.idle:
            done, self.finished = self.finished, []
        return done

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no job and no probe is in flight; False after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.idle:
            while self.jobs or self.probes_in_flight:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.idle.wait(left)
        return True
