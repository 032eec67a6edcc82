"""What flows between the engine, the scheduler and the transfer workers each step.

* engine -> scheduler: :class:`ScheduledRequest` per request that computes this step.
* scheduler -> engine: :class:`SchedulerStepOutput` -- job ids to flush (wait for) first, then
  load jobs and store jobs (:class:`TransferJob`) to hand to every transfer worker.
* workers -> scheduler: results with ``job_id`` and ``success`` (a
  :class:`~kvoffload.transfer.worker.TransferResult` or a ``(job_id, success)`` pair);
  scheduler -> engine: :class:`FinishedJob` once all ``num_workers`` reported a job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec, OffloadKey, ReqContext

__all__ = ["ScheduledRequest", "TransferJob", "SchedulerStepOutput", "FinishedJob"]


@dataclass(slots=True)
class ScheduledRequest:
    """One request the engine computes this step.

    Attributes:
        request: the engine's request (duck-typed, see docs/contract.md §6).
        num_computed_tokens: tokens whose KV is in the GPU cache before this step (GPU prefix
            hits and loaded tokens included).
        num_scheduled_tokens: tokens computed this step.
        block_ids: per group, GPU block ids. For a request scheduled for the first time since it
            was admitted (or resumed after preemption): its whole block table. For a request
            that was already running: only the blocks appended this step (may be empty).
    """

    request: Any
    num_computed_tokens: int
    num_scheduled_tokens: int
    block_ids: Sequence[Sequence[int]] = ()


@dataclass(slots=True)
class TransferJob:
    """One transfer for one request: give ``(job_id, spec)`` to every transfer worker.

    Attributes:
        job_id: unique id (increasing).
        req_id: the request it belongs to.
        is_store: True for GPU->CPU, False for CPU->GPU.
        spec: ``(src, dst)``: ``(GPULoadStoreSpec, CPULoadStoreSpec)`` for a store, the reverse
            for a load. The GPU spec lists GPU block ids ordered by group with
            ``block_indices[g]`` = index in the request of group g's first GPU block.
        keys: offload keys moved, ordered by group then block (``cpu_spec.block_ids[i]`` is the
            slot of ``keys[i]``).
        block_offsets: per group, the indices within the request of the GPU blocks moved.
    """

    job_id: int
    req_id: str
    is_store: bool
    spec: tuple[LoadStoreSpec, LoadStoreSpec]
    keys: list[OffloadKey]
    block_offsets: tuple[np.ndarray, ...]

    @property
    def gpu_spec(self) -> GPULoadStoreSpec:
        s = self.spec[0] if self.is_store else self.spec[1]
        assert isinstance(s, GPULoadStoreSpec)
        return s

    @property
    def cpu_spec(self) -> CPULoadStoreSpec:
        s = self.spec[1] if self.is_store else self.spec[0]
        assert isinstance(s, CPULoadStoreSpec)
        return s


@dataclass
class SchedulerStepOutput:
    """The scheduler's answer for one engine step.

    The engine must, in this order: wait for ``flush_job_ids`` on every worker (GPU blocks
    they read or write were handed to another request this step), submit ``load_jobs``, run
    the step's compute, submit ``store_jobs`` (workers order stores after the compute).
    """

    load_jobs: list[TransferJob] = field(default_factory=list)
    store_jobs: list[TransferJob] = field(default_factory=list)
    flush_job_ids: list[int] = field(default_factory=list)

    @property
    def jobs(self) -> list[TransferJob]:
        return self.load_jobs + self.store_jobs


@dataclass(slots=True)
class FinishedJob:
    """A job every worker reported. ``success`` is False if any worker failed it."""

    job_id: int
    req_id: str
    is_store: bool
    success: bool
    keys: list[OffloadKey]


@dataclass(slots=True)
class JobRecord:
    """The scheduler's bookkeeping of an in-flight job (internal)."""

    job: TransferJob
    req_context: ReqContext
    reports: int = 0
    failed: bool = False
    orphaned: bool = False
