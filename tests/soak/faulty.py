"""A transfer-worker wrapper that injects faults: late, reordered, failed, garbage-writing jobs.

It stands for a real GPU worker whose copies run some time after submission: a job is handed to
the wrapped :class:`~kvoffload.transfer.worker.TransferWorker` (which copies synchronously on
CPU) only when it *executes* -- so a store reads its GPU blocks then, and any block the engine
let another request overwrite meanwhile would be caught by the byte checks. Per job:

* execution is delayed by 0..``max_delay`` ticks, and the jobs due at one tick run in random
  order (out of submission order); :meth:`wait` executes the named jobs at once (a flush);
* its report may come ``1..max_delay`` ticks after it executed (complete late), reports of one
  tick in random order;
* it may fail without copying, or fail after copying and then scribbling garbage over its
  destination (GPU blocks of a load, host slots of a store): a failed job's bytes are never
  trusted by the scheduler.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.result import TransferResult


@dataclass
class FaultRates:
    delay: float = 0.5  # probability that a job executes later than at submission
    max_delay: int = 4
    late_report: float = 0.3
    fail: float = 0.04
    garbage: float = 0.5  # share of failures that copied, then wrote garbage


@dataclass
class _Job:
    job_id: int
    spec: tuple[Any, Any]
    due: int
    seq: int
    fate: str  # "ok" | "fail" | "garbage"


class FaultyWorker:
    def __init__(self, inner: Any, rank: int, rng: random.Random, rates: FaultRates, counts: dict[str, int]) -> None:
        self.inner = inner
        self.rank = rank
        self.rng = rng
        self.rates = rates
        self.counts = counts
        self.tick_no = 0
        self._queue: list[_Job] = []
        self._reports: list[tuple[int, TransferResult]] = []
        self._seq = 0
        self._last_seq = -1
        self.on_garbage_gpu: Any = None  # callable(rank, GPULoadStoreSpec)

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._reports)

    def transfer_async(self, job_id: int, spec: tuple[Any, Any]) -> bool:
        r, rates = self.rng, self.rates
        fate = "ok"
        if r.random() < rates.fail:
            fate = "garbage" if r.random() < rates.garbage else "fail"
            self._count(f"fault_{fate}")
        delay = r.randint(1, rates.max_delay) if r.random() < rates.delay else 0
        if delay:
            self._count("fault_late_execution")
        job = _Job(job_id, spec, self.tick_no + delay, self._seq, fate)
        self._seq += 1
        if delay == 0:
            self._execute(job)
        else:
            self._queue.append(job)
        return True

    def _execute(self, job: _Job) -> None:
        if job.seq < self._last_seq:
            self._count("fault_out_of_order")
        self._last_seq = max(self._last_seq, job.seq)
        src, dst = job.spec
        kind = ("GPU", "CPU") if isinstance(src, GPULoadStoreSpec) else ("CPU", "GPU")
        if job.fate != "fail":
            if not self.inner.transfer_async(job.job_id, job.spec):
                raise AssertionError(f"worker refused job {job.job_id}")
            (res,) = [x for x in self.inner.get_finished() if x.job_id == job.job_id]
            if not res.success:
                raise AssertionError(f"job {job.job_id} failed in the real worker")
        if job.fate == "garbage":
            if isinstance(dst, CPULoadStoreSpec):
                pool = self.inner.host_pool
                for s in dst.block_ids.tolist():
                    pool.slot_view(s).fill_(0xEE)
            else:
                assert isinstance(dst, GPULoadStoreSpec) and self.on_garbage_gpu is not None
                self.on_garbage_gpu(self.rank, dst)
        ok = job.fate == "ok"
        result = TransferResult(job.job_id, ok, 0, 0.0, kind)
        late = self.rng.randint(1, self.rates.max_delay) if self.rng.random() < self.rates.late_report else 0
        if late:
            self._count("fault_late_report")
        self._reports.append((self.tick_no + late, result))

    def tick(self) -> None:
        """One engine step: execute the jobs now due, in random order."""
        self.tick_no += 1
        due = [j for j in self._queue if j.due <= self.tick_no]
        if due:
            self._queue = [j for j in self._queue if j.due > self.tick_no]
            self.rng.shuffle(due)
            for j in due:
                self._execute(j)

    def wait(self, job_ids: Collection[int]) -> None:
        """Execute the named jobs now (a flush); their reports still come through get_finished."""
        wanted = set(job_ids)
        now = [j for j in self._queue if j.job_id in wanted]
        if now:
            self._queue = [j for j in self._queue if j.job_id not in wanted]
            self.rng.shuffle(now)
            for j in now:
                self._execute(j)
                self._count("flush_executed")

    def get_finished(self) -> list[TransferResult]:
        out = [res for due, res in self._reports if due <= self.tick_no]
        self._reports = [(due, res) for due, res in self._reports if due > self.tick_no]
        self.rng.shuffle(out)
        return out

    def drain(self) -> list[TransferResult]:
        """Execute everything and report everything (quiescence)."""
        for j in sorted(self._queue, key=lambda j: j.seq):
            self._execute(j)
        self._queue = []
        out = [res for _, res in self._reports]
        self._reports = []
        return out
