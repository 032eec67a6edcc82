"""The soak engine: drives the scheduler, a checked manager and real transfer workers like an engine.

Geometry (vLLM-like hybrid model): three KV-cache groups -- full attention (2 GPU blocks per
offloaded block) and two sliding-window groups (windows of 10 and 13 tokens, factors 1 and 2) --
sharing ONE GPU block pool (block 0 is the null block) and one set of KV tensors per rank
(``KVCacheTable.from_tensors(..., shared_tensors=True)``); or, for some seeds, one pool and one
set of tensors per group (``GroupOffloadConfig.block_pool`` distinct: block ids collide across
groups, memory does not). ``num_ranks`` tensor-parallel workers each report every job, and the
CPU tier is far smaller than the traffic.

Each step, as an engine does it: collect the workers' reports (``complete_jobs``; a finished load
is byte-checked), random events (arrivals, aborts in any state, ``reset_cache``, preemptions),
scheduling (running requests first, preempting from the back when blocks run out; loaded
requests; waiting requests through ``get_num_new_matched_tokens`` / ``update_state_after_alloc``),
``build_step``, wait for the flush jobs, submit loads, compute (write every scheduled token's KV),
submit stores, then sample/finish and free the sliding-window blocks that left the window
(``free_blocks``, the table entry becoming the null block). Every request that ends (finished or
aborted) is reported with ``request_finished`` as vLLM reports it: also a waiting request the
scheduler never looked up, and every other request a second time (both must change nothing).

Checks (a failure raises :class:`SoakFailure`):

* every block a finished load wrote holds the KV of its token prefix (all ranks);
* before each compute, every block of every scheduled request holds its tokens' KV;
* every ready key's CPU slot holds the KV of its prefix (all ranks), every step;
* no job submitted reads or writes the null block or a block its request does not hold, and
  no block is written (compute or load) while a not-yet-executed job still uses it;
* the manager never breaks its contract (:class:`~tests.soak.checked_manager.CheckedManager`:
  nothing pinned or pending evicted, slots never shared...);
* at quiescence nothing is in flight, pending or pinned, and usage equals the stored keys.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, NoReturn

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import TransferJob
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.transfer.worker import TransferWorker
from tests.soak.blocks import GPUBlocks
from tests.soak.checked_manager import CheckedManager
from tests.soak.checks import EngineChecks, block_tokens
from tests.soak.faulty import FaultyWorker
from tests.soak.kv import BLOCK, GPUCaches, chain_hash
from tests.soak.model import GROUPS, NULL, Seq, SoakConfig, SoakFailure
from tests.soak.requests import RequestSource
from tests.soak.scheduling import SoakScheduling


class SoakEngine:
    """One seeded soak run (see the module docstring); :meth:`run` returns the counts."""

    def __init__(self, seed: int, cfg: SoakConfig | None = None) -> None:
        self.seed = seed
        self.cfg = cfg = cfg or SoakConfig()
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {}
        self.step_no = 0
        shared = cfg.shared_pool if cfg.shared_pool is not None else self.rng.random() < 0.7
        self.pool_of = tuple(0 if shared else g for g in range(len(GROUPS)))
        num_pools = max(self.pool_of) + 1
        self._count("seeds_one_shared_pool" if shared else "seeds_pool_per_group")
        groups = []
        for g, (f, window) in enumerate(GROUPS):
            wb = None if window is None else math.ceil((window - 1) / (BLOCK * f)) + 1
            groups.append(GroupOffloadConfig(g, BLOCK, BLOCK * f, wb, block_pool=self.pool_of[g]))
        self.sched_cfg = OffloadingSchedulerConfig(tuple(groups), num_workers=cfg.num_ranks, null_block_id=NULL)
        self.gpu = GPUCaches(cfg.num_gpu_blocks, cfg.num_ranks, num_pools)
        policy = self.rng.choice(["lru", "arc", "s3fifo"])
        num_cpu = cfg.num_cpu_blocks or self.rng.choice([20, 32, 48])
        self.manager = CheckedManager(CPUOffloadingManager(num_cpu, policy, enable_events=True), self.counts)
        self.workers: list[FaultyWorker] = []
        for r in range(cfg.num_ranks):
            tensors = [self.gpu.layer_tensors(r, p) for p in self.pool_of]
            table = KVCacheTable.from_tensors(tensors, "flash_attn", shared_tensors=shared)
            if table.block_pools != self.pool_of:
                self._fail(f"KVCacheTable.block_pools {table.block_pools} != {self.pool_of}")
            inner = TransferWorker(table, num_cpu, [f for f, _ in GROUPS], backend="torch")
            w = FaultyWorker(inner, r, random.Random(seed * 1000 + r), cfg.rates, self.counts)
            w.on_garbage_gpu = self._garbage_gpu
            self.workers.append(w)
        self.sched = OffloadingScheduler(self.sched_cfg, self.manager)
        self.blocks = GPUBlocks(self.pool_of, cfg.num_gpu_blocks)
        self.source = RequestSource(self.rng)
        self.seqs: dict[str, Seq] = {}
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.ready: list[Seq] = []
        self.jobs: dict[int, TransferJob] = {}
        self.all_ids: list[str] = []
        self.arrivals = True
        self.scheduling = SoakScheduling(
            self.rng, cfg, self.sched, self.blocks, self.seqs, self.waiting, self.running, self.ready, self._count
        )
        self.checks = EngineChecks(
            self.gpu,
            self.manager,
            self.workers,
            self.sched,
            self.pool_of,
            self.source.parent,
            self.jobs,
            self.blocks.free,
            self.all_ids,
            cfg.num_gpu_blocks,
            self._count,
            self._fail,
        )

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def _fail(self, msg: str) -> NoReturn:
        raise SoakFailure(f"step {self.step_no}: {msg}")

    # ------------------------------------------------------------------ helpers
    def _garbage_gpu(self, rank: int, spec: Any) -> None:
        for g, pool in enumerate(self.pool_of):
            self.gpu.garbage(rank, pool, spec.group_block_ids(g).tolist())

    def _live(self) -> list[Seq]:
        return [s for s in self.seqs.values() if s.status != "done"]

    # ------------------------------------------------------------------ requests
    def _arrive(self) -> None:
        req = self.source.new()
        seq = Seq(req, tables=[[] for _ in GROUPS])
        self.seqs[req.request_id] = seq
        self.all_ids.append(req.request_id)
        self.waiting.append(seq)
        self._count("requests")

    def _end(self, seq: Seq, why: str) -> None:
        """Finish or abort ``seq``, telling the scheduler as vLLM does: also a waiting request it
        never saw, and every other request a second time (both no-ops there)."""
        rid = seq.req.request_id
        st = self.sched.get_request_state(rid)
        if st is None:
            self._count(f"{why}_untracked")  # aborted before the scheduler ever looked it up
        elif st.in_flight:
            self._count(f"{why}_with_jobs_in_flight")
        self.sched.request_finished(seq.req)
        if int(rid[1:]) % 2:
            before = (self.sched.num_in_flight_jobs, self._snapshot())
            self.sched.request_finished(rid)
            if (self.sched.num_in_flight_jobs, self._snapshot()) != before:
                self._fail(f"a second request_finished({rid!r}) changed the scheduler or the manager")
            self._count("finished_twice")
        self.blocks.release(seq)
        for lst in (self.running, self.ready):
            if seq in lst:
                lst.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._count(f"{why}_{seq.status}")
        seq.status = "done"

    def _snapshot(self) -> tuple[list[str], dict[bytes, list[Any]]]:
        """The live requests the scheduler tracks, and the manager's model of the CPU tier."""
        tracked = [s.req.request_id for s in self._live() if self.sched.get_request_state(s.req.request_id)]
        return tracked, {k: list(v) for k, v in self.manager.model.items()}

    def _change_prompt(self, seq: Seq) -> None:
        """The engine re-submits a waiting request (known to the scheduler) with another prompt."""
        self.source.change_prompt(seq.req)
        seq.generated = 0
        self._count("prompt_changed")

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        self.step_no += 1
        for w in self.workers:
            w.tick()
        self._complete([res for w in self.workers for res in w.get_finished()])
        self._random_events()
        new, running, preempted, scheduled = self.scheduling.schedule()
        out = self.sched.build_step(new, running, preempted)
        if out.flush_job_ids:
            self._count("flush_jobs", len(out.flush_job_ids))
            for w in self.workers:
                w.wait(out.flush_job_ids)
        for job in out.load_jobs:
            self._submit(job)
        self.checks.verify_running(scheduled)
        self._compute(scheduled)
        for job in out.store_jobs:
            self._submit(job)
        self._after_compute(scheduled)
        self.sched.take_events()
        self.checks.check_cpu_tier()
        self._count("steps")

    def _complete(self, results: list[Any]) -> None:
        for fj in self.sched.complete_jobs(results):
            job = self.jobs.pop(fj.job_id)
            kind = "store" if fj.is_store else "load"
            self._count(f"{kind}_jobs_{'ok' if fj.success else 'failed'}")
            if fj.is_store:
                continue
            seq = self.seqs.get(fj.req_id)
            if seq is None or seq.status != "loading" or seq.load_job != fj.job_id:
                continue
            seq.load_job = None
            if not fj.success:
                seq.status = "failed_load"
                continue
            self.checks.verify_load(seq, job)
            seq.num_computed = seq.load_end
            seq.status = "ready"
            self.ready.append(seq)

    def _random_events(self) -> None:
        rng, cfg = self.rng, self.cfg
        while self.arrivals and len(self._live()) < cfg.max_live and rng.random() < cfg.p_arrive:
            self._arrive()
        live = self._live()
        if live and rng.random() < cfg.p_abort:
            loading = [s for s in live if s.status == "loading"]
            self._end(rng.choice(loading if loading and rng.random() < 0.5 else live), "abort")
        known = [s for s in self.waiting if self.sched.get_request_state(s.req.request_id) is not None]
        if known and rng.random() < cfg.p_change:
            self._change_prompt(rng.choice(known))
        if rng.random() < cfg.p_reset:
            busy = self.sched.num_in_flight_jobs > 0
            ok = self.sched.reset_cache()
            if ok == busy:
                self._fail(f"reset_cache returned {ok} with {self.sched.num_in_flight_jobs} jobs in flight")
            self._count("reset_done" if ok else "reset_refused_in_flight")
            if ok and self.manager.model:
                self._fail("reset_cache left keys behind")

    # ------------------------------------------------------------------ transfers
    def _submit(self, job: TransferJob) -> None:
        seq = self.seqs[job.req_id]
        spec = job.gpu_spec
        for g in range(len(GROUPS)):
            for b, idx in zip(spec.group_block_ids(g).tolist(), job.block_offsets[g].tolist(), strict=True):
                if b == NULL or seq.status == "done" or idx >= len(seq.tables[g]) or seq.tables[g][idx] != b:
                    self._fail(f"job {job.job_id} of {job.req_id} uses block {b} (group {g}, #{idx}) it does not hold")
                self._count("job_blocks_checked")
        if job.is_store:
            self._count("store_jobs")
        else:
            self._count("load_jobs")
            seq.load_job = job.job_id
            clash = self.checks.queued_blocks(job.job_id) & self.checks.job_blocks(job)
            if clash:
                self._fail(f"load job {job.job_id} writes blocks {sorted(clash)} that queued jobs still use")
        self.jobs[job.job_id] = job
        for w in self.workers:
            w.transfer_async(job.job_id, job.spec)

    # ------------------------------------------------------------------ compute
    def _compute(self, scheduled: list[tuple[Seq, int]]) -> None:
        queued = self.checks.queued_blocks(-1)
        for seq, n in scheduled:
            start, end = seq.num_computed, seq.num_computed + n
            for g, t in enumerate(seq.tables):
                for idx in range(start // BLOCK, -(-end // BLOCK)):
                    b = t[idx]
                    if b == NULL or (self.pool_of[g], b) in queued:
                        self._fail(f"{seq.req.request_id} computes into block {b} (null or used by a queued job)")
                    parent, toks = block_tokens(seq.req, idx, end)
                    self.gpu.write(self.pool_of[g], b, max(start - idx * BLOCK, 0), parent, toks, g)

    def _after_compute(self, scheduled: list[tuple[Seq, int]]) -> None:
        for seq, n in scheduled:
            if seq.status != "running":
                continue
            seq.num_computed += n
            req = seq.req
            if seq.num_computed == req.num_tokens:
                if seq.generated >= req.max_tokens:
                    self._end(seq, "finish")
                    continue
                req.tokens.append(
                    int.from_bytes(chain_hash(req.request_id.encode(), (len(req.tokens),))[:2], "big") % 50
                )
                seq.generated += 1
                self.source.extend_hashes(req)
            freed: list[list[int]] = []
            for (_f, w), t in zip(GROUPS, seq.tables, strict=True):
                out = []
                if w is not None:
                    for idx in range(max(0, (seq.num_computed - w + 1) // BLOCK)):
                        if t[idx] != NULL:
                            out.append(t[idx])
                            t[idx] = NULL
                freed.append(out)
            if any(freed):
                self._count("window_blocks_freed", sum(map(len, freed)))
                st = self.sched.get_request_state(req.request_id)
                if st is not None and st.in_flight:
                    self._count("window_freed_with_jobs_in_flight")
                self.sched.free_blocks(req, freed)
                for g, out in enumerate(freed):
                    self.blocks.give_back(g, out)

    # ------------------------------------------------------------------ checks
    def quiesce(self, max_steps: int = 2000) -> None:
        """Stop arrivals, run until every request ended, drain the workers, check the idle state."""
        self.arrivals = False
        for _ in range(max_steps):
            if not self._live():
                break
            self.step()
        else:
            self._fail("requests did not finish while quiescing")
        for _ in range(10):
            if self.sched.num_in_flight_jobs == 0:
                break
            self._complete([res for w in self.workers for res in w.drain()])
        self.checks.check_idle()
        if self.rng.random() < 0.3:
            if not self.sched.reset_cache() or self.manager.model:
                self._fail("reset_cache refused or incomplete at quiescence")
            self._count("reset_done")
        self.arrivals = True

    def run(self, steps: int) -> dict[str, int]:
        while self.counts.get("steps", 0) < steps:
            self.step()
            if self.step_no % self.cfg.quiesce_every == 0:
                self.quiesce()
        self.quiesce()
        return self.counts
