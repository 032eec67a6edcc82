"""kvoffload: move an LLM engine's paged KV cache between GPU memory and a pinned CPU pool.

This package's namespace is the engine-facing API (``__all__``); internal helpers stay in their
modules. What an engine uses, and the shapes it hands over:

* **Keys** -- an :data:`OffloadKey` is ``bytes``: a block's chained hash followed by its KV-cache
  group index as 4 big-endian bytes (:func:`make_offload_key`, :func:`get_offload_block_hash`,
  :func:`get_offload_group_idx`). An offloaded block's key is that of the last hash block in it.
* **Manager** (scheduler process, no torch) -- :class:`CPUOffloadingManager` (the
  :class:`OffloadingManager` contract: ``lookup`` / ``lookup_batch`` -> one ``np.int8`` code per
  key, :data:`LOOKUP_MISS` / :data:`LOOKUP_HIT` / :data:`LOOKUP_PENDING`, the values of
  :class:`LookupCode`; ``prepare_store`` -> :class:`PrepareStoreOutput`; ``take_events`` ->
  :class:`OffloadingEvent`; ``get_stats`` -> :class:`OffloadingStats`; ``store_threshold=``
  stores only reused keys, ``record_requests=True`` adds vLLM's per-request hooks); every
  request-facing call takes a :class:`ReqContext`. Eviction policies by name (``"lru"``,
  ``"arc"``, ``"s3fifo"``...) from :func:`register_policy` / :func:`get_policy_class` /
  :func:`available_policies`, subclasses of :class:`CachePolicy`.
* **Specs** -- :class:`GPULoadStoreSpec` (GPU block ids ordered by group, ``group_sizes[g]`` of
  group ``g``, ``block_indices[g]`` = index within the request of group ``g``'s first block) and
  :class:`CPULoadStoreSpec` (one host slot id per offloaded block), both
  :class:`BlockIDsLoadStoreSpec` (a read-only 1-D ``np.int64`` array) of :class:`LoadStoreSpec`.
* **Scheduler** -- :class:`OffloadingScheduler` with :class:`OffloadingSchedulerConfig` (one
  :class:`GroupOffloadConfig` per KV-cache group: GPU block size, offloaded block size, sliding
  window, block pool): lookups, ``build_step`` -> :class:`SchedulerStepOutput` of
  :class:`TransferJob` (``(src, dst)`` specs and the keys moved), ``complete_jobs`` ->
  :class:`FinishedJob`; the engine describes each step's requests with :class:`ScheduledRequest`.
* **Worker** (GPU worker process) -- :class:`KVCacheTable` registers the KV cache: per group, a
  list of per-layer tensors in a layout, ``"flash_attn"`` ``[2, num_blocks, block_size, heads,
  head_dim]``, ``"flashinfer"`` ``[num_blocks, 2, block_size, heads, head_dim]``, ``"mla"``
  ``[num_blocks, block_size, dim]`` or a :class:`GenericLayout`; a group's *record* is the packed
  bytes of one GPU block (the page of every distinct layer view, back to back). :class:`TransferWorker` moves jobs
  between it and its :class:`HostPool` (``num_cpu_blocks`` slots of ``max_g(factor_g *
  record_bytes_g)`` bytes; an offloaded block of group ``g`` is ``factor_g`` records in one slot)
  and reports :class:`TransferResult` s. Kernel backends by name (``"triton"``, ``"torch"``,
  ``"page_loop"``) from :func:`get_backend` / :func:`register_backend` /
  :func:`available_backends`, subclasses of :class:`KernelBackend`.
* **Errors** -- everything raised on bad input or a failed transfer is a :class:`KVOffloadError`.

Layers (imports run downward only):

* :mod:`kvoffload.kernels` -- Triton pack/unpack kernels (GPU pages <-> packed host records),
  a pure-torch reference, the backend registry.
* :mod:`kvoffload.core` -- core types: keys, request context, load/store specs, the manager contract.
* :mod:`kvoffload.cache` -- the numpy-backed :class:`CPUOffloadingManager`, eviction policies, the
  reuse filter (what the engine's scheduler process runs; no torch).
* :mod:`kvoffload.transfer` -- the pinned host pool and the transfer worker (what a GPU worker runs).
* :mod:`kvoffload.engine` -- the engine kit: the scheduler (lookups, touch, load/store jobs, vLLM
  semantics; its names re-exported here), the tiered manager, a reference engine loop.
* :mod:`kvoffload.simulate`, :mod:`kvoffload.app` (not imported here) -- the sizing tool; the
  command line.
* :mod:`kvoffload.integrations.vllm` (not imported here; imports vLLM) -- kvoffload as the backend
  of vLLM's ``OffloadingConnector``.

Importing kvoffload never initialises CUDA, and never imports torch: the names above are
imported from their modules on first use (the worker's, :class:`KVCacheTable`,
:class:`TransferWorker`..., import torch; the manager's and the scheduler's, numpy).
"""

