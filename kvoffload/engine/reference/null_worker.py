"""A transfer worker that moves no bytes: for capacity/policy simulation only.

It follows :class:`~kvoffload.transfer.worker.TransferWorker`'s protocol (``transfer_async``,
``get_finished``, ``wait``, ``shutdown``): every submitted job finishes at once, successfully,
and is reported by the next :meth:`get_finished`. ``transfer_size`` is 0 because nothing moves.
The engine's load verification must be off when using it (loaded pages hold stale bytes).
"""

from __future__ import annotations

from collections.abc import Collection

from kvoffload.core.base import LoadStoreSpec
from kvoffload.errors import InvalidArgumentError
from kvoffload.transfer.result import TransferResult

__all__ = ["NullTransferWorker"]


class NullTransferWorker:
    """Completes every job immediately without touching any memory."""

    def __init__(self) -> None:
        self._finished: list[TransferResult] = []
        self._in_flight: set[int] = set()
        self.jobs_submitted = 0

    def transfer_async(self, job_id: int, spec: tuple[LoadStoreSpec, LoadStoreSpec]) -> bool:
        """Record ``job_id`` as finished; a job id still unreported is an error."""
        if job_id in self._in_flight:
            raise InvalidArgumentError(f"job_id {job_id} is still in flight")
        src, dst = spec
        self._in_flight.add(job_id)
        self._finished.append(TransferResult(job_id, True, 0, 0.0, (src.medium(), dst.medium())))
        self.jobs_submitted += 1
        return True

    def get_finished(self) -> list[TransferResult]:
        out, self._finished = self._finished, []
        self._in_flight.difference_update(r.job_id for r in out)
        return out

    def wait(self, job_ids: Collection[int]) -> None:
        """Nothing to wait for: every job is already done."""

    def shutdown(self) -> None:
        self._finished.clear()
        self._in_flight.clear()
