"""kvoffload: move an LLM engine's paged KV cache between GPU memory and a pinned CPU pool.

Layers (imports run downward only):

* :mod:`kvoffload.kernels` -- Triton pack/unpack kernels (GPU pages <-> packed host records),
  a pure-torch reference, the backend registry.
* :mod:`kvoffload.core` -- core types: keys, request context, load/store specs, the manager contract.
* :mod:`kvoffload.cache` -- the numpy-backed :class:`CPUOffloadingManager`, eviction policies, the
  reuse filter (what the engine's scheduler process runs; no torch).
* :mod:`kvoffload.transfer` -- the pinned host pool and the transfer worker (what a GPU worker runs).
* :mod:`kvoffload.scheduler` -- lookups, touch, load/store jobs (vLLM semantics).
* :mod:`kvoffload.sim`, :mod:`kvoffload.app` (not imported here) -- a reference engine loop
  used by the demo and tests; the command line.
* :mod:`kvoffload.integrations.vllm` (not imported here; imports vLLM) -- kvoffload as the backend
  of vLLM's ``OffloadingConnector``.

Importing kvoffload never initialises CUDA.
"""

from __future__ import annotations

import logging

from kvoffload.cache.manager import CPUOffloadingManager, OffloadingStats
from kvoffload.cache.policies import CachePolicy, available_policies, get_policy_class, register_policy
from kvoffload.cache.request_hooks import RequestHooksManager
from kvoffload.cache.reuse import FilteredReuseManager
from kvoffload.core.base import (
    BlockIDsLoadStoreSpec,
    CPULoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_keys,
)
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING, LookupResult
from kvoffload.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyStateError,
    KVOffloadError,
    ReadOnlyError,
    StreamCaptureError,
    TransferError,
)
from kvoffload.kernels import (
    GenericLayout,
    KernelBackend,
    KVCacheTable,
    available_backends,
    get_backend,
    kernel_mode,
    register_backend,
)
from kvoffload.scheduler import (
    FinishedJob,
    GroupOffloadConfig,
    OffloadingScheduler,
    OffloadingSchedulerConfig,
    ScheduledRequest,
    SchedulerStepOutput,
    TransferJob,
    maximal_prefix_lookup,
    sliding_window_lookup,
)
from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.worker import TransferResult, TransferWorker

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "KVOffloadError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyStateError",
    "ReadOnlyError",
    "StreamCaptureError",
    "BackendUnavailableError",
    "TransferError",
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "validate_keys",
    "ReqContext",
    "LoadStoreSpec",
    "BlockIDsLoadStoreSpec",
    "CPULoadStoreSpec",
    "GPULoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadingManager",
    "LOOKUP_MISS",
    "LOOKUP_HIT",
    "LOOKUP_PENDING",
    # manager and policies
    "CPUOffloadingManager",
    "OffloadingStats",
    "FilteredReuseManager",
    "RequestHooksManager",
    "LookupResult",
    "CachePolicy",
    "register_policy",
    "get_policy_class",
    "available_policies",
    # data path
    "KVCacheTable",
    "GenericLayout",
    "KernelBackend",
    "get_backend",
    "register_backend",
    "available_backends",
    "kernel_mode",
    "HostPool",
    "TransferWorker",
    "TransferResult",
    # scheduler
    "OffloadingScheduler",
    "OffloadingSchedulerConfig",
    "GroupOffloadConfig",
    "ScheduledRequest",
    "SchedulerStepOutput",
    "TransferJob",
    "FinishedJob",
    "maximal_prefix_lookup",
    "sliding_window_lookup",
]
