"""Cache policies of the CPU offloading manager: ``lru``, ``arc``, ``s3fifo``, ``headstart`` and a registry.

Select one by name (``CPUOffloadingManager(..., cache_policy="arc")``), register your own with
:func:`register_policy`, or name an out-of-tree class as ``"package.module:ClassName"``.
"""

from kvoffload.cache.policies.base import CachePolicy, available_policies, get_policy_class, register_policy

__all__ = ["CachePolicy", "register_policy", "get_policy_class", "available_policies"]
