"""Secondary KV tiers beneath the host pool: a shared Redis / Redis Cluster tier and a disk tier.

See ``docs/contract.md`` §8. Imports only :mod:`kvoffload.errors` (and numpy / redis-py); it
never imports the cache, transfer or scheduler layers, which drive it.
"""

from kvoffload.tiers.base import Tier
from kvoffload.tiers.disk_tier import DiskTier
from kvoffload.tiers.factory import open_tier
from kvoffload.tiers.namespace import RECORD_FORMAT_VERSION, TierNamespace
from kvoffload.tiers.record import RecordCodec
from kvoffload.tiers.redis_tier import RedisTier
from kvoffload.tiers.types import TierJobResult, TierStats

__all__ = [
    "Tier",
    "RedisTier",
    "DiskTier",
    "open_tier",
    "TierNamespace",
    "RECORD_FORMAT_VERSION",
    "RecordCodec",
    "TierJobResult",
    "TierStats",
]
