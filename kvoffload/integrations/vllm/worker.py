"""vLLM's ``OffloadingWorker`` contract backed by kvoffload's :class:`~kvoffload.transfer.worker.TransferWorker`.

vLLM hands the KV cache as canonical int8 tensors of shape ``(num_blocks, page_bytes)`` (pages may
be padded: only the first ``ref.page_size_bytes`` bytes of a row are KV) plus, per KV-cache group,
which tensors its layers use. Each group becomes one group of a
:class:`~kvoffload.kernels.layout.KVCacheTable` (aliased tensors are moved once), so every job is
ONE pack (store) or unpack (load) launch over all layers of all groups.

Failures never reach vLLM as ``success=False`` (vLLM asserts on it):

* a failed store is reported as finished, and its job id is kept for :meth:`take_failed_stores`,
  which :class:`~kvoffload.integrations.vllm.KVOffloadConnector` sends to the scheduler so the
  manager drops the chunks. Whatever the connector, a worker whose own stores are the only writes
  into its pool (``sole_writer``) also remembers the chunks as *not valid* until a later store
  into them succeeds: a load that reads one of them is not run and counts as a failed load;
* a failed load is reported as finished, its job id is kept for :meth:`take_failed_loads` (the
  connector has the scheduler drop its chunks, so vLLM does not try them again and again) and
  its GPU block ids for
  :meth:`take_load_errors`, which :class:`~kvoffload.integrations.vllm.KVOffloadConnector`
  returns from ``get_block_ids_with_load_errors`` so that vLLM (``kv_load_failure_policy=
  "recompute"``) recomputes those blocks. Without that connector nobody collects them, and the
  load is reported as failed instead (vLLM stops on its assertion rather than run on wrong KV).

Under vLLM's replicated layout every worker maps the same slot of each row and only rank 0 is
handed stores (vLLM's connector worker elects it and acknowledges the store jobs on the other
ranks without running them). Rank 0 is then the pool's sole writer and checks its chunks; the
other ranks cannot know which of rank 0's stores failed, so they do not check: a failed store
reaches them through the scheduler, which drops its chunks (``KVOffloadConnector``), and without
that connector rank 0's own check fails the load (vLLM stops on its assertion).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

from kvoffload.checks import check_bool
from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.kernels.layout import GenericLayout, KVCacheTable
from kvoffload.transfer.worker import TransferWorker

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadWorker", "table_from_canonical"]


def table_from_canonical(kv_caches: Any) -> KVCacheTable:
    """A :class:`KVCacheTable` from vLLM's ``CanonicalKVCaches`` (one table group per KV-cache group)."""
    groups = []
    for refs in kv_caches.group_data_refs:
        groups.append([kv_caches.tensors[r.tensor_idx].tensor[:, : r.page_size_bytes] for r in refs])
    # vLLM's KV-cache groups allocate from one block pool: a tensor may back layers of several groups
    return KVCacheTable.from_tensors(groups, GenericLayout(0), shared_tensors=True)


def _gpu_spec(spec: Any) -> GPULoadStoreSpec:
    ids = np.asarray(spec.block_ids, dtype=np.int64)
    sizes = getattr(spec, "group_sizes", None)
    indices = getattr(spec, "block_indices", None)
    return GPULoadStoreSpec(ids, None if sizes is None else list(sizes), None if indices is None else list(indices))


