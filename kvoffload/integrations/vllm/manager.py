"""vLLM's ``OffloadingManager`` contract (0.32 / 0.33) backed by one kvoffload
:class:`~kvoffload.cache.manager.CPUOffloadingManager` (request recording on, the reuse filter
counting store offers as vLLM does), converted to vLLM's types here.

Deliberate differences from vLLM's own ``CPUOffloadingManager`` (also in docs/vllm.md):

* keys repeated inside one call are reduced to their first occurrence (kvoffload's manager
  rejects repeats; vLLM's manager tolerates them) -- at this door: each call's keys are checked and
  resolved to slots once by the manager's call itself, and a call it refuses for repeats (nothing
  changed) is made again on its keys de-duplicated (``CPUOffloadingManager.key_batch``);
* a vLLM ``CachePolicy`` runs through :class:`~kvoffload.integrations.vllm.policy.VLLMPolicyAdapter`
  (see there for what it sees differently);
* ``lock`` is a no-op context (the manager has no thread of its own) and ``on_reset_flushed``
  does nothing: kvoffload's transfer worker runs jobs in submission order, so a slot freed by
  ``reset_cache`` is never written by an older job after a newer one.

``lru`` decides as the LRU of the vLLM it runs under: inside vLLM 0.33 it is ``request_lru``
(:func:`~kvoffload.integrations.vllm.policy.resolve_cache_policy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING, lookup_code
from kvoffload.errors import InvalidArgumentError
from kvoffload.integrations.vllm.policy import resolve_cache_policy

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadManager", "VLLM_LOOKUP"]

#: kvoffload's :class:`~kvoffload.core.lookup_code.LookupCode` as vLLM's ``LookupResult`` (indexed by code):
#: the one conversion, used by the manager's lookups and the secondary tiers'
VLLM_LOOKUP: tuple[LookupResult, ...] = (
    LookupResult.MISS,
    LookupResult.HIT,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)
#: :attr:`KVOffloadManager.lock` (a no-op context, reusable)
_NO_LOCK: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
#: what :meth:`KVOffloadManager.on_new_request` answers for every request (vLLM's default policy)
_CHUNK_LEVEL = RequestOffloadingContext()
#: vLLM's own ``ReqContext.get_offload_key_position`` (None where this vLLM has no key positions)
_VLLM_KEY_POSITION = getattr(ReqContext, "get_offload_key_position", None)


def key_position_getter(req_context: ReqContext) -> Callable[[OffloadKey], int | None] | None:
    """The request's key -> token position lookup (None where vLLM records none): for vLLM's own
    ``ReqContext`` the ``get`` of the dict its method reads (the same answers, without a Python
    call per key: a request's end looks up every key it touched), else the context's method."""
    if (
        _VLLM_KEY_POSITION is not None
        and req_context.__class__ is ReqContext
        and ReqContext.get_offload_key_position is _VLLM_KEY_POSITION
    ):
        positions = req_context.__dict__.get("_offload_key_positions")
        if positions.__class__ is dict:
            return positions.get  # type: ignore[union-attr]
    return getattr(req_context, "get_offload_key_position", None)


#: vLLM 0.33 marks the event of a failed store ``metadata_only`` (0.32's event has no such field).
HAS_METADATA_ONLY = "metadata_only" in {f.name for f in dataclasses.fields(OffloadingEvent)}


class KVOffloadManager(OffloadingManager):
    """vLLM's scheduler-side manager for a host pool of ``num_blocks`` chunks, kvoffload inside.

    Args:
        num_blocks: CPU chunks (one offloaded block = ``blocks_per_chunk`` GPU blocks).
        cache_policy: a kvoffload policy (``lru``, ``arc``, ``s3fifo``, a registered name,
            ``module:Class``) or a vLLM ``CachePolicy`` (a name registered with vLLM's
            ``CachePolicyFactory``, or a class of ``cache_policy_module_path``), resolved as vLLM
            resolves it (:func:`~kvoffload.integrations.vllm.policy.resolve_cache_policy`).
        store_threshold: offers a key needs before it is stored; below 2 nothing is filtered.
        max_tracker_size: keys the reuse filter tracks.
        enable_events: record store/evict events (vLLM's ``enable_kv_cache_events``).
        config_info: the labels :meth:`config_info` reports (vLLM 0.33).
        cache_policy_module_path: the module of an out-of-tree ``cache_policy`` class (vLLM's key).
    """

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
        enable_events: bool = False,
        config_info: dict[str, Any] | None = None,
        cache_policy_module_path: str | None = None,
    ) -> None:
        self.medium: Medium = Medium.CPU  # vLLM's managers name their medium (vLLM code reads it)
        policy = resolve_cache_policy(cache_policy, cache_policy_module_path)
        self.core = CPUOffloadingManager(
            num_blocks,
            cache_policy=policy,
            enable_events=enable_events,
            store_threshold=store_threshold if store_threshold >= 2 else None,
            max_tracker_size=max_tracker_size,
            count_on="offer",
            record_requests=True,
        )
        self.core.trust_context_class(ReqContext)  # vLLM's contexts: their req_id checked, no general check
        self.store_threshold = store_threshold
        if type(self).lookup is KVOffloadManager.lookup:  # not overridden by a subclass
            # one closure call per lookup, answering vLLM's LookupResult (vLLM's contexts pass unchecked)
            self.lookup = self.core.lookup_function(  # type: ignore[method-assign,assignment]
                (VLLM_LOOKUP[LOOKUP_HIT], VLLM_LOOKUP[LOOKUP_MISS], VLLM_LOOKUP[LOOKUP_PENDING]), ReqContext
            )
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        # the manager's own calls where they are the same (no frame between)
        if type(self).complete_load is KVOffloadManager.complete_load:
            self.complete_load = self.core.complete_load  # type: ignore[method-assign,assignment]
        if type(self).complete_store is KVOffloadManager.complete_store and (
            self._events is None or not HAS_METADATA_ONLY
        ):
            self.complete_store = self.core.complete_store  # type: ignore[method-assign,assignment]
        self._alloc_sizes: list[int] = []
        self._config_info = dict(config_info or {})

    # ------------------------------------------------------------------ vLLM 0.33 additions
    @property
    def lock(self) -> contextlib.AbstractContextManager[Any]:
        """No-op: the manager is entered only from vLLM's scheduler thread."""
        return _NO_LOCK

    def on_reset_flushed(self) -> None:
        """Nothing to do (jobs run in submission order; see the module docstring)."""

    def config_info(self) -> Sequence[dict[str, Any]]:
        return [self._config_info]

    # ------------------------------------------------------------------ request hooks
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start the request's record (created by its first recorded call); every request gets
        vLLM's default offloading (chunk level), one shared context (vLLM only reads it), so
        this call allocates nothing."""
        self.core.on_new_request(req_context)  # type: ignore[arg-type]
        return _CHUNK_LEVEL

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.core.on_request_finished(req_context, key_position_getter(req_context))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ lookups and loads
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """The key's state as vLLM's ``LookupResult`` (replaced per instance by an equivalent closure)."""
        return VLLM_LOOKUP[lookup_code(self.core.lookup(key, req_context))]  # type: ignore[arg-type]

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> Any:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        try:  # vLLM's keys are distinct: resolved once, by the manager's own checks
            slots = self.core.load_slots(keys if keys.__class__ is list else list(keys), req_context)  # type: ignore[arg-type]
        except InvalidArgumentError:  # repeated keys (nothing changed): each once, first occurrences
            slots = self.core.load_slots(self.core.key_batch(keys), req_context)  # type: ignore[arg-type]
        return CPULoadStoreSpec(slots)  # type: ignore[arg-type]

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.core.touch(self.core.key_batch(keys), req_context)  # type: ignore[arg-type]

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` (replaced per instance by the manager's own method)."""
        self.core.complete_load(keys, req_context)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ stores
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        try:  # vLLM's keys are distinct: resolved once, by the manager's own checks
            plan = self.core.store_plan(keys if keys.__class__ is list else list(keys), req_context)  # type: ignore[arg-type]
        except InvalidArgumentError:  # repeated keys (nothing changed): each once, first occurrences
            plan = self.core.store_plan(self.core.key_batch(keys), req_context)  # type: ignore[arg-type]
        if plan.keys:  # the keys past the filter that it allocates, or tried to (vLLM's histogram)
            self._alloc_sizes.append(len(plan.keys))
        if plan.slots is None:
            return None
        return PrepareStoreOutput(
            keys_to_store=plan.keys,
            store_spec=CPULoadStoreSpec(plan.slots),
            evicted_keys=plan.evicted,  # type: ignore[arg-type]
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Pending keys become ready (``success``) or are removed (with events on vLLM 0.33, a
        ``metadata_only`` removal event for those); replaced per instance by the manager's own
        method where that is all it does."""
        if success or self._events is None or not HAS_METADATA_ONLY:
            self.core.complete_store(keys, req_context, success)  # type: ignore[arg-type]
            return
        batch = self.core.key_batch(keys)
        removed = [k for k, c in zip(batch, self.core.peek(batch).tolist(), strict=True) if c == LOOKUP_PENDING]
        self.core.complete_store(batch, req_context, False)  # type: ignore[arg-type]
        if removed:
            self._drain_core_events()
            self._events.append(
                OffloadingEvent(keys=removed, medium=self.medium, removed=True, metadata_only=True)  # type: ignore[call-arg]
            )

    # ------------------------------------------------------------------ events, stats, reset
    def _drain_core_events(self) -> None:
        assert self._events is not None
        for ev in self.core.take_events():
            self._events.append(OffloadingEvent(keys=list(ev.keys), medium=self.medium, removed=ev.removed))

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return
        self._drain_core_events()
        events, self._events = self._events, []
        for ev in events:
            if getattr(ev, "metadata_only", False):
                # a key stored again since its failed store is not announced as removed
                keys = [k for k, c in zip(ev.keys, self.core.peek(ev.keys).tolist(), strict=True) if c == LOOKUP_MISS]
                if not keys:
                    continue
                ev = dataclasses.replace(ev, keys=keys)
            yield ev

    def get_stats(self) -> Any:
        """vLLM's gauges (usage = pending + pinned chunks, write = pending, read = pinned), the
        allocation-size histogram and, with a reuse filter, the skipped-store counter."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        skipped = self.core.take_filtered()  # keys the filter dropped (not those already stored)
        t = self.core.table
        stats = OffloadingConnectorStats()
        n = self.core.num_blocks
        usage = (t.num_pending + t.num_pinned) / n if n else 0.0
        write = t.num_pending / n if n else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write, 0.0))
        for size in self._alloc_sizes:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self._alloc_sizes.clear()
        if self.core.reuse is not None:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped)
        return stats

    def reset_cache(self) -> None:
        """Drop every chunk; what is not reported yet (events, allocation sizes, skipped stores)
        is kept for the next :meth:`take_events` / :meth:`get_stats`, as vLLM's manager keeps it."""
        self.core.reset_cache()

    def has_pending_work(self) -> bool:
        return False

    def on_schedule_end(self, context: Any) -> None:
        return None

    def shutdown(self) -> None:
        self.core.shutdown()
        self.__dict__.pop("lookup", None)  # back to the method, which now raises
