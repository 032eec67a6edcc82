"""The offloading scheduler: request lifecycle, lookups, load/store jobs, completion (docs/contract.md §6).

Engine-agnostic: it sees duck-typed requests and GPU block ids, asks an
:class:`~kvoffload.core.base.OffloadingManager` where blocks live, and emits
:class:`~kvoffload.engine.scheduler.jobs.TransferJob` s for the engine's transfer workers. It never
moves bytes.

An engine drives it like this (one engine step)::

    # admission of a waiting request
    n, load_async = sched.get_num_new_matched_tokens(req, num_gpu_computed)
    if n is None: skip the request this step (retry later)
    allocate GPU blocks for num_gpu_computed + n (+ what it computes)
    sched.update_state_after_alloc(req, block_ids_per_group, n)   # n > 0: the load job is built
    # request waits (does not compute) until its load job finishes

    out = sched.build_step(new_requests, running_requests, preempted_req_ids)
    worker.wait(out.flush_job_ids); submit out.load_jobs; compute; submit out.store_jobs
    finished = sched.complete_jobs(worker.get_finished())   # FinishedJob list
    sched.request_finished(req) when a request ends or is aborted (its GPU blocks may be freed
    at once; a request the scheduler never saw, or one finished already, is a no-op)

Deferral. A request is deferred when a key it would load is still being stored, or is being
loaded by another request, and only then: blocks already in the GPU cache never defer anyone,
and a deferred request registers nothing (docs/contract.md §6, "Deferral and the load convoy").

Stores. When an offloaded block of a request fills up (computed tokens, within the hashed tokens
and within ``max_offload_tokens``), :meth:`build_step` calls ``prepare_store`` for all the
request's newly full blocks of all groups (None: retry next step; an empty ``keys_to_store``:
advance) and emits one store job with exactly ``keys_to_store``; its completion calls
``complete_store`` with exactly those keys. Storing starts at the first offloaded block that was
not in the GPU cache when the request was (re)admitted, and loaded blocks are never re-stored.

Flushes. A finished or preempted request gives its GPU blocks back at once (no delayed free),
and so does a running request whose sliding-window blocks leave the window
(:meth:`free_blocks`). Blocks that an in-flight job of such a request reads or writes are
remembered; when the engine hands one of them to another request for writing (a new block of a
running request, a block past the GPU-computed prefix of a new request, or a load target), the
job is returned in ``flush_job_ids`` and the engine waits for it before writing. Blocks are
physical: groups with the same ``GroupOffloadConfig.block_pool`` (by default all of them, as
with vLLM's hybrid allocator) name the same memory, so a store that read block 3 for group 0 is
flushed when block 3 is handed to group 1.

Blocks a request does not hold (the configured ``null_block_id`` in a block table, blocks given
to :meth:`free_blocks`) are never stored from nor loaded into: see :meth:`free_blocks`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from kvoffload.core.base import OffloadingEvent
from kvoffload.engine.scheduler.admission import AdmissionLookup
from kvoffload.engine.scheduler.building import build_load_job, build_store_job, load_targets
from kvoffload.engine.scheduler.completion import JobCompletion, unmark_loading
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.engine.scheduler.deferral import DeferredLookups
from kvoffload.engine.scheduler.flush import FlushTracker
from kvoffload.engine.scheduler.jobs import FinishedJob, JobRecord, ScheduledRequest, SchedulerStepOutput, TransferJob
from kvoffload.engine.scheduler.state import FREED, RequestOffloadState
from kvoffload.engine.scheduler.validation import (
    check_block_table,
    check_count,
    check_finished,
    check_preempted,
    check_request,
    check_scheduled,
)
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["OffloadingScheduler"]


class OffloadingScheduler:
    """Scheduler side of KV offloading for one engine (see the module docstring).

    Args:
        config: groups, hash block size, number of workers.
        manager: an :class:`~kvoffload.core.base.OffloadingManager` (any object with its
            methods; ``lookup_batch`` is used when present).
    """

    def __init__(self, config: OffloadingSchedulerConfig, manager: Any) -> None:
        if not isinstance(config, OffloadingSchedulerConfig):
            raise InvalidTypeError(f"config must be an OffloadingSchedulerConfig, got {type(config).__name__}")
        for name in ("lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store"):
            if not callable(getattr(manager, name, None)):
                raise InvalidTypeError(f"manager must have a {name}() method ({type(manager).__name__} has none)")
        self.config = config
        self.manager = manager
        self._groups = config.groups
        self._suffixes = tuple(g.group_idx.to_bytes(4, "big") for g in config.groups)
        self._states: dict[str, RequestOffloadState] = {}
        self._jobs: dict[int, JobRecord] = {}
        self._next_job_id = 0
        self._pending_loads: list[TransferJob] = []
        self._loading_keys: dict[bytes, int] = {}
        self._flush = FlushTracker(config.pool_of_group)
        # the optional per-step hooks of a manager with tiers (TieredManager)
        self._end_step = getattr(manager, "end_step", None)
        take_resolved = getattr(manager, "take_resolved", None)
        self._deferred = DeferredLookups(take_resolved) if take_resolved is not None else None
        self._completion = JobCompletion(
            config.num_workers, manager, self._jobs, self._loading_keys, self._flush, self._states, self._deferred
        )
        self._admission = AdmissionLookup(config, self._state, self._loading_keys, self._deferred)

    # ------------------------------------------------------------------ state
    def _state(self, request: Any) -> RequestOffloadState:
        rid = request.request_id
        st = self._states.get(rid)
        if st is None:
            if not isinstance(rid, str):
                raise InvalidTypeError(f"request.request_id must be a str, got {type(rid).__name__}")
            st = RequestOffloadState(request, self.config, self._suffixes)
            self._states[rid] = st
        elif st.request is not request:
            st.request = request
        return st

    def get_request_state(self, req_id: str) -> RequestOffloadState | None:
        """The scheduler's state of a request (None once finished); for engines and tests."""
        return self._states.get(req_id)

    @property
    def num_in_flight_jobs(self) -> int:
        return len(self._jobs)

    # ------------------------------------------------------------------ admission
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many tokens beyond ``num_computed_tokens`` can be loaded from the CPU.

        Args:
            request: the request (duck-typed).
            num_computed_tokens: tokens the engine already holds in its GPU cache for this
                request (a multiple of every group's GPU block size).

        The keys follow ``request.block_hashes`` as they are now: an engine may call again for
        the same request id with other hashes (a changed prompt, a resumed session) and gets
        the answer for those (a running request's hashes may only grow).

        Returns:
            ``(n, True)`` when ``n > 0`` tokens can be loaded asynchronously; ``(0, False)``
            when nothing is worth loading (less than one offloaded block of the largest group);
            ``(None, False)`` to defer the request: some key is still being stored, or a block
            it would load is being loaded by another request (see the module docstring).
            Touches the request's keys (sliding-window groups: the keys from
            ``max(0, hit_blocks - window)`` on) unless deferred.
        """
        return self._admission.get_num_new_matched_tokens(request, num_computed_tokens, self.manager)

    def update_state_after_alloc(
        self, request: Any, block_ids_per_group: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """Record the request's GPU blocks; with ``num_external_tokens > 0`` build its load job.

        Args:
            request: the request just given GPU blocks.
            block_ids_per_group: per group, the request's whole GPU block table (computed prefix
                blocks included).
            num_external_tokens: tokens to load, exactly the ``n`` the last
                :meth:`get_num_new_matched_tokens` returned for this request (or 0).

        The load job pins its blocks (``prepare_load``) and is returned by the next
        :meth:`build_step`. The loaded blocks are never stored again by this request.
        """
        check_request(request, "request")
        n_ext = check_count(num_external_tokens, "num_external_tokens")
        tables = check_block_table(block_ids_per_group, len(self._groups), "block_ids_per_group")
        st = self._state(request)
        st.mark_null(tables)
        if n_ext == 0:
            st.set_block_ids(tables)
            st.offer = None
            return
        offer = st.offer
        if offer is None or offer.num_new_tokens != n_ext:
            raise InvalidArgumentError(
                f"num_external_tokens ({n_ext}) must be what get_num_new_matched_tokens offered for request "
                f"{st.req_id} ({0 if offer is None else offer.num_new_tokens})"
            )
        for g, ((_first, last), t) in enumerate(zip(offer.gpu_ranges, tables, strict=False)):
            if len(t) < last:
                raise InvalidArgumentError(
                    f"block_ids_per_group[{g}] has {len(t)} blocks, the load needs at least {last}"
                )
        ranges = load_targets(offer, tables)
        job = build_load_job(st, self.config, self.manager, ranges, tables, self._next_job_id)
        self._next_job_id += 1
        st.set_block_ids(tables)
        self._jobs[job.job_id] = JobRecord(job, st.req_context)
        for k in job.keys:
            self._loading_keys[k] = self._loading_keys.get(k, 0) + 1
        st.in_flight.add(job.job_id)
        st.load_job_id = job.job_id
        st.offer = None
        st.reset_store_progress(offer.num_computed_tokens + n_ext)
        self._pending_loads.append(job)

    # ------------------------------------------------------------------ per step
    def build_step(
        self,
        new_requests: Sequence[ScheduledRequest] = (),
        running_requests: Sequence[ScheduledRequest] = (),
        preempted_req_ids: Iterable[str] = (),
    ) -> SchedulerStepOutput:
        """Jobs for one engine step.

        Args:
            new_requests: requests computing for the first time since their (re)admission, with
                their whole block tables.
            running_requests: requests that already ran, with the blocks appended this step.
            preempted_req_ids: ids (str) of requests preempted this step (their GPU blocks were
                freed); each must be known to the scheduler.

        Returns:
            flush job ids (wait for them before writing any GPU block this step), the load jobs
            built since the last call, and the store jobs of the blocks that fill up this step.

        Last, it calls the manager's ``end_step()`` when it has one: a
        :class:`~kvoffload.engine.tiered.TieredManager` sends the step's
        tier probes, promotions and writes there, once per step.
        """
        num_groups = len(self._groups)
        preempted = check_preempted(preempted_req_ids, self._states)
        new_checked, run_checked = check_scheduled(new_requests, running_requests, self.config, self._states)

        for rid in preempted:
            st = self._states.get(rid)
            if st is not None:
                self._release_blocks(st)
        written: list[set[int]] | None = [set() for _ in range(num_groups)] if self._flush else None
        for sr, blocks, _ in new_checked:
            st = self._state(sr.request)
            st.set_block_ids(blocks)
            st.sync_keys()
            st.reset_store_progress(sr.num_computed_tokens)
            if written is not None:
                for g, t in enumerate(blocks):
                    written[g].update(t[sr.num_computed_tokens // self._groups[g].gpu_block_size :])
        for _, st, _, appended in run_checked:
            if appended is not None:
                st.extend_block_ids(appended)
                if written is not None:
                    for g, t in enumerate(appended):
                        written[g].update(t)
        out = SchedulerStepOutput()
        out.load_jobs, self._pending_loads = self._pending_loads, []
        if written is not None:
            for job in out.load_jobs:
                for g in range(num_groups):
                    written[g].update(job.gpu_spec.group_block_ids(g).tolist())
            flush: set[int] = set()
            for g in range(num_groups):
                written[g].discard(FREED)
                self._flush.collect(g, written[g], flush)
            out.flush_job_ids = sorted(flush)
            for jid in out.flush_job_ids:
                self._flush.remove(jid)
        stores = out.store_jobs
        for sr, _, tokens in new_checked:
            self._maybe_store(self._states[sr.request.request_id], tokens, stores)
        for _, st, tokens, _ in run_checked:
            if tokens >= st.next_store_tokens:
                self._maybe_store(st, tokens, stores)
        if self._deferred is not None:
            self._deferred.poll()
        if self._end_step is not None:
            self._end_step()
        return out

    def _maybe_store(self, st: RequestOffloadState, tokens: int, out: list[TransferJob]) -> None:
        job = build_store_job(st, self.config, self.manager, tokens, self._next_job_id)
        if job is not None:
            self._next_job_id += 1
            self._jobs[job.job_id] = JobRecord(job, st.req_context)
            st.in_flight.add(job.job_id)
            out.append(job)

    def _release_blocks(self, st: RequestOffloadState) -> None:
        """The request gave its GPU blocks back: track its in-flight jobs for flushing."""
        self._cancel_unsent_load(st)
        for jid in st.in_flight:
            self._flush.add(self._jobs[jid].job)
            self._jobs[jid].orphaned = True
        st.set_block_ids([[] for _ in st.groups])
        st.offer = None

    def _cancel_unsent_load(self, st: RequestOffloadState) -> None:
        jid = st.load_job_id
        if jid is None or not any(j.job_id == jid for j in self._pending_loads):
            return
        self._pending_loads = [j for j in self._pending_loads if j.job_id != jid]
        rec = self._jobs.pop(jid)
        st.in_flight.discard(jid)
        st.load_job_id = None
        unmark_loading(self._loading_keys, rec.job.keys)
        if self._deferred is not None:
            self._deferred.resolve(rec.job.keys)
        self.manager.complete_load(rec.job.keys, rec.req_context)

    def free_blocks(self, request: Any, block_ids_per_group: Sequence[Sequence[int]]) -> None:
        """The engine freed some GPU blocks of a running request (they may go to another request at once).

        Call it when a sliding-window group's blocks leave the attention window (vLLM replaces
        them with its null block and frees them), before the next :meth:`build_step`.

        Args:
            request: the request (or its id).
            block_ids_per_group: per group, the GPU block ids freed (may be empty); each must be
                in the request's block table for that group (the null block id is ignored).

        Afterwards nothing of those blocks is stored: offloaded blocks that were not stored in
        time (a ``prepare_store`` that returned None is retried without them) are simply not
        offloaded. The configured ``null_block_id`` in a block table means the same (no block
        there); a load skips the leading null blocks of a sliding-window group's range (the
        engine keeps fewer blocks than the loaded window covers). In-flight jobs of the request
        that use the freed blocks are flushed before another request writes them. Raises
        :class:`~kvoffload.errors.InvalidArgumentError` (nothing changed) for an unknown request
        or a block the request does not hold.
        """
        rid = request if isinstance(request, str) else request.request_id
        st = self._states.get(rid)
        if st is None:
            raise InvalidArgumentError(f"request: {rid!r} is not running (free_blocks needs a scheduled request)")
        tables = check_block_table(block_ids_per_group, len(self._groups), "block_ids_per_group")
        positions = st.table_positions(tables, "block_ids_per_group")
        freed = st.free_positions(positions)
        self._flush.add_users([self._jobs[jid].job for jid in st.in_flight], freed)

    def complete_jobs(self, results: Iterable[Any]) -> list[FinishedJob]:
        """Count worker reports; return the jobs every worker has now reported, completed with the
        manager (:meth:`~kvoffload.engine.scheduler.completion.JobCompletion.complete` says how)."""
        return self._completion.complete(results, self._pending_loads)

    # ------------------------------------------------------------------ lifecycle
    def request_finished(self, request: Any, block_ids: Sequence[Sequence[int]] | None = None) -> None:
        """Forget a finished (or aborted) request; its GPU blocks may be freed at once.

        Its in-flight jobs still complete normally (with its ``ReqContext``); the GPU blocks they
        use are flushed before another request writes them (see :meth:`build_step`).
        ``block_ids`` is accepted for engines that pass it; the scheduler knows its jobs' blocks.

        A request the scheduler does not track -- never looked up nor scheduled (aborted while
        waiting), or already finished -- is a no-op, as in vLLM's offloading connector: offloading
        never started for it, or was already wound down. ``request`` must be a request (with a
        str ``request_id``) or its id str, else :class:`~kvoffload.errors.InvalidTypeError`.
        """
        rid = check_finished(request)
        if self._deferred is not None:
            self._deferred.forget(rid)
        st = self._states.pop(rid, None)
        if st is None:
            logger.debug("request_finished: %r is not tracked (never scheduled, or already finished)", rid)
            return
        self._release_blocks(st)

    def take_events(self) -> list[OffloadingEvent]:
        """The manager's events since the last call (stores and evictions)."""
        take = getattr(self.manager, "take_events", None)
        return list(take()) if take is not None else []

    def reset_cache(self) -> bool:
        """Drop every offloaded block; refused (False) while transfer jobs are in flight or when
        the manager has no ``reset_cache``."""
        if self._jobs or self._pending_loads:
            return False
        reset = getattr(self.manager, "reset_cache", None)
        if reset is None:
            return False
        reset()
        if self._deferred is not None:
            self._deferred.clear()
        return True
