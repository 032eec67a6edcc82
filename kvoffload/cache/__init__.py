"""What the scheduler process runs: the numpy-backed CPU manager (with its eviction policies, reuse
filter and per-request access recording as parts). Needs numpy, never torch; never imports
:mod:`kvoffload.transfer`."""

from kvoffload.cache.manager import CPUOffloadingManager, OffloadingStats
from kvoffload.cache.policies import CachePolicy, available_policies, get_policy_class, register_policy

__all__ = [
    "CPUOffloadingManager",
    "OffloadingStats",
    "CachePolicy",
    "register_policy",
    "get_policy_class",
    "available_policies",
]
