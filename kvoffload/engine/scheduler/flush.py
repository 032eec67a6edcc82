"""GPU blocks that in-flight jobs still read or write after their owner gave them back.

When a request ends (or is preempted) while one of its transfer jobs is in flight, the engine
frees its GPU blocks at once; the same happens to the blocks of a sliding-window group that
leave the window while the request runs. :class:`FlushTracker` remembers which in-flight job
uses each such block. When the engine hands one of them to a request that will write it,
:meth:`FlushTracker.collect` names the job so the engine waits for it first.

Blocks are physical: they are keyed by ``(pool, block id)``, the pool of a group being
``OffloadingSchedulerConfig.pool_of_group`` -- groups sharing a pool name the same memory, so a
job of group 0 reading block 3 is flushed when group 1 is handed block 3 of the same pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.engine.scheduler.jobs import TransferJob

__all__ = ["FlushTracker"]


class FlushTracker:
    """Per GPU block pool, block id -> ids of the tracked in-flight jobs that use it."""

    __slots__ = ("_blocks", "_jobs", "_pool_of")

    def __init__(self, pool_of_group: Sequence[int]) -> None:
        self._pool_of = tuple(pool_of_group)
        self._blocks: list[dict[int, set[int]]] = [{} for _ in range(max(self._pool_of, default=-1) + 1)]
        self._jobs: dict[int, TransferJob] = {}

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def add(self, job: TransferJob) -> None:
        """Start tracking ``job``'s GPU blocks (some of them were given back)."""
        if job.job_id in self._jobs:
            return
        self._jobs[job.job_id] = job
        spec = job.gpu_spec
        for g, pool in enumerate(self._pool_of):
            blocks = self._blocks[pool]
            for b in spec.group_block_ids(g).tolist():
                blocks.setdefault(b, set()).add(job.job_id)

    def add_users(self, jobs: Iterable[TransferJob], freed: Sequence[Iterable[int]]) -> None:
        """Track those of ``jobs`` that use any of the blocks ``freed[g]`` of group g's pool."""
        by_pool: dict[int, set[int]] = {}
        for g, ids in enumerate(freed):
            by_pool.setdefault(self._pool_of[g], set()).update(ids)
        for job in jobs:
            spec = job.gpu_spec
            for g, pool in enumerate(self._pool_of):
                if by_pool.get(pool) and not by_pool[pool].isdisjoint(spec.group_block_ids(g).tolist()):
                    self.add(job)
                    break

    def remove(self, job_id: int) -> None:
        """Stop tracking a job (it completed, or the engine waited for it)."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        spec = job.gpu_spec
        for g, pool in enumerate(self._pool_of):
            blocks = self._blocks[pool]
            for b in spec.group_block_ids(g).tolist():
                s = blocks.get(b)
                if s is not None:
                    s.discard(job_id)
                    if not s:
                        del blocks[b]

    def collect(self, group: int, block_ids: Iterable[int], out: set[int]) -> None:
        """Add to ``out`` the jobs that use any of ``block_ids`` of ``group``'s pool."""
        blocks = self._blocks[self._pool_of[group]]
        if not blocks:
            return
        for b in block_ids:
            s = blocks.get(b)
            if s:
                out.update(s)
