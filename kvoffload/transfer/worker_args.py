"""Argument checks of :class:`~kvoffload.transfer.worker.TransferWorker`: block size factors,
backend choice, the engine's "KV is ready" signal and a job's id and spec pair. Everything here
raises typed errors before the worker allocates or enqueues anything."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from kvoffload.checks import check_int
from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import get_backend

logger = logging.getLogger(__name__)

__all__ = ["block_size_factors", "resolve_backend", "producer_events", "job_spec"]

#: (type of spec[0], type of spec[1]) -> store (True) or load (False)
_DIRECTIONS: dict[tuple[type, type], bool] = {
    (GPULoadStoreSpec, CPULoadStoreSpec): True,
    (CPULoadStoreSpec, GPULoadStoreSpec): False,
}


def _group_factor(table: KVCacheTable, g: int, entry: Any) -> int:
    """Factor of group ``g`` from an int or from an object with ``gpu_block_size``/``offloaded_block_size``."""
    where = f"block_size_factors[{g}]"
    if hasattr(entry, "gpu_block_size") and hasattr(entry, "offloaded_block_size"):
        gpu = check_int(entry.gpu_block_size, f"{where}.gpu_block_size", 1)
        off = check_int(entry.offloaded_block_size, f"{where}.offloaded_block_size", 1)
        if off % gpu:
            raise InvalidArgumentError(f"{where}: offloaded_block_size {off} is not a multiple of gpu_block_size {gpu}")
        known = table.groups[g].tokens_per_block
        if known is not None and table.groups[g].views and known != gpu:
            raise InvalidArgumentError(
                f"{where}: gpu_block_size is {gpu} but the KV-cache tensors of group {g} hold {known} tokens per block"
            )
        return off // gpu
    return check_int(entry, where, 1)


def block_size_factors(table: KVCacheTable, value: Any) -> list[int]:
    """Per-group factors (offloaded block size / GPU block size), checked against the table.

    ``value``: one int for every group, or one entry per group -- an int, or an object with
    ``gpu_block_size`` and ``offloaded_block_size`` (e.g. the scheduler's ``GroupOffloadConfig``),
    whose quotient must be whole and whose GPU block size must match the tensors' where the
    layout tells it.
    """
    groups = len(table.groups)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [check_int(value, "block_size_factors", 1)] * groups
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != groups:
            raise InvalidArgumentError(f"block_size_factors must have one entry per group ({groups}), got {len(value)}")
        return [_group_factor(table, g, e) for g, e in enumerate(value)]
    raise InvalidTypeError(f"block_size_factors must be an int or a sequence of ints, got {type(value).__name__}")


def resolve_backend(
    backend: str | KernelBackend | None, device: torch.device, max_programs: int | None
) -> KernelBackend:
    """A backend instance for ``device`` (see the ``backend``/``max_programs`` arguments of the worker)."""
    if backend is None or isinstance(backend, str):
        be = get_backend(backend, device)
        if max_programs is not None:
            if "num_programs" in inspect.signature(type(be).__init__).parameters:
                be = type(be)(num_programs=max_programs)  # type: ignore[call-arg]
            else:
                logger.debug("backend %s launches no programs; max_programs ignored", type(be).__name__)
        return be
    if isinstance(backend, KernelBackend):
        if max_programs is not None:
            raise InvalidArgumentError(
                "max_programs applies to a backend chosen by name; configure a backend instance "
                "yourself (e.g. TritonBackend(num_programs=...))"
            )
        if not type(backend).is_available(device):
            raise BackendUnavailableError(f"backend {type(backend).__name__} cannot run on device {device}")
        return backend
    raise InvalidTypeError(f"backend must be a name, a KernelBackend instance or None, got {type(backend).__name__}")


def producer_events(after: Any, cuda: bool) -> list[Any]:
    """``after`` of ``transfer_async`` as a list of CUDA events/streams (empty: the current stream).

    Accepts None, a ``torch.cuda.Event``, a ``torch.cuda.Stream`` or a sequence of them. Without
    CUDA only None (or an empty sequence) is accepted.
    """
    if after is None:
        return []
    items = list(after) if isinstance(after, (list, tuple)) else [after]
    if not cuda:
        if items:
            raise InvalidArgumentError("after: the KV cache is not on CUDA, there is no stream or event to wait for")
        return []
    for i, item in enumerate(items):
        if not isinstance(item, (torch.cuda.Event, torch.cuda.Stream)):
            raise InvalidTypeError(
                f"after[{i}] must be a torch.cuda.Event or torch.cuda.Stream, got {type(item).__name__}"
            )
    return items


def job_spec(
    job_id: object, spec: object, unreported: Collection[int]
) -> tuple[int, GPULoadStoreSpec, CPULoadStoreSpec, bool]:
    """``transfer_async``'s ``job_id`` and ``spec`` as ``(job id, GPU spec, CPU spec, store)``;
    ``unreported``: the ids in use (accepted, result not returned yet)."""
    jid = check_int(job_id, "job_id")
    if jid in unreported:
        raise InvalidArgumentError(f"job_id {jid} is already in flight or not reported yet")
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise InvalidTypeError(f"spec must be a (src_spec, dst_spec) pair, got {type(spec).__name__}")
    src, dst = spec
    store = _DIRECTIONS.get((type(src), type(dst)))  # the spec classes themselves: one lookup
    if store is not None:
        return (jid, src, dst, True) if store else (jid, dst, src, False)
    if isinstance(src, GPULoadStoreSpec) and isinstance(dst, CPULoadStoreSpec):
        return jid, src, dst, True
    if isinstance(src, CPULoadStoreSpec) and isinstance(dst, GPULoadStoreSpec):
        return jid, dst, src, False
    if not isinstance(src, LoadStoreSpec) or not isinstance(dst, LoadStoreSpec):
        raise InvalidTypeError(f"spec must hold two LoadStoreSpecs, got ({type(src).__name__}, {type(dst).__name__})")
    raise InvalidTypeError(
        "spec must be (GPULoadStoreSpec, CPULoadStoreSpec) for a store or (CPULoadStoreSpec, "
        f"GPULoadStoreSpec) for a load, got ({type(src).__name__}, {type(dst).__name__})"
    )
