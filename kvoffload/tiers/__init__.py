"""Secondary KV tiers beneath the host pool: a shared Redis / Redis Cluster tier, a disk tier, and any
tier registered by URL scheme (:mod:`kvoffload.tiers.registry`: :func:`open_tier` resolves a spec).

Layout: the tier interface (:mod:`~kvoffload.tiers.base`), the value format
(:mod:`~kvoffload.tiers.record`, :mod:`~kvoffload.tiers.namespace`) and the registry here; each
backend is one folder, :mod:`kvoffload.tiers.redis` and :mod:`kvoffload.tiers.disk`. A backend's
third-party packages come with its extra (``pip install 'kvoffload[redis]'``, ``'kvoffload[disk]'``),
so this package imports without them: :class:`RedisTier` and :class:`DiskTier` are imported on
first use, and a backend whose extra is missing raises
:class:`~kvoffload.errors.BackendUnavailableError` with the ``pip install`` line to run.

See ``docs/contract.md`` §8. Imports only :mod:`kvoffload.errors` and numpy (and a backend's
packages when it is used); it never imports the cache, transfer or scheduler layers, which drive it.
"""

from typing import TYPE_CHECKING, Any

from kvoffload.tiers.base import Tier
from kvoffload.tiers.namespace import RECORD_FORMAT_VERSION, TierNamespace
from kvoffload.tiers.record import RecordCodec
from kvoffload.tiers.registry import (
    ENTRY_POINT_GROUP,
    TIERS,
    TierSpec,
    check_tier_spec,
    open_tier,
    register_tier,
    tier_schemes,
)
from kvoffload.tiers.types import TierJobResult, TierStats

if TYPE_CHECKING:
    from kvoffload.tiers.disk import DiskTier
    from kvoffload.tiers.redis import RedisTier

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

#: the built-in backends' classes -> their folder, which is also the name of their extra
_BACKENDS = {"RedisTier": "redis", "DiskTier": "disk"}


def __getattr__(name: str) -> Any:
    """``RedisTier`` / ``DiskTier``, imported on first use (PEP 562) through the tier registry, whose
    :class:`~kvoffload.errors.BackendUnavailableError` names the missing extra's ``pip install`` line."""
    backend = _BACKENDS.get(name)
    if backend is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return TIERS.get(f"{__name__}.{backend}:{name}")
