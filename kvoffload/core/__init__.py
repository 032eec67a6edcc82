"""Types shared by the scheduler process and the GPU worker: keys, the request context, load/store
specs, events, the lookup codes and the manager contract (:class:`OffloadingManager`). Imports only
the leaf modules ``kvoffload.errors`` and ``kvoffload.checks``."""

from kvoffload.core.base import *  # noqa: F401,F403
from kvoffload.core.base import __all__ as _base_all
from kvoffload.core.lookup_code import *  # noqa: F401,F403
from kvoffload.core.lookup_code import __all__ as _lookup_all

__all__ = [*_base_all, *_lookup_all]