from __future__ import annotations

import importlib as _importlib
import logging
import typing as _typing

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

if _typing.TYPE_CHECKING:
    from kvoffload.cache.manager import CPUOffloadingManager, OffloadingStats
    from kvoffload.cache.policies import CachePolicy, available_policies, get_policy_class, register_policy
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
    )
    from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING, LookupCode
    from kvoffload.engine.scheduler import (
        FinishedJob,
        GroupOffloadConfig,
        OffloadingScheduler,
        OffloadingSchedulerConfig,
        ScheduledRequest,
        SchedulerStepOutput,
        TransferJob,
    )
    from kvoffload.kernels import (
        GenericLayout,
        KernelBackend,
        KVCacheTable,
        available_backends,
        get_backend,
        register_backend,
    )
    from kvoffload.transfer.host_pool import HostPool
    from kvoffload.transfer.result import TransferResult
    from kvoffload.transfer.worker import TransferWorker

__version__ = "0.1.0"

#: the names imported on first use, by home module: ``import kvoffload`` (and so the import of
#: any subpackage, ``kvoffload.tiers``, ``kvoffload.cache``...) loads only the errors (no numpy);
#: a scheduler process or a sizing tool never loads the worker's names (torch), a
#: worker never loads the manager's or the scheduler's
_LAZY_BY_MODULE = {
    "kvoffload.core.base": (
        "BlockIDsLoadStoreSpec",
        "CPULoadStoreSpec",
        "GPULoadStoreSpec",
        "LoadStoreSpec",
        "OffloadingEvent",
        "OffloadingManager",
        "OffloadKey",
        "PrepareStoreOutput",
        "ReqContext",
        "get_offload_block_hash",
        "get_offload_group_idx",
        "make_offload_key",
    ),
    "kvoffload.core.lookup_code": ("LOOKUP_HIT", "LOOKUP_MISS", "LOOKUP_PENDING", "LookupCode"),
    "kvoffload.cache.manager": ("CPUOffloadingManager", "OffloadingStats"),
    "kvoffload.cache.policies": ("CachePolicy", "available_policies", "get_policy_class", "register_policy"),
    "kvoffload.engine.scheduler": (
        "FinishedJob",
        "GroupOffloadConfig",
        "OffloadingScheduler",
        "OffloadingSchedulerConfig",
        "ScheduledRequest",
        "SchedulerStepOutput",
        "TransferJob",
    ),
    "kvoffload.kernels": (
        "GenericLayout",
        "KernelBackend",
        "KVCacheTable",
        "available_backends",
        "get_backend",
        "register_backend",
    ),
    "kvoffload.transfer.host_pool": ("HostPool",),
    "kvoffload.transfer.result": ("TransferResult",),
    "kvoffload.transfer.worker": ("TransferWorker",),
}
_LAZY = {name: module for module, names in _LAZY_BY_MODULE.items() for name in names}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvoffload' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "LookupCode",
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
]
