"""A transfer-worker wrapper that runs each job some engine steps after it was submitted.

Without CUDA the transfer worker runs a job synchronously inside ``transfer_async``, so a store
can never be in flight when the engine frees or reuses its GPU blocks. :class:`DelayedWorker`
emulates a slow link: a job is handed to the wrapped worker only ``latency_steps`` calls of
:meth:`tick` later (or when :meth:`wait` asks for it), so a store really reads its GPU blocks
late. If the engine let another request overwrite those blocks first, the stored bytes would be
wrong -- and the load checks of the reference engine would catch it. Jobs run in submission
order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["DelayedWorker"]


@dataclass
class _Failed:
    """A job the wrapped worker refused at submission (reported like a failed TransferResult)."""

    job_id: int
    success: bool = False
    transfer_size: int = 0
    transfer_time: float = 0.0
    transfer_type: tuple[str, str] = ("?", "?")


class DelayedWorker:
    """Wraps a worker (``transfer_async``/``get_finished``/``wait``/``shutdown``).

    Args:
        worker: the worker that moves the bytes.
        latency_steps: ticks between submission and execution (0: run at once).
    """

    def __init__(self, worker: Any, latency_steps: int) -> None:
        self.worker = worker
        self.latency_steps = latency_steps
        self._queue: deque[tuple[int, int, Any]] = deque()  # (due tick, job id, spec)
        self._tick = 0
        self._submit_failures: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker, name)

    def _run(self, job_id: int, spec: Any) -> None:
        if not self.worker.transfer_async(job_id, spec):
            self._submit_failures.append(job_id)

    def transfer_async(self, job_id: int, spec: Any) -> bool:
        if self.latency_steps <= 0:
            return bool(self.worker.transfer_async(job_id, spec))
        self._queue.append((self._tick + self.latency_steps, job_id, spec))
        return True

    def tick(self) -> None:
        """Advance one engine step; run the jobs now due."""
        self._tick += 1
        while self._queue and self._queue[0][0] <= self._tick:
            _, jid, spec = self._queue.popleft()
            self._run(jid, spec)

    def wait(self, job_ids: Collection[int]) -> None:
        """Run every queued job up to the last of ``job_ids`` (order kept), then wait for them."""
        wanted = set(job_ids)
        if wanted and any(jid in wanted for _, jid, _ in self._queue):
            while self._queue and wanted & {jid for _, jid, _ in self._queue}:
                _, jid, spec = self._queue.popleft()
                self._run(jid, spec)
        running = [j for j in wanted if j not in self._submit_failures]
        if running:
            self.worker.wait(running)

    def get_finished(self) -> list[Any]:
        out = list(self.worker.get_finished())
        if self._submit_failures:
            out.extend(_Failed(j) for j in self._submit_failures)
            self._submit_failures = []
        return out

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def shutdown(self) -> None:
        while self._queue:
            _, jid, spec = self._queue.popleft()
            self._run(jid, spec)
        self.worker.shutdown()
