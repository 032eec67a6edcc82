"""Offload tier: core types, the CPU manager and its policies, reuse filter, host pool, transfer worker."""

from kvoffload.offload.base import *  # noqa: F401,F403
from kvoffload.offload.base import __all__ as _base_all

__all__ = list(_base_all)
