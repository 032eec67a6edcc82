"""Data path: Triton pack/unpack kernels, their torch reference, the backend registry.

Imports nothing else of kvoffload except :mod:`kvoffload.errors`: kernels know bytes and block
ids, not keys. Importing this package does not import triton (backends load lazily).

* :class:`KVCacheTable` -- an engine's KV tensors (flash-attn ``[2, num_blocks, block_size, heads,
  head_dim]``, flashinfer ``[num_blocks, 2, block_size, heads, head_dim]``, MLA ``[num_blocks,
  block_size, dim]`` or :class:`GenericLayout`) canonicalised into byte views per group.
* :class:`KernelBackend` -- ``pack`` (GPU pages -> packed host records) and ``unpack`` (reverse),
  one launch per job; :func:`get_backend` picks ``triton``/``torch``/``page_loop``/``module:Class``
  (env ``KVOFFLOAD_BACKEND``). A backend may also :meth:`~KernelBackend.bind` its kernel to one
  cache and host buffer (a :class:`BoundKernel`): launches on job tables the caller writes, the
  transfer worker's per-job path.
* :class:`DataPath` -- per job, the ``direct`` path (the kernel reads/writes the pinned pool), the
  ``staged`` path (copy engines + a bounded GPU staging ring + the kernel inside GPU memory) or the
  copy-engine-only ``dma`` path, chosen from the per-GPU config (``configs/*.json``).
"""

from kvoffload.kernels.backend import JOB_TABLE_COLUMNS, BoundKernel
from kvoffload.kernels.layout import GenericLayout, GroupTable, KVCacheTable, LayoutSpec, PageView
from kvoffload.kernels.paths import DataPath
from kvoffload.kernels.registry import (
    ENV_BACKEND,
    KernelBackend,
    available_backends,
    get_backend,
    kernel_mode,
    register_backend,
    registered_backends,
)

__all__ = [
    "KVCacheTable",
    "GenericLayout",
    "LayoutSpec",
    "PageView",
    "GroupTable",
    "KernelBackend",
    "BoundKernel",
    "JOB_TABLE_COLUMNS",
    "DataPath",
    "get_backend",
    "register_backend",
    "available_backends",
    "registered_backends",
    "kernel_mode",
    "ENV_BACKEND",
]
