"""The transfer worker: moves offloaded blocks between the GPU KV cache and the host pool.

One :class:`TransferWorker` per engine worker (GPU). The scheduler side hands it jobs as spec
pairs; each job becomes ONE launch (store, GPU -> CPU, or load, CPU -> GPU) covering every layer
of every KV-cache group of the job. Per job the host does only what changes: one check of the
ids (:class:`~kvoffload.transfer.job_mapping.JobMapper`), the job's rows written into a reused
pinned job table, one launch of the kernel the backend bound to the pool at construction
(:meth:`KernelBackend.bind <kvoffload.kernels.backend.KernelBackend.bind>`), two events. A
backend without a bound kernel, or a job the per-GPU config sends to another data path, goes
through ``backend.pack``/``unpack`` (:class:`~kvoffload.kernels.paths.DataPath`). With
``merge=True`` the jobs of one direction submitted until the next completion poll share one
launch.

How a job maps blocks to host bytes is documented in :mod:`kvoffload.transfer.job_mapping`::

    GPU block j of group g  <->  host pool bytes
        slot * slot_bytes + ((skip_g + j) % factor_g) * record_bytes_g  (record_bytes_g bytes)
    slot = cpu_ids_g[(skip_g + j) // factor_g],  skip_g = block_indices[g] % factor_g,
    group g uses ceil((skip_g + group_sizes[g]) / factor_g) slots of the CPU spec (0 if empty).

Ordering and completion on CUDA:

* every job runs on the worker's own high-priority CUDA stream, after what ``transfer_async``'s
  ``after`` names (events or streams of the engine), by default the work already enqueued on the
  calling thread's *current* stream at submit time (an event recorded there, waited on by the
  worker stream; no host sync). Stores therefore read the KV cache only once the forward pass that
  wrote it is done; loads overwrite GPU blocks only once earlier kernels that might still read them
  are done. Submitting while the current stream captures a CUDA graph raises StreamCaptureError.
* jobs run in submission order (one stream; merged jobs too: a job of the other direction, or
  one naming a destination a merged job names, starts a new launch), so a load never overtakes
  an earlier store --
  except **expedited** loads (``transfer_async(..., expedited=True)``, vLLM 0.33's loads that the
  engine waits for within the step), which run on a second stream of the same priority and so do
  not queue behind the transfers submitted before them. The caller guarantees what vLLM's
  scheduler does: an expedited load reads host slots whose stores have completed and writes GPU
  blocks that no unfinished store reads.
* completion is an event per launch, polled with ``event.query()`` in :meth:`get_finished`; each
  job of a launch is reported on its own.
* **the engine must not read GPU blocks written by a load (nor reuse GPU blocks read by a store)
  before the job is reported by** :meth:`get_finished` **or waited for with** :meth:`wait`.

Host pool pinning is off the start-up path: the worker is built once the pool's first chunk is
page-locked, and a background thread registers the rest in ascending slot order
(:class:`~kvoffload.transfer.host_pool.HostPool`, ``background=True``). Until it is done, a job
naming a slot not registered yet blocks in :meth:`transfer_async` until its slots are (vLLM 0.33
has no way to be told that a connector is not ready yet, so the worker does not report that); once
all are, a job pays one flag test for it. A failure on that thread is raised as
:class:`~kvoffload.errors.TransferError` by the next :meth:`transfer_async` (the job is not
accepted) or :meth:`check_pinning`, after which the pool's registrations are undone.

Without CUDA (KV cache on CPU tensors) a job runs synchronously inside :meth:`transfer_async`
and is reported by the next :meth:`get_finished`.

Not thread-safe: call it from the engine worker's loop.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from kvoffload.checks import check_bool, check_int
from kvoffload.core.base import LoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, TransferError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.config import launch_config
from kvoffload.kernels.device import check_not_capturing
from kvoffload.kernels.job import CopyJob
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.paths import DataPath
from kvoffload.transfer import worker_args
from kvoffload.transfer.cuda_jobs import CudaJobs
from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.job_batch import JobBatch
from kvoffload.transfer.job_mapping import GroupGeometry, JobArrays, JobMapper
from kvoffload.transfer.job_tables import JobTable, JobTables
from kvoffload.transfer.result import LOAD, STORE, JobEntry, TransferResult, launch_results

logger = logging.getLogger(__name__)

__all__ = ["TransferResult", "TransferWorker", "STORE", "LOAD"]


class TransferWorker:
    """Moves jobs between the KV cache described by ``table`` and a pinned host pool.

    Args:
        table: the engine's KV cache, from :meth:`KVCacheTable.from_tensors`.
        num_cpu_blocks: host pool slots (offloaded blocks), ``>= 1``.
        block_size_factors: per group, GPU blocks per offloaded block -- it must equal the
            group's offloaded block size / GPU block size (in tokens). One int for all groups, or
            one entry per group: an int, or an object with ``gpu_block_size`` and
            ``offloaded_block_size`` (e.g. the scheduler's ``GroupOffloadConfig``) from which the
            factor is computed and checked here (whole quotient; the GPU block size must match
            the tensors' where the layout tells it) -- not at the first transfer.
        backend: kernel backend name (``"triton"``, ``"torch"``, ``"page_loop"``, ``"module:Class"``),
            an instance, or None (``KVOFFLOAD_BACKEND``, else the device's default).
        max_programs: cap on the kernel's concurrent programs (SM budget) for a backend chosen by
            name whose constructor takes ``num_programs`` (``triton``); ignored by backends that
            launch no programs (``torch``, ``page_loop``); None keeps the backend's default. An error
            together with a backend instance (configure the instance instead).
        path: data path of every job: ``"auto"`` (per device and job size from the per-GPU
            config), ``"direct"`` (the kernel reads/writes the pinned pool), ``"staged"`` (copy
            engines + a GPU staging ring) or ``"dma"`` (copy engines only: no SM used, for
            engines that cannot spare any). See :mod:`kvoffload.kernels.paths`.
        staging_bytes: size of the GPU staging ring (default: the per-GPU config).
        merge: jobs of one direction submitted one after another go out in ONE launch, at the
            next :meth:`get_finished` (the engine's completion poll), :meth:`wait`,
            :meth:`flush`, :meth:`shutdown` or job of the other direction, whichever comes
            first; each job is still reported on its own. Saves host time per job; a job starts
            at that point instead of at its submit. Expedited loads are never merged.
        host_memory: put the host pool in this shared mapping (see :class:`HostPool`'s
            ``memory``), e.g. vLLM's shared offload region that the scheduler process maps too.
        host_offset: where in ``host_memory`` the pool starts, in bytes.
        slot_stride: bytes from one host slot to the next (default: the slot size); a larger
            stride leaves room between slots (another worker's records in a shared region).
        numa: NUMA placement of the host pool's pages (:class:`HostPool`'s ``numa``): by default on
            the node of the table's GPU where the machine says which; False turns it off.

    At construction the backend builds its device tables and compiles both directions
    (:meth:`KernelBackend.prepare`), so :meth:`transfer_async` neither compiles nor waits.

    Attributes:
        host_pool: the :class:`HostPool`, ``num_cpu_blocks`` slots of
            ``slot_bytes = max_g(factor_g * record_bytes_g)`` bytes (sized for the largest group).
        backend: the :class:`KernelBackend` in use.
        kernel: the backend's kernel bound to the pool (:meth:`KernelBackend.bind`), or None:
            every job then goes through ``backend.pack``/``unpack``.
        paths: the :class:`~kvoffload.kernels.paths.DataPath` choosing and running each job's path.
        factors: ``int64[G]`` block size factor per group.

    Raises:
        InvalidTypeError / InvalidArgumentError: bad arguments (checked before allocating).
        BackendUnavailableError: the backend cannot run on the table's device.
    """

    def __init__(
        self,
        table: KVCacheTable,
        num_cpu_blocks: int,
        block_size_factors: int | Sequence[Any] = 1,
        backend: str | KernelBackend | None = None,
        max_programs: int | None = None,
        path: str = "auto",
        staging_bytes: int | None = None,
        host_memory: Any = None,
        host_offset: int = 0,
        slot_stride: int | None = None,
        merge: bool = False,
        numa: bool | int | None = None,
    ) -> None:
        if not isinstance(table, KVCacheTable):
            raise InvalidTypeError(f"table must be a KVCacheTable, got {type(table).__name__}")
        num_slots = check_int(num_cpu_blocks, "num_cpu_blocks", 1)
        if len(table.groups) == 0:
            raise InvalidArgumentError("table has no KV-cache group")
        factors = worker_args.block_size_factors(table, block_size_factors)
        self.merge = check_bool(merge, "merge")
        if max_programs is not None:
            max_programs = check_int(max_programs, "max_programs", 1)
        config = launch_config(table.device)
        if staging_bytes is not None:
            config = config.merged({"staging_bytes": check_int(staging_bytes, "staging_bytes", 1)}, "staging_bytes")

        record_bytes = np.array([grp.record_bytes for grp in table.groups], dtype=np.int64)
        self.factors = np.array(factors, dtype=np.int64)
        slot_bytes = int((record_bytes * self.factors).max())
        if slot_bytes <= 0:
            raise InvalidArgumentError("table has no pages in any group: nothing to offload")
        used_bytes = slot_bytes  # what jobs touch of each slot
        if slot_stride is not None:
            if check_int(slot_stride, "slot_stride", 1) < slot_bytes:
                raise InvalidArgumentError(f"slot_stride must be >= the slot size {slot_bytes}, got {slot_stride}")
            slot_bytes = slot_stride

        self.backend = worker_args.resolve_backend(backend, table.device, max_programs)
        self.table = table
        self.device: torch.device = table.device
        self._cuda = self.device.type == "cuda"
        self.geometry = GroupGeometry(
            record_bytes=record_bytes,
            num_gpu_blocks=np.array([grp.num_blocks for grp in table.groups], dtype=np.int64),
            factors=self.factors,
            slot_bytes=slot_bytes,
            num_slots=num_slots,
        )
        self.paths = DataPath(self.backend, table, path, config=config)
        self.host_pool = HostPool(
            num_slots,
            slot_bytes,
            device=self.device,
            memory=host_memory,
            offset=host_offset,
            used_bytes=used_bytes,
            background=True,
            numa=numa,
        )
        self.paths.split_host_copies(self.host_pool.copy_cuts)  # one copy never spans two registrations
        self._pinning = not self.host_pool.pinning_done  # slots still being page-locked: jobs check theirs
        self._tables = JobTables(pinned=self._cuda and self.host_pool.pinned)
        self._jobs = CudaJobs(self.device, self._tables.give) if self._cuda else None
        # every host offset is slot * slot_bytes + k * record_bytes_g: one alignment for all jobs
        host_bits = self.host_pool.buffer.data_ptr() | slot_bytes | int(np.bitwise_or.reduce(record_bytes))
        stream_ctx = torch.cuda.stream(self._jobs.stream) if self._jobs is not None else contextlib.nullcontext()
        with stream_ctx:
            self.backend.prepare(table, host_bits & -host_bits)  # device tables + both directions compiled
            # the kernel bound to the pool: a job costs its table and one launch (the kernels need a pinned pool)
            self.kernel = (
                self.backend.bind(table, self.host_pool.buffer, host_bits & -host_bits)
                if self.host_pool.pinned or not self._cuda
                else None
            )
        self._mapper = JobMapper(self.geometry, self.kernel.unit if self.kernel is not None else 1)
        self._direct_below = {store: self.paths.direct_below(store) for store in (True, False)}
        self._batch: JobBatch | None = None
        self._unreported: set[int] = set()  # accepted, result not returned by get_finished yet
        self._finished: list[TransferResult] = []
        self._closed = False
        logger.info(
            "transfer worker: %d slots x %d bytes (%s), backend %s (%s), factors %s, device %s, data path %s%s",
            num_slots,
            slot_bytes,
            "pinned" if self.host_pool.pinned else "pageable",
            type(self.backend).__name__,
            f"bound kernel, {self.kernel.entry} entry" if self.kernel is not None else "pack/unpack",
            factors,
            self.device,
            self.paths.describe(),
            ", jobs of a direction merged until the next poll" if self.merge else "",
        )

    # ------------------------------------------------------------------ submit
    def transfer_async(
        self, job_id: int, spec: tuple[LoadStoreSpec, LoadStoreSpec], *, after: Any = None, expedited: bool = False
    ) -> bool:
        """Submit one job. Never waits for the device.

        Args:
            job_id: an int, unique among the jobs not yet reported by :meth:`get_finished`.
            spec: ``(GPULoadStoreSpec, CPULoadStoreSpec)`` stores GPU -> CPU;
                ``(CPULoadStoreSpec, GPULoadStoreSpec)`` loads CPU -> GPU.
            after: what the job must wait for on the GPU before it touches the KV cache: a
                ``torch.cuda.Event`` (e.g. recorded by the engine after the forward pass that
                wrote the KV a store reads), a ``torch.cuda.Stream`` (everything enqueued on it so
                far), or a sequence of them. None (default): the calling thread's current stream
                of the cache's device. Must be None without CUDA.
            expedited: a load that must not queue behind earlier transfers (see the module
                docstring); it runs on the worker's second stream, and is never merged. Only for
                loads.

        Returns:
            True: the job was accepted and exactly one :class:`TransferResult` will be reported
            for it (``success=False`` if the backend raised or CUDA failed). False: the worker is
            shut down; nothing was done and no result will come.

        Raises:
            InvalidTypeError / InvalidArgumentError: bad id, specs (wrong pair of types,
                lengths that disagree, slot or block ids out of range, duplicate destinations)
                or ``after``. Raised before anything is enqueued.
            StreamCaptureError: called while the current CUDA stream captures a CUDA graph.
            TransferError: page-locking the host pool in the background failed (the job is not
                accepted; see :meth:`check_pinning`).
        """
        if self._closed:
            logger.error("transfer_async(job %r) after shutdown: not submitted", job_id)
            return False
        check_not_capturing(self.device, "TransferWorker.transfer_async")
        producers = [] if after is None else worker_args.producer_events(after, self._cuda)
        if expedited is not False:
            expedited = check_bool(expedited, "expedited")
        jid, gpu, cpu, store = worker_args.job_spec(job_id, spec, self._unreported)
        if expedited and store:
            raise InvalidArgumentError(f"job {jid}: only loads can be expedited, got a store")
        kind = STORE if store else LOAD
        job = self._mapper.map(gpu, cpu, store)
        if self._pinning:
            self._await_slots(cpu.block_ids)
        self._unreported.add(jid)
        nbytes = job.nbytes
        if self.kernel is None or nbytes == 0 or nbytes >= self._direct_below[store]:
            # no bound kernel, nothing to move, or a job for the configured path: through DataPath
            self._submit_arrays(jid, kind, self._mapper.to_arrays(job), store, producers, expedited)
            return True
        entry = (jid, kind, nbytes)
        if not self.merge or expedited:
            if self._batch is not None and not expedited:
                self.flush()
            n = job.ids.size
            table = self._tables.take(n)
            self._mapper.write(table.rows[:n], [job])
            self._submit_table([entry], table, n, store, producers, expedited)
            return True
        batch = self._batch
        if batch is not None and batch.store != store:
            self.flush()
            batch = None
        if batch is None:
            batch = self._batch = JobBatch(store)
        batch.add(entry, job, producers, self.device if self._cuda else None)
        return True

    def _await_slots(self, slots: np.ndarray) -> None:
        """While the pool is page-locked in the background: block until ``slots`` (a checked job's
        host slots) are registered. Once every slot is, jobs skip this.

        Raises:
            TransferError: background pinning failed (see :meth:`check_pinning`).
        """
        pool = self.host_pool
        try:
            ready = pool.check_pinning()
            need = int(slots.max()) + 1 if slots.size else 0
            if need > ready:
                t0 = time.perf_counter()
                pool.wait_rows(need)
                logger.info(
                    "transfer worker: a job waited %.3f s for host slots < %d to be page-locked",
                    time.perf_counter() - t0,
                    need,
                )
        except TransferError:
            self._pinning_failed()
            raise
        if pool.pinning_done:
            self._pinning = False

    def _pinning_failed(self) -> None:
        """Background pinning failed: launch what was accepted, wait for it, then undo every
        registration (nothing runs on the pool any more)."""
        self.flush()
        if self._jobs is not None:
            self._jobs.drain()
        self.host_pool.unpin()

    def check_pinning(self) -> int:
        """Host slots page-locked so far (``num_cpu_blocks`` once all are: jobs then never wait).

        Raises:
            TransferError: background pinning failed; the pool's registrations are undone (after
                the jobs in flight) and every later job raises it too.
        """
        try:
            return self.host_pool.check_pinning()
        except TransferError:
            self._pinning_failed()
            raise

    def flush(self) -> None:
        """Launch the merged jobs now (``merge=True``) instead of at the next :meth:`get_finished`,
        :meth:`wait`, :meth:`shutdown` or job of the other direction. No-op when none wait."""
        batch, self._batch = self._batch, None
        while batch is not None:
            # jobs that write the same destination cannot share a launch: split before the second
            k = self._mapper.conflict([m.dst for m in batch.mapped], batch.store)
            rest = batch.split(k) if k is not None else None
            table = self._tables.take(batch.rows)
            self._mapper.write(table.rows[: batch.rows], batch.mapped)
            self._submit_table(batch.jobs, table, batch.rows, batch.store, batch.producers, False)
            batch = rest

    def _submit_table(
        self, jobs: list[JobEntry], table: JobTable, n: int, store: bool, producers: list[Any], expedited: bool
    ) -> None:
        """One launch of the bound kernel over ``table``'s first ``n`` rows, for ``jobs``."""
        assert self.kernel is not None
        launch = partial(self.kernel.launch, table.rows, table.address, n, store)
        self._submit(jobs, launch, producers, expedited, table=table)

    def _submit_arrays(
        self, jid: int, kind: tuple[str, str], arrays: JobArrays, store: bool, producers: list[Any], expedited: bool
    ) -> None:
        """One job through :class:`DataPath` (a backend without a bound kernel, or the job's path
        is not the direct one)."""
        if len(arrays) == 0:
            self._finished.append(TransferResult(jid, True, 0, 0.0, kind))
            return
        if not expedited:
            self.flush()
        launch = partial(self._launch_arrays, arrays, store)
        self._submit([(jid, kind, arrays.transfer_size)], launch, producers, expedited, keep=arrays)

    def _submit(
        self,
        jobs: list[JobEntry],
        launch: Callable[[Any], None],
        producers: list[Any],
        expedited: bool,
        table: JobTable | None = None,
        keep: Any = None,
    ) -> None:
        """``launch(stream)`` for ``jobs``: on CUDA enqueued (reported when done), else run now."""
        if self._jobs is not None:
            self._finished += self._jobs.submit(jobs, producers, expedited, launch, table, keep)
            return
        t0 = time.perf_counter()
        try:
            launch(None)
            ok = True
        except Exception:
            logger.exception("transfer jobs %s failed", [j[0] for j in jobs])
            ok = False
        finally:
            if table is not None:
                self._tables.give(table)
        self._finished += launch_results(jobs, ok, time.perf_counter() - t0)

    def _launch_arrays(self, arrays: JobArrays, store: bool, stream: Any) -> None:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if self._cuda and not self.host_pool.pinned:  # the kernels cannot reach it: the checked entry refuses
                fn = self.paths.pack if store else self.paths.unpack
                fn(self.host_pool.buffer, arrays.block_ids, arrays.group_ids, arrays.host_offsets)
                return
            # the mapper checked the job (this worker's one check): the kernels take it as it is
            job = CopyJob(
                self.table,
                self.host_pool.buffer,
                arrays.block_ids,
                arrays.group_ids.astype(np.int64),
                arrays.host_offsets,
                arrays.record_bytes,
                arrays.transfer_size,
            )
            self.paths.run(job, store)

    def get_finished(self) -> list[TransferResult]:
        """Results of the jobs that finished since the last call, each job reported exactly once.

        Never blocks: CUDA jobs are polled with ``event.query()``.
        """
        self.flush()
        out, self._finished = self._finished, []
        if self._jobs is not None:
            out += self._jobs.finished()
        for r in out:
            self._unreported.discard(r.job_id)
        return out

    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs have finished (their results still come from :meth:`get_finished`).

        Ids that are not in flight (never submitted, already finished, or already reported) are
        ignored, so the caller may wait on jobs it has not tracked precisely.

        Raises:
            InvalidTypeError: ``job_ids`` is not a collection of ints.
        """
        if isinstance(job_ids, (str, bytes)) or not isinstance(job_ids, Collection):
            raise InvalidTypeError(f"job_ids must be a collection of ints, got {type(job_ids).__name__}")
        ids = [check_int(j, f"job_ids[{i}]") for i, j in enumerate(job_ids)]
        self.flush()
        if self._jobs is not None:
            self._jobs.wait(ids)

    @property
    def num_in_flight(self) -> int:
        """Jobs submitted and not yet reported (including finished-but-unreported ones)."""
        return len(self._unreported)

    def shutdown(self) -> None:
        """Wait for every in-flight job, then free the host pool. Idempotent.

        Results not collected yet stay available to :meth:`get_finished`; later
        :meth:`transfer_async` calls return False.
        """
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._jobs is not None:
            self._jobs.drain()
        self.host_pool.shutdown()
