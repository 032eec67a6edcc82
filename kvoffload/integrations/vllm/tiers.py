"""Any kvoffload tier as a vLLM secondary tier: ``KVOffloadTier`` (and its aliases ``KVOffloadRedisTier``,
``KVOffloadDiskTier``).

``KVOffloadTier`` implements vLLM's ``SecondaryTierManager`` (``vllm/v1/kv_offload/tiering/base.py``,
vLLM 0.32 and 0.33) over any :class:`kvoffload.tiers.Tier` the tier registry resolves
(:mod:`kvoffload.tiers.registry`: a URL scheme -- built-in, registered, or an installed package's
``kvoffload.tiers`` entry point -- or a class named by ``tier_class`` + ``tier_module_path``), whose
records are the rows of the primary tier's memoryview (one CPU chunk per row). It runs in vLLM's
scheduler process and never blocks it:

* ``lookup`` answers HIT / MISS from the tier's known verdicts and RETRY for a key whose probe is
  queued or in flight; ``on_schedule_end`` sends the step's queued keys as one probe batch;
* ``submit_store`` / ``submit_load`` start a tier job over the job's primary chunk ids;
  ``get_finished_jobs`` reports it (a promotion that failed part-way names its
  ``successful_keys``); ``drain_jobs`` waits for every job; ``shutdown`` closes the tier;
* ``get_stats`` reports the tier's own counters (values absent, rejected by namespace, by
  integrity, corrupt, deleted; redirected, timed-out, dropped writes, errors, probe round trips)
  under the metric names of :meth:`build_metric_definitions`;
* with ``enable_kv_events`` (and vLLM's KV events on) ``take_events`` announces stored blocks,
  and blocks the store removed (``removed=True``: a Redis tier then watches the server's keyspace
  notifications, which need ``notify-keyspace-events Egex``; ``removal_events_off`` in its stats
  says when they are off; a disk tier reports its budget's evictions; both, rejected values).

Use from vLLM's own ``TieringOffloadingSpec`` (or kvoffload's ``KVOffloadSpec``)::

    "secondary_tiers": [{"type": "KVOffloadTier", "module_path": "kvoffload.integrations.vllm",
                         "url": "redis://redis.internal:6379/0"},
                        {"type": "KVOffloadTier", "module_path": "kvoffload.integrations.vllm",
                         "url": "disk:/mnt/kv", "max_bytes": 1099511627776}]

Keys (besides vLLM's own ``type``, ``module_path``, ``backpressure``): ``url`` (a tier URL) and/or
``tier_class`` + ``tier_module_path`` (an out-of-tree :class:`~kvoffload.tiers.Tier` subclass),
``locality`` (``LOCAL`` / ``REMOTE``; default: the tier class's), ``enable_kv_events``,
``namespace_tag``, ``hash_algo``; every other key is an option of the tier's constructor
(``probe_wait`` defaults to 0 here: vLLM's scheduler never waits on a tier)
(``integrity_key``: a secret or a list, the first signs; ``io_threads``…; Redis: ``cluster``,
``password``, ``protocol``…; disk: ``max_bytes``,
``o_direct``), an unknown one a typed error at start. The aliases keep older configurations
working: ``KVOffloadRedisTier`` (``url`` of a Redis), ``KVOffloadDiskTier`` (``root_dir``).
See docs/vllm.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any, ClassVar

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload import tiers
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.integrations.vllm.manager import VLLM_LOOKUP
from kvoffload.integrations.vllm.tier_namespace import namespace_from_offloading_spec
from kvoffload.tiers import Tier, TierSpec, TierStats, check_tier_spec
from kvoffload.tiers.health import check_at_start, check_on_unavailable
from kvoffload.tiers.registry import resolve_tier, tier_options

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadTier", "KVOffloadRedisTier", "KVOffloadDiskTier", "TIER_METRICS", "TIER_SERVING"]

#: gauge per tier: 1 while it serves, 0 while it backs off an unreachable store
TIER_SERVING = "vllm:kv_offload_kvoffload_tier_serving"
#: at most one "does not answer" line per tier in this many seconds while it is degraded
DEGRADED_LOG_INTERVAL_S = 60.0

#: metric name -> (TierStats field, documentation); counters labeled by ``tier``.
TIER_METRICS: dict[str, tuple[str, str]] = {
    "vllm:kv_offload_kvoffload_tier_rejected_values": (
        "rejected_values",
        "Values a kvoffload tier read and refused (the sum of the namespace, integrity and corrupt counters).",
    ),
    "vllm:kv_offload_kvoffload_tier_rejected_namespace": (
        "rejected_namespace",
        "Values of another namespace or format version found under a kvoffload tier's keys (deleted).",
    ),
    "vllm:kv_offload_kvoffload_tier_rejected_integrity": (
        "rejected_integrity",
        "Values whose MAC none of a kvoffload tier's integrity keys verifies (forged, unsigned, retired key; kept).",
    ),
    "vllm:kv_offload_kvoffload_tier_corrupt": (
        "corrupt",
        "Values a kvoffload tier found damaged or foreign (magic, key, length, checksum; deleted).",
    ),
    "vllm:kv_offload_kvoffload_tier_deleted_values": (
        "deleted_values",
        "Refused values a kvoffload tier deleted (still the value it read).",
    ),
    "vllm:kv_offload_kvoffload_tier_absent": (
        "absent",
        "Loads of values a kvoffload tier's store no longer held (evicted, deleted, restarted).",
    ),
    "vllm:kv_offload_kvoffload_tier_redirected": (
        "redirected",
        "Redis Cluster commands a kvoffload tier sent again after MOVED or ASK.",
    ),
    "vllm:kv_offload_kvoffload_tier_timed_out": (
        "timed_out",
        "Keys whose command to a kvoffload tier's store timed out.",
    ),
    "vllm:kv_offload_kvoffload_tier_dropped_writes": (
        "dropped_writes",
        "Blocks a kvoffload tier dropped without storing (store unreachable or write queue full).",
    ),
    "vllm:kv_offload_kvoffload_tier_errors": (
        "errors",
        "Backend errors a kvoffload tier saw (connection refused, timeouts, I/O errors).",
    ),
    "vllm:kv_offload_kvoffload_tier_lookup_round_trips": (
        "lookup_round_trips",
        "Probe batches a kvoffload tier sent (at most one per scheduler step).",
    ),
    "vllm:kv_offload_kvoffload_tier_evictions": (
        "evictions",
        "Values a kvoffload tier removed itself to stay within its byte budget.",
    ),
}


def _records(primary_kv_view: memoryview) -> np.ndarray:
    """The primary memoryview as a ``(num_chunks, row_bytes)`` uint8 array (no copy)."""
    arr = np.asarray(primary_kv_view)
    if arr.ndim != 2:
        raise InvalidArgumentError(f"primary_kv_view must be 2-D (num_chunks, row_bytes), got shape {arr.shape}")
    return arr.view(np.uint8)


class KVOffloadTier(SecondaryTierManager):
    """A vLLM secondary tier over any registered kvoffload :class:`~kvoffload.tiers.Tier` (see the
    module docstring). Subclasses may turn their own keys into the tier spec (:meth:`_tier_spec`)."""

    medium: ClassVar[Medium] = Medium.STORAGE
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        locality: str | None = None,
        enable_kv_events: bool = False,
        namespace_tag: str = "",
        hash_algo: str = "sha256",
        **options: Any,
    ) -> None:
        # vLLM's scheduler must never wait on a tier: probes are answered by the next step's lookups
        options.setdefault("probe_wait", 0.0)
        where = f"secondary tier {tier_type!r}"
        on_unavailable = options.pop("on_unavailable", "start_degraded")
        check_on_unavailable(on_unavailable, f"{where}: on_unavailable")  # before anything is opened
        spec = self._tier_spec(where, options)
        try:
            tier_cls, tier_kwargs = resolve_tier(spec, **options)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        try:
            tier_locality = Locality(locality if locality is not None else tier_cls.locality)
        except ValueError:
            raise InvalidArgumentError(f"{where}: locality must be 'LOCAL' or 'REMOTE', got {locality!r}") from None
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = tier_locality
        records = _records(primary_kv_view)
        self.namespace = namespace_from_offloading_spec(
            offloading_spec, records.shape[1], hash_algo=hash_algo, tag=namespace_tag
        )
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self._events = []
            else:
                logger.warning("%s: enable_kv_events is set but vLLM's KV events are off", where)
        if self._events is not None and "removal_events" in tier_options(tier_cls):
            tier_kwargs.setdefault("removal_events", True)  # the store's own removals become events too
        self.tier: Tier = tier_cls(records, self.namespace, **tier_kwargs)
        try:
            check_at_start(self.tier, on_unavailable)
        except InvalidArgumentError as exc:
            self.tier.records = np.empty((0, 0), dtype=np.uint8)  # no view of the region outlives a failed start
            del records
            raise InvalidArgumentError(f"{where}: {exc}") from None
        self._label = (f"{tier_type}:{self.tier.name}",)
        self._open_jobs: set[int] = set()  # submitted, not yet reported
        self._reported = TierStats()
        self._announced = False  # every counter reported once, at zero too
        self._degraded_logged = 0.0  # when the last "does not answer" line was logged

    def _tier_spec(self, where: str, options: dict[str, Any]) -> TierSpec:
        """The registry spec of this configuration, its keys popped from ``options``: ``url``
        and/or ``tier_class`` + ``tier_module_path``."""
        url = options.pop("url", None)
        cls_name, module_path = options.pop("tier_class", None), options.pop("tier_module_path", None)
        if cls_name is None and module_path is None:
            if not isinstance(url, str) or not url:
                raise InvalidTypeError(
                    f"{where}: 'url' (a tier URL: redis://…, disk:/…, a registered scheme) or 'tier_class' and "
                    f"'tier_module_path' is required, got url={url!r}"
                )
            return url
        spec: dict[str, Any] = {"type": cls_name, "module_path": module_path}
        if url is not None:
            spec["url"] = url
        return spec

    # ------------------------------------------------------------------ lookups
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return VLLM_LOOKUP[int(self.tier.lookup([key])[0])]

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self.tier.end_step()

    # ------------------------------------------------------------------ jobs
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._open_jobs.add(job_metadata.job_id)
        self.tier.submit_store(job_metadata.job_id, list(job_metadata.keys), job_metadata.chunk_ids)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._open_jobs.add(job_metadata.job_id)
        self.tier.submit_load(job_metadata.job_id, list(job_metadata.keys), job_metadata.chunk_ids)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        for r in self.tier.get_finished():
            self._open_jobs.discard(r.job_id)
            success = r.success
            partial = None
            if not success and r.kind == "load" and any(r.ok):
                partial = r.successful_keys
            if r.kind == "store" and self._events is not None and any(r.ok):
                self._events.append(
                    OffloadingEvent(
                        keys=list(r.successful_keys), medium=Medium.STORAGE, removed=False, locality=self.locality
                    )
                )
            out.append(
                JobResult(
                    job_id=r.job_id,
                    success=success,
                    successful_keys=partial,
                    transfer_time=r.transfer_time,
                    transfer_bytes=r.transfer_bytes,
                )
            )
        return out

    def has_pending_work(self) -> bool:
        return bool(self._open_jobs)

    def drain_jobs(self) -> None:
        self.tier.drain()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return
        removed = self.tier.take_removed()
        if removed:  # evicted, expired or deleted in the store (removal_events)
            self._events.append(
                OffloadingEvent(keys=removed, medium=Medium.STORAGE, removed=True, locality=self.locality)
            )
        if self._events:
            events, self._events = self._events, []
            yield from events

    def shutdown(self) -> None:
        self.tier.close()
        # drop the tier's numpy view of the primary memoryview, so vLLM can release the region
        self.tier.records = np.empty((0, 0), dtype=np.uint8)

    # ------------------------------------------------------------------ metrics
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        defs: dict[str, OffloadingMetricMetadata] = {
            name: OffloadingCounterMetadata(documentation=doc, labelnames=("tier",))
            for name, (_, doc) in TIER_METRICS.items()
        }
        defs[TIER_SERVING] = OffloadingGaugeMetadata(
            documentation="1 while a kvoffload tier serves, 0 while it backs off a store it could not reach.",
            labelnames=("tier",),
        )
        return defs

    def get_stats(self) -> OffloadingConnectorStats:
        """The counters' increments since the last call (every counter on the first call, zeros
        included, so that a dashboard sees them from the first scrape) and the serving gauge."""
        now = self.tier.stats()
        before, self._reported = asdict(self._reported), now
        first, self._announced = not self._announced, True
        stats = OffloadingConnectorStats()
        for name, (field, _) in TIER_METRICS.items():
            delta = getattr(now, field) - before[field]
            if delta or first:
                stats.increase_counter(name, delta, labelvalues=self._label)
        serving = self.tier.serving
        stats.set_gauge(TIER_SERVING, 1 if serving else 0, labelvalues=self._label)
        if not serving and time.monotonic() - self._degraded_logged >= DEGRADED_LOG_INTERVAL_S:
            self._degraded_logged = time.monotonic()
            logger.warning(
                "tier %s does not answer: lookups miss, writes drop (%d dropped so far)",
                self.tier.name,
                now.dropped_writes,
            )
        return stats

    # vLLM 0.33: the tier's labels of ``vllm:kv_offload_config_info``
    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("kvoffload_namespace",)

    def config_info(self) -> dict[str, str]:
        return {"kvoffload_namespace": self.tier.fingerprint.hex()}


class KVOffloadRedisTier(KVOffloadTier):
    """``KVOffloadTier`` on a Redis URL (``redis://``, ``rediss://``, ``unix://``; key ``url`` required).

    Values are shared by every engine of the same namespace on that Redis (or Redis Cluster).
    """

    def _tier_spec(self, where: str, options: dict[str, Any]) -> TierSpec:
        url = options.pop("url", None)
        if not isinstance(url, str) or not url or not issubclass(check_tier_spec(url), tiers.RedisTier):
            raise InvalidTypeError(f"{where}: 'url' (redis://host:port, rediss://..., unix://...) is required")
        return url


class KVOffloadDiskTier(KVOffloadTier):
    """``KVOffloadTier`` on a directory (key ``root_dir`` required; engines sharing it share its values)."""

    medium: ClassVar[Medium] = Medium.STORAGE  # vLLM derives the DISK hit source from it
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.DISK

    def _tier_spec(self, where: str, options: dict[str, Any]) -> TierSpec:
        root = options.pop("root_dir", None)
        if not isinstance(root, str) or not root:
            raise InvalidTypeError(f"{where}: 'root_dir' (a directory) is required")
        return {"type": "DiskTier", "module_path": "kvoffload.tiers.disk", "path": root}
