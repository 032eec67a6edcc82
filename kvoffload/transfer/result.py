"""What the transfer worker reports per job, and the two kinds of job."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TransferResult", "STORE", "LOAD"]

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
