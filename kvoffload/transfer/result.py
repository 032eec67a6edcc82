"""What the transfer worker reports per job, the two kinds of job, and a launch's jobs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TransferResult", "STORE", "LOAD", "JobEntry", "launch_results"]

#: ``transfer_type`` of a store (GPU -> CPU) and of a load (CPU -> GPU).
STORE: tuple[str, str] = ("GPU", "CPU")
LOAD: tuple[str, str] = ("CPU", "GPU")


@dataclass
class TransferResult:
    """The outcome of one job, reported once by :meth:`TransferWorker.get_finished`.

    Attributes:
        job_id: the id given to :meth:`TransferWorker.transfer_async`.
        success: False if the backend raised or CUDA reported an error for the job.
        transfer_size: bytes of the pages moved (0 for a failed job).
        transfer_time: seconds the copy took (CUDA events on GPU, wall clock on CPU; 0 on failure).
        transfer_type: ``("GPU", "CPU")`` for a store, ``("CPU", "GPU")`` for a load.
    """

    job_id: int
    success: bool
    transfer_size: int
    transfer_time: float
    transfer_type: tuple[str, str]


#: One job of a launch: ``(job id, transfer_type, bytes)``.
JobEntry = tuple[int, tuple[str, str], int]


def launch_results(jobs: list[JobEntry], ok: bool, seconds: float) -> list[TransferResult]:
    """One result per job of a launch that took ``seconds`` (shared by bytes) or failed (``ok``
    False: every job failed)."""
    if not ok:
        return [TransferResult(jid, False, 0, 0.0, kind) for jid, kind, _ in jobs]
    if len(jobs) == 1:
        jid, kind, nbytes = jobs[0]
        return [TransferResult(jid, True, nbytes, seconds, kind)]
    total = sum(nbytes for _, _, nbytes in jobs) or 1
    return [TransferResult(jid, True, nbytes, seconds * nbytes / total, kind) for jid, kind, nbytes in jobs]
