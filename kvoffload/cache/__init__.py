"""What the scheduler process runs: the numpy-backed CPU manager, its eviction policies, the reuse
filter and the per-request access recording. Needs numpy, never torch; never imports
:mod:`kvoffload.transfer`."""

from kvoffload.cache.manager import CPUOffloadingManager, OffloadingStats
from kvoffload.cache.policies import CachePolicy, available_policies, get_policy_class, register_policy
from kvoffload.cache.request_hooks import RequestHooksManager
from kvoffload.cache.reuse import FilteredReuseManager
from kvoffload.core.lookup_result import LookupResult

__all__ = [
    "CPUOffloadingManager",
    "OffloadingStats",
    "FilteredReuseManager",
    "RequestHooksManager",
    "LookupResult",
    "CachePolicy",
    "register_policy",
    "get_policy_class",
    "available_policies",
]
