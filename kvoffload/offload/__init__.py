"""Offload tier: core types, the CPU manager and its policies, reuse filter, host pool, transfer worker."""

from kvoffload.offload.base import *  # noqa: F401,F403
from kvoffload.offload.base import __all__ as _base_all
from kvoffload.offload.host_pool import HostPool
from kvoffload.offload.lookup_result import LookupResult
from kvoffload.offload.manager import CPUOffloadingManager, OffloadingStats
from kvoffload.offload.policies import CachePolicy, available_policies, get_policy_class, register_policy
from kvoffload.offload.request_hooks import RequestHooksManager
from kvoffload.offload.reuse import FilteredReuseManager
from kvoffload.offload.worker import LOAD, STORE, TransferResult, TransferWorker

__all__ = [
    *_base_all,
    "CPUOffloadingManager",
    "OffloadingStats",
    "FilteredReuseManager",
    "RequestHooksManager",
    "LookupResult",
    "CachePolicy",
    "register_policy",
    "get_policy_class",
    "available_policies",
    "HostPool",
    "TransferWorker",
    "TransferResult",
    "STORE",
    "LOAD",
]
