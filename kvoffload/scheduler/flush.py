"""GPU blocks that in-flight jobs of finished or preempted requests still read or write.

When a request ends (or is preempted) while one of its transfer jobs is in flight, the engine
frees its GPU blocks at once; :class:`FlushTracker` remembers, per group, which in-flight job
uses each of those blocks. When the engine hands such a block to a request that will write it,
:meth:`FlushTracker.collect` names the job so the engine waits for it first.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.scheduler.jobs import TransferJob

__all__ = ["FlushTracker"]


class FlushTracker:
    """Per group, GPU block id -> ids of the orphaned in-flight jobs that use it."""

    __slots__ = ("_blocks", "_jobs")

    def __init__(self, num_groups: int) -> None:
        self._blocks: list[dict[int, set[int]]] = [{} for _ in range(num_groups)]
        self._jobs: dict[int, TransferJob] = {}

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def add(self, job: TransferJob) -> None:
        """Start tracking ``job``'s GPU blocks (its owner gave them back)."""
        if job.job_id in self._jobs:
            return
        self._jobs[job.job_id] = job
        spec = job.gpu_spec
        for g, blocks in enumerate(self._blocks):
            for b in spec.group_block_ids(g).tolist():
                blocks.setdefault(b, set()).add(job.job_id)

    def remove(self, job_id: int) -> None:
        """Stop tracking a job (it completed, or the engine waited for it)."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        spec = job.gpu_spec
        for g, blocks in enumerate(self._blocks):
            for b in spec.group_block_ids(g).tolist():
                s = blocks.get(b)
                if s is not None:
                    s.discard(job_id)
                    if not s:
                        del blocks[b]

    def collect(self, group: int, block_ids: Iterable[int], out: set[int]) -> None:
        """Add to ``out`` the jobs that use any of ``block_ids`` of ``group``."""
        blocks = self._blocks[group]
        if not blocks:
            return
        for b in block_ids:
            s = blocks.get(b)
            if s:
                out.update(s)
