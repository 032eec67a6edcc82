"""Types shared by the scheduler process and the GPU worker: keys, the request context, load/store
specs, events and the manager contract (:class:`OffloadingManager`). Imports only ``kvoffload.errors``."""

from kvoffload.core.base import *  # noqa: F401,F403
from kvoffload.core.base import __all__ as _base_all

__all__ = [*_base_all]
