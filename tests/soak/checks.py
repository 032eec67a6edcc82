"""The soak engine's checks, a part :class:`~tests.soak.engine.SoakEngine` holds: bytes and state.

* :meth:`EngineChecks.verify_load`: every block a finished load wrote holds its prefix's KV;
* :meth:`EngineChecks.verify_running`: before compute, every block of a scheduled request does;
* :meth:`EngineChecks.check_cpu_tier`: every ready key's CPU slot holds its prefix's KV, all ranks;
* :meth:`EngineChecks.queued_blocks`: the GPU blocks not-yet-executed jobs still use (nothing may
  write them);
* :meth:`EngineChecks.check_idle`: the quiescent state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from kvoffload.engine.scheduler.jobs import TransferJob
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from tests.soak.checked_manager import CheckedManager
from tests.soak.faulty import FaultyWorker
from tests.soak.kv import BLOCK, ROOT, GPUCaches, block_values, slot_records
from tests.soak.model import GROUPS, NULL, Seq, SoakRequest


def block_tokens(req: SoakRequest, idx: int, upto: int) -> tuple[bytes, tuple[int, ...]]:
    """Block ``idx`` of ``req``: its parent hash and its tokens (those before ``upto``)."""
    parent = ROOT if idx == 0 else req.block_hashes[idx - 1]
    return parent, tuple(req.tokens[idx * BLOCK : min((idx + 1) * BLOCK, upto)])


class EngineChecks:
    """The checks over the soak engine's parts.

    Args:
        gpu: the GPU KV caches of every rank.
        manager: the checked manager (its model of the CPU tier).
        workers: the rank workers (their queues and host pools).
        sched: the scheduler.
        pool_of: per group, its GPU block pool.
        parent: block hash -> (parent hash, the block's tokens), every hash the engine made.
        jobs: the engine's submitted, not yet completed jobs, job id -> job.
        free: per pool, the engine's free GPU block ids.
        all_ids: every request id the engine made.
        num_gpu_blocks: GPU blocks per pool (block 0 being the null block).
        count: the engine's counter (``count(name, n)``).
        fail: the engine's failure (raises :class:`~tests.soak.model.SoakFailure`).

    The containers are the engine's own, read (never changed) when a check runs.
    """

    def __init__(
        self,
        gpu: GPUCaches,
        manager: CheckedManager,
        workers: list[FaultyWorker],
        sched: OffloadingScheduler,
        pool_of: tuple[int, ...],
        parent: dict[bytes, tuple[bytes, tuple[int, ...]]],
        jobs: dict[int, TransferJob],
        free: list[list[int]],
        all_ids: list[str],
        num_gpu_blocks: int,
        count: Callable[[str, int], None],
        fail: Callable[[str], NoReturn],
    ) -> None:
        self.gpu = gpu
        self.manager = manager
        self.workers = workers
        self.sched = sched
        self.pool_of = pool_of
        self.parent = parent
        self.jobs = jobs
        self.free = free
        self.all_ids = all_ids
        self.num_gpu_blocks = num_gpu_blocks
        self._count = count
        self._fail = fail

    def verify_load(self, seq: Seq, job: TransferJob) -> None:
        spec = job.gpu_spec
        for g in range(len(GROUPS)):
            for b, idx in zip(spec.group_block_ids(g).tolist(), job.block_offsets[g].tolist(), strict=True):
                parent, toks = block_tokens(seq.req, idx, seq.load_end)
                if not self.gpu.matches(self.pool_of[g], b, parent, toks, g):
                    self._fail(f"load job {job.job_id} of {seq.req.request_id}: block {b} (group {g}, #{idx}) is wrong")
                self._count("loaded_blocks_checked", 1)

    def job_blocks(self, job: TransferJob) -> set[tuple[int, int]]:
        """The physical GPU blocks of a job: ``(pool, block id)``."""
        spec = job.gpu_spec
        return {(p, b) for g, p in enumerate(self.pool_of) for b in spec.group_block_ids(g).tolist()}

    def queued_blocks(self, exclude: int) -> set[tuple[int, int]]:
        """The GPU blocks of the jobs queued on any worker, but job ``exclude``."""
        out: set[tuple[int, int]] = set()
        for w in self.workers:
            for j in w._queue:
                if j.job_id != exclude:
                    out |= self.job_blocks(self.jobs[j.job_id])
        return out

    def verify_running(self, scheduled: list[tuple[Seq, int]]) -> None:
        for seq, _ in scheduled:
            for g, t in enumerate(seq.tables):
                for idx in range(-(-seq.num_computed // BLOCK)):
                    if t[idx] == NULL:
                        continue
                    parent, toks = block_tokens(seq.req, idx, seq.num_computed)
                    if not self.gpu.matches(self.pool_of[g], t[idx], parent, toks, g):
                        self._fail(f"{seq.req.request_id}: GPU block {t[idx]} (group {g}, #{idx}) lost its KV")
                    self._count("gpu_blocks_checked", 1)

    def check_cpu_tier(self) -> None:
        for key, (slot, ready, _pins) in self.manager.model.items():
            if not ready:
                continue
            g = int.from_bytes(key[-4:], "big")
            f = GROUPS[g][0]
            chain = [key[:-4]]
            for _ in range(f - 1):
                chain.append(self.parent[chain[-1]][0])
            chain.reverse()
            for r, w in enumerate(self.workers):
                pool = w.inner.host_pool
                got = slot_records(pool.buffer, slot, pool.slot_bytes, f)
                for j, h in enumerate(chain):
                    parent, toks = self.parent[h]
                    if not bool((got[j] == block_values(parent, toks, g, r)).all()):
                        self._fail(f"CPU slot {slot} of key {key.hex()[:12]} (group {g}) holds wrong bytes on rank {r}")
            self._count("cpu_slots_checked", 1)

    def check_idle(self) -> None:
        """Quiescence: nothing in flight, pending or pinned; usage = the stored keys; no state or
        GPU block left behind; the CPU tier's bytes right."""
        if self.sched.num_in_flight_jobs or any(w.busy for w in self.workers):
            self._fail(f"{self.sched.num_in_flight_jobs} jobs still in flight at quiescence")
        self.sched.take_events()
        self.manager.check_quiescent()
        if any(self.sched.get_request_state(rid) is not None for rid in self.all_ids):
            self._fail("the scheduler still holds state of ended requests")
        leaked = len(self.free) * (self.num_gpu_blocks - 1) - sum(map(len, self.free))
        if leaked:
            self._fail(f"{leaked} GPU blocks leaked")
        self.check_cpu_tier()
        self._count("quiescent_checks", 1)
