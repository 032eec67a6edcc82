"""vLLM's own ``TieringOffloadingManager`` over kvoffload's primary tier (``KVOffloadSpec`` + ``secondary_tiers``).

vLLM's tiering logic (lookups falling through to the tiers, promotions batched per request at the
end of a step, cascades of completed stores to every tier, back-pressure, its metrics) runs
unchanged; :class:`KVOffloadTieringManager` adds what kvoffload's connector needs:

* ``core``: the primary's kvoffload manager (the connector drops chunks whose load failed);
* :meth:`fail_store`: the connector names the keys of a store job that failed on a worker
  before vLLM completes the job as successful; :meth:`complete_store` then drops those keys
  from the primary instead of cascading them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from kvoffload.integrations.vllm.primary import KVOffloadPrimaryTier
from kvoffload.integrations.vllm.shared_region import RegionGeometry, open_scheduler_region

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadTieringManager", "build_tiering_manager"]


class KVOffloadTieringManager(TieringOffloadingManager):
    """vLLM's ``TieringOffloadingManager`` with a :class:`~kvoffload.integrations.vllm.primary.KVOffloadPrimaryTier`."""

    def __init__(self, primary_tier: Any, secondary_tiers: list[Any], **kwargs: Any) -> None:
        super().__init__(primary_tier, secondary_tiers, **kwargs)
        self._failed_store_keys: set[OffloadKey] = set()

    @property
    def core(self) -> Any:
        """The primary tier's kvoffload manager (``CPUOffloadingManager``)."""
        return self.primary_tier.core

    def fail_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """The GPU->CPU store of ``keys`` failed: drop them when vLLM completes the job."""
        self._failed_store_keys.update(keys)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        failed = self._failed_store_keys.intersection(keys)
        if not failed:
            super().complete_store(keys, req_context, success)
            return
        self._failed_store_keys -= failed
        self.primary_tier.complete_store(list(failed), req_context, False)
        rest = [k for k in keys if k not in failed]
        # an empty key list still settles the request's pending store (nothing to cascade)
        super().complete_store(rest, req_context, success and bool(rest))


def build_tiering_manager(spec: Any, geometry: RegionGeometry, options: dict[str, Any]) -> KVOffloadTieringManager:
    """The scheduler side of ``KVOffloadSpec`` with tiers: the region mapped here, kvoffload's primary
    over it (``options``: :class:`KVOffloadManager`'s), each tier of ``spec.secondary_tier_configs``
    built by vLLM's factory over the primary memoryview. Whatever was built is released on error."""
    region = open_scheduler_region(spec.config.engine_id, geometry)
    primary: KVOffloadPrimaryTier | None = None
    tiers: list[Any] = []
    try:
        primary = KVOffloadPrimaryTier(geometry.num_chunks, region, **options)
        view = primary.get_kv_memoryview()
        for cfg in spec.secondary_tier_configs:
            tiers.append(SecondaryTierFactory.create_secondary_tier(dict(cfg), view, spec))
        manager = KVOffloadTieringManager(primary, tiers, **spec.tiering_options)
    except Exception:
        for tier in tiers:
            try:
                tier.shutdown()
            except Exception:
                logger.exception("shutting down tier %s after a failed start", getattr(tier, "tier_type", tier))
        if primary is not None:
            primary.shutdown()
        else:
            region.cleanup()
        raise
    logger.info("kvoffload tiering manager: %d chunks, tiers %s", geometry.num_chunks, [t.tier_type for t in tiers])
    return manager
