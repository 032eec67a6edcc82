"""Secondary KV tiers beneath the host pool: a shared Redis / Redis Cluster tier, a disk tier, and any
tier registered by URL scheme (:mod:`kvoffload.tiers.registry`: :func:`open_tier` resolves a spec).

See ``docs/contract.md`` §8. Imports only :mod:`kvoffload.errors` (and numpy / redis-py); it
never imports the cache, transfer or scheduler layers, which drive it.
"""

from kvoffload.tiers.base import Tier
from kvoffload.tiers.disk.tier import DiskTier
from kvoffload.tiers.namespace import RECORD_FORMAT_VERSION, TierNamespace
from kvoffload.tiers.record import RecordCodec
from kvoffload.tiers.redis.tier import RedisTier
from kvoffload.tiers.registry import (
    ENTRY_POINT_GROUP,
    TierSpec,
    check_tier_spec,
    open_tier,
    register_tier,
    tier_schemes,
)
from kvoffload.tiers.types import TierJobResult, TierStats

__all__ = [
    "Tier",
    "RedisTier",
    "DiskTier",
    "open_tier",
    "check_tier_spec",
    "register_tier",
    "tier_schemes",
    "TierSpec",
    "ENTRY_POINT_GROUP",
    "TierNamespace",
    "RECORD_FORMAT_VERSION",
    "RecordCodec",
    "TierJobResult",
    "TierStats",
]
