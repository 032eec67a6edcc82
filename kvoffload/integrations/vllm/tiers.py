"""kvoffload's tiers as vLLM secondary tiers: ``KVOffloadRedisTier`` and ``KVOffloadDiskTier``.

Both implement vLLM's ``SecondaryTierManager`` (``vllm/v1/kv_offload/tiering/base.py``, vLLM 0.32 and
0.33) over a :class:`kvoffload.tiers.Tier` whose records are the rows of the primary tier's
memoryview (one CPU chunk per row). They run in vLLM's scheduler process and never block it:

* ``lookup`` answers HIT / MISS from the tier's known verdicts and RETRY for a key whose probe is
  queued or in flight; ``on_schedule_end`` sends the step's queued keys as one probe batch;
* ``submit_store`` / ``submit_load`` start a tier job over the job's primary chunk ids;
  ``get_finished_jobs`` reports it (a promotion that failed part-way names its
  ``successful_keys``); ``drain_jobs`` waits for every job; ``shutdown`` closes the tier;
* ``get_stats`` reports the tier's own counters (values absent, rejected by namespace, by
  integrity, corrupt, deleted; redirected, timed-out, dropped writes, errors, probe round trips)
  under the metric names of :meth:`build_metric_definitions`;
* with ``enable_kv_events`` (and vLLM's KV events on) ``take_events`` announces stored blocks.

Use from vLLM's own ``TieringOffloadingSpec`` (or kvoffload's ``KVOffloadSpec``)::

    "secondary_tiers": [{"type": "KVOffloadRedisTier", "module_path": "kvoffload.integrations.vllm",
                         "url": "redis://redis.internal:6379/0"},
                        {"type": "KVOffloadDiskTier", "module_path": "kvoffload.integrations.vllm",
                         "root_dir": "/mnt/kv", "max_bytes": 1099511627776}]

Keys common to both (besides vLLM's own ``type``, ``module_path``, ``backpressure``): ``locality``
(``LOCAL`` / ``REMOTE``), ``enable_kv_events``, ``namespace_tag``, ``hash_algo``, ``name``,
``integrity_key`` (a secret, or a list of secrets: the first signs, all are accepted),
``io_threads``, ``batch_keys``, ``max_pending_write_bytes``,
``lookup_ttl_steps``, ``backoff_initial``, ``backoff_max``. Redis: ``url`` (required),
``cluster``, ``username``, ``password``, ``socket_timeout``, ``connect_timeout``,
``max_connections``, ``key_prefix``, ``ssl_ca_certs``, ``ssl_cert_reqs``, ``protocol``. Disk: ``root_dir``
(required), ``max_bytes``, ``o_direct``. See docs/vllm.md.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
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
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.integrations.vllm.manager import VLLM_LOOKUP
from kvoffload.integrations.vllm.tier_namespace import namespace_from_offloading_spec
from kvoffload.tiers import DiskTier, RedisTier, Tier, TierStats

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadRedisTier", "KVOffloadDiskTier", "KVOffloadSecondaryTier", "TIER_METRICS"]

_GENERIC_OPTIONS = frozenset(
    (
        "name",
        "integrity_key",
        "io_threads",
        "batch_keys",
        "max_pending_write_bytes",
        "lookup_ttl_steps",
        "backoff_initial",
        "backoff_max",
    )
)

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


class KVOffloadSecondaryTier(SecondaryTierManager):
    """A vLLM secondary tier over a kvoffload :class:`~kvoffload.tiers.Tier` (see the module docstring).

    Subclasses set :attr:`backend_options` (the backend's own keys) and implement :meth:`_open`.
    """

    backend_options: ClassVar[frozenset[str]] = frozenset()
    default_locality: ClassVar[Locality | None] = None

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
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        unknown = sorted(set(options) - self.backend_options - _GENERIC_OPTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"secondary tier {tier_type!r}: unknown option(s) {unknown}; expected some of "
                f"{sorted(self.backend_options | _GENERIC_OPTIONS | {'locality', 'enable_kv_events'})}"
            )
        try:
            self.locality = Locality(locality) if locality is not None else self.default_locality
        except ValueError:
            raise InvalidArgumentError(
                f"secondary tier {tier_type!r}: locality must be 'LOCAL' or 'REMOTE', got {locality!r}"
            ) from None
        records = _records(primary_kv_view)
        self.namespace = namespace_from_offloading_spec(
            offloading_spec, records.shape[1], hash_algo=hash_algo, tag=namespace_tag
        )
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self._events = []
            else:
                logger.warning("secondary tier %r: enable_kv_events is set but vLLM's KV events are off", tier_type)
        self.tier: Tier = self._open(records, options)
        self._label = (f"{tier_type}:{self.tier.name}",)
        self._open_jobs: set[int] = set()  # submitted, not yet reported
        self._reported = TierStats()

    @abstractmethod
    def _open(self, records: np.ndarray, options: dict[str, Any]) -> Tier:
        """The kvoffload tier over ``records`` (the primary rows), from the backend's ``options``."""

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
        return {
            name: OffloadingCounterMetadata(documentation=doc, labelnames=("tier",))
            for name, (_, doc) in TIER_METRICS.items()
        }

    def get_stats(self) -> OffloadingConnectorStats:
        now = self.tier.stats()
        before, self._reported = asdict(self._reported), now
        stats = OffloadingConnectorStats()
        for name, (field, _) in TIER_METRICS.items():
            delta = getattr(now, field) - before[field]
            if delta:
                stats.increase_counter(name, delta, labelvalues=self._label)
        return stats

    # vLLM 0.33: the tier's labels of ``vllm:kv_offload_config_info``
    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("kvoffload_namespace",)

    def config_info(self) -> dict[str, str]:
        return {"kvoffload_namespace": self.tier.fingerprint.hex()}


class KVOffloadRedisTier(KVOffloadSecondaryTier):
    """kvoffload's :class:`~kvoffload.tiers.RedisTier` as a vLLM secondary tier (key ``url`` required).

    Values are shared by every engine of the same namespace on that Redis (or Redis Cluster).
    """

    medium: ClassVar[Medium] = Medium.STORAGE
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED
    default_locality: ClassVar[Locality | None] = Locality.REMOTE
    backend_options: ClassVar[frozenset[str]] = frozenset(
        (
            "url",
            "cluster",
            "username",
            "password",
            "socket_timeout",
            "connect_timeout",
            "max_connections",
            "protocol",
            "key_prefix",
            "ssl_ca_certs",
            "ssl_cert_reqs",
        )
    )

    def _open(self, records: np.ndarray, options: dict[str, Any]) -> Tier:
        url = options.pop("url", None)
        if not isinstance(url, str) or not url:
            raise InvalidTypeError(
                f"secondary tier {self.tier_type!r}: 'url' (redis://host:port, rediss://..., unix://...) is required"
            )
        return RedisTier(records, self.namespace, url, **options)


class KVOffloadDiskTier(KVOffloadSecondaryTier):
    """kvoffload's :class:`~kvoffload.tiers.DiskTier` as a vLLM secondary tier (key ``root_dir`` required).

    Engines sharing ``root_dir`` (a shared volume) share its values.
    """

    medium: ClassVar[Medium] = Medium.STORAGE
    default_locality: ClassVar[Locality | None] = Locality.LOCAL
    backend_options: ClassVar[frozenset[str]] = frozenset(("root_dir", "max_bytes", "o_direct"))

    def _open(self, records: np.ndarray, options: dict[str, Any]) -> Tier:
        root = options.pop("root_dir", None)
        if not isinstance(root, str) or not root:
            raise InvalidTypeError(f"secondary tier {self.tier_type!r}: 'root_dir' (a directory) is required")
        return DiskTier(records, self.namespace, root, **options)
