"""kvoffload: move an LLM engine's paged KV cache between GPU memory and a pinned CPU pool.

Layers (imports run downward only):

* :mod:`kvoffload.kernels` -- Triton pack/unpack kernels (GPU pages <-> packed host records),
  a pure-torch reference, the backend registry.
* :mod:`kvoffload.offload` -- core types, the numpy-backed :class:`CPUOffloadingManager`,
  eviction policies, the reuse filter, the pinned host pool and the transfer worker.
* :mod:`kvoffload.scheduler` -- lookups, touch, load/store jobs (vLLM semantics).

Importing kvoffload never initialises CUDA.
"""

from __future__ import annotations

import logging

from kvoffload.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyStateError,
    KVOffloadError,
    TransferError,
)
from kvoffload.offload.base import (
    LOOKUP_HIT,
    LOOKUP_MISS,
    LOOKUP_PENDING,
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

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "KVOffloadError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyStateError",
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
]