class KVOffloadWorker(OffloadingWorker):
    """Moves vLLM's offloading jobs with kvoffload's kernels (one launch per job).

    Args:
        kv_caches: vLLM's ``CanonicalKVCaches``.
        num_cpu_blocks: host pool chunks (same number as the scheduler-side manager's).
        blocks_per_chunk: GPU blocks per chunk.
        backend: kvoffload kernel backend (``triton``, ``torch``, ``page_loop``, ``module:Class``) or
            None for the device's default.
        region: a :class:`~kvoffload.integrations.vllm.shared_region.WorkerRegion`: the host pool
            lives in vLLM's shared offload region (``secondary_tiers``, or one copy for every
            worker under a replicated layout); the region is released at :meth:`shutdown`.
        sole_writer: whether this worker's own stores are the only writes into its pool: then it
            tracks which chunks hold a complete, successful store and refuses loads of the others.
            Default: True for a private pool, False with a region (the scheduler's tiers write
            promotions into it; other workers may be the ones storing). Where it does not check,
            failed stores are dropped by the scheduler through
            :class:`~kvoffload.integrations.vllm.KVOffloadConnector`.
        numa: NUMA placement of the pool's pages (:class:`~kvoffload.transfer.HostPool`'s ``numa``).
    """

    def __init__(
        self,
        kv_caches: Any,
        num_cpu_blocks: int,
        blocks_per_chunk: int,
        backend: str | None = None,
        region: Any = None,
        sole_writer: bool | None = None,
        numa: bool | int | None = None,
    ) -> None:
        check = region is None if sole_writer is None else check_bool(sole_writer, "sole_writer")
        host: dict[str, Any] = {}
        if region is not None:
            host = {"host_memory": region.memory, "host_offset": region.offset, "slot_stride": region.stride}
        self.region = region
        self.transfer_worker = TransferWorker(
            table_from_canonical(kv_caches), num_cpu_blocks, blocks_per_chunk, backend=backend, numa=numa, **host
        )
        #: per chunk: its bytes are a complete, successful store (all True, unchecked, unless sole_writer)
        self.valid = np.full(num_cpu_blocks, not check, dtype=bool)
        self._check_valid = check
        #: set by KVOffloadConnector: it collects failed loads through take_load_errors()
        self.report_load_errors = False
        self._jobs: dict[int, tuple[bool, np.ndarray, GPULoadStoreSpec]] = {}  # job -> (store, cpu ids, gpu spec)
        self._failed_now: list[TransferResult] = []
        self._load_errors: set[int] = set()
        self._failed_stores: set[int] = set()
        self._failed_loads: set[int] = set()
        #: jobs reported so far, by outcome: "stores", "loads", "failed_stores", "failed_loads";
        #: "expedited_loads": loads submitted as expedited
        self.counts = dict.fromkeys(("stores", "loads", "failed_stores", "failed_loads", "expedited_loads"), 0)

    # ------------------------------------------------------------------ submit
    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._submit(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False) -> bool:
        """A CPU -> GPU load; ``expedited`` (vLLM 0.33: a load the engine waits for within the step)
        runs on the transfer worker's second stream, ahead of the transfers queued before it."""
        if expedited:
            self.counts["expedited_loads"] += 1
        return self._submit(job_id, dst_spec, src_spec, store=False, expedited=bool(expedited))

    def _submit(self, job_id: int, gpu: Any, cpu: Any, store: bool, expedited: bool = False) -> bool:
        try:
            gspec, cspec = _gpu_spec(gpu), CPULoadStoreSpec(np.asarray(cpu.block_ids, dtype=np.int64))
        except Exception:
            logger.exception("offloading job %d: bad specs", job_id)
            self._fail(job_id, gpu, store)
            return True
        cpu_ids = cspec.block_ids
        self._jobs[job_id] = (store, cpu_ids, gspec)
        try:
            if not self._check_valid:
                pass
            elif store:
                self.valid[cpu_ids] = False  # being overwritten: not loadable until this store succeeds
            elif not self.valid[cpu_ids].all():
                logger.error("offloading job %d: load from chunks whose store failed; not loaded", job_id)
                self._fail(job_id, gpu, store)
                return True
        except IndexError:  # a chunk past the pool (a manager sized apart from it): the job fails, vLLM goes on
            logger.exception("offloading job %d: chunk ids beyond the pool's %d", job_id, len(self.valid))
            self._fail(job_id, gpu, store)
            return True
        pair = (gspec, cspec) if store else (cspec, gspec)
        try:
            accepted = self.transfer_worker.transfer_async(job_id, pair, expedited=expedited)
        except Exception:
            logger.exception("offloading job %d rejected", job_id)
            accepted = False
        if not accepted:
            self._fail(job_id, gpu, store)
        return True

    def _fail(self, job_id: int, gpu: Any, store: bool) -> None:
        """A job that failed before it was handed over: reported at the next :meth:`get_finished`."""
        self._jobs.pop(job_id, None)
        self._failed_now.append(self._failed(job_id, gpu, store))

    def _failed(self, job_id: int, gpu: Any, store: bool) -> TransferResult:
        """Record a failed job (``gpu``: its GPU spec); the result vLLM is given for it."""
        self.counts["failed_stores" if store else "failed_loads"] += 1
        if store:
            self._failed_stores.add(job_id)
        else:
            self._failed_loads.add(job_id)
            self._load_errors.update(int(b) for b in np.asarray(gpu.block_ids).tolist())
        return TransferResult(job_id=job_id, success=store or self.report_load_errors)

    # ------------------------------------------------------------------ complete
    def get_finished(self) -> list[TransferResult]:
        out, self._failed_now = self._failed_now, []
        for r in self.transfer_worker.get_finished():
            store, cpu_ids, gspec = self._jobs.pop(r.job_id)
            if r.success:
                self.counts["stores" if store else "loads"] += 1
                if store:
                    self.valid[cpu_ids] = True
                out.append(TransferResult(r.job_id, True, r.transfer_size, r.transfer_time))
                continue
            logger.error("offloading job %d (%s) failed", r.job_id, "store" if store else "load")
            if not store and self._check_valid:
                self.valid[cpu_ids] = False  # not read back once: do not trust it again
            out.append(self._failed(r.job_id, gspec, store))
        return out

    def take_load_errors(self) -> set[int]:
        """GPU block ids of the loads that failed since the last call (vLLM recomputes them)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def take_failed_stores(self) -> set[int]:
        """Ids of the store jobs that failed since the last call (reported to vLLM as finished)."""
        out, self._failed_stores = self._failed_stores, set()
        return out

    def take_failed_loads(self) -> set[int]:
        """Ids of the load jobs that failed since the last call (their chunks should be dropped)."""
        out, self._failed_loads = self._failed_loads, set()
        return out

    def wait(self, job_ids: set[int]) -> None:
        self.transfer_worker.wait([j for j in job_ids if j in self._jobs])

    def shutdown(self) -> None:
        self.transfer_worker.shutdown()
        if self.region is not None:
            self.region.close()
