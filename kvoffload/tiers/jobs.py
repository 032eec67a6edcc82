"""One submitted store/load job: its keys, its batches, per-key outcomes as batches finish."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Literal

from kvoffload.tiers.types import TierJobResult

__all__ = ["Job"]


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
