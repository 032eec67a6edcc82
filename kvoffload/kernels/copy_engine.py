"""Copy-engine (DMA) copies: lists of byte ranges between flat buffers, coalesced and issued in a batch.

A :class:`CopyList` names buffers by index into a list of flat ``uint8`` tensors ("spaces": the
host pool, a GPU staging buffer, the storages behind the KV-cache views) and holds, per copy,
``(dst_space, dst_off, src_space, src_off, size)``. :func:`coalesce` merges copies that are
contiguous on both sides, so a job whose host records sit in consecutive slots becomes a few
large copies (near link rate) instead of one per record or page.

Executors, all enqueued on the current stream (no host sync):

* :class:`TorchCopies` -- one ``Tensor.copy_(non_blocking=True)`` per copy: ``cudaMemcpyAsync`` on
  CUDA, a plain memcpy on CPU tensors (which is how the copy-engine paths are tested without GPU);
* :class:`BatchedCopies` -- CUDA only, every copy of a list in ONE ``cuMemcpyBatchAsync`` call
  through ``cuda.bindings`` (CUDA >= 12.8 driver API), when that module is importable.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = [
    "CopyList",
    "coalesce",
    "CopyExecutor",
    "TorchCopies",
    "BatchedCopies",
    "FallbackCopies",
    "batched_copy_problem",
]


@dataclass(frozen=True)
class CopyList:
    """``int64[5, n]`` rows: dst_space, dst_off, src_space, src_off, size (bytes)."""

    rows: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.rows[4].sum())


def coalesce(
    dst_space: np.ndarray,
    dst_off: np.ndarray,
    src_space: np.ndarray,
    src_off: np.ndarray,
    size: np.ndarray,
    cuts: np.ndarray | None = None,
) -> CopyList:
    """Copies sorted by destination, neighbours merged when contiguous on both sides.

    The copies must not overlap on the destination side (every caller writes each byte once).
    ``cuts``: sorted byte offsets into space 0 (the host pool) that no merged copy may run across
    (where one host registration ends and the next begins: the copy engines refuse such a range);
    a copy given here must not cross one itself.
    """
    n = int(size.size)
    rows = np.empty((5, n), dtype=np.int64)
    if n == 0:
        return CopyList(rows)
    order = np.lexsort((dst_off, dst_space))
    rows[0], rows[1], rows[2], rows[3], rows[4] = (
        dst_space[order],
        dst_off[order],
        src_space[order],
        src_off[order],
        size[order],
    )
    if n > 1:
        joins = (
            (rows[0, 1:] == rows[0, :-1])
            & (rows[2, 1:] == rows[2, :-1])
            & (rows[1, 1:] == rows[1, :-1] + rows[4, :-1])
            & (rows[3, 1:] == rows[3, :-1] + rows[4, :-1])
        )
        if cuts is not None and cuts.size and joins.any():
            joins &= ~_at_cut(rows, cuts)
        if joins.any():
            starts = np.flatnonzero(np.concatenate(([True], ~joins)))
            sizes = np.add.reduceat(rows[4], starts)
            rows = rows[:, starts].copy()
            rows[4] = sizes
    return CopyList(rows)


def _at_cut(rows: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Per copy after the first: it starts at a cut on its space-0 side (host pool offsets)."""
    host = rows[0, 1:] == 0
    off = np.where(host, rows[1, 1:], rows[3, 1:])
    on = host | (rows[2, 1:] == 0)
    k = np.minimum(np.searchsorted(cuts, off), cuts.size - 1)
    return on & (cuts[k] == off)


class CopyExecutor(Protocol):
    """Enqueues a :class:`CopyList` between ``spaces`` on the current stream."""

    @property
    def name(self) -> str: ...

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None: ...


class TorchCopies:
    """One ``copy_(non_blocking=True)`` per copy (``cudaMemcpyAsync`` on CUDA, memcpy on CPU)."""

    name = "torch"

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
        for ds, do, ss, so, n in copies.rows.T.tolist():
            spaces[ds][do : do + n].copy_(spaces[ss][so : so + n], non_blocking=True)


@functools.lru_cache(maxsize=1)
def _driver() -> Any:
    from cuda.bindings import driver  # noqa: PLC0415 - optional dependency

    return driver


@functools.lru_cache(maxsize=1)
def batched_copy_problem() -> str | None:
    """Why :class:`BatchedCopies` cannot be used here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        drv = _driver()
    except Exception as exc:  # noqa: BLE001 - not installed or broken
        return f"cuda.bindings is not importable ({type(exc).__name__}: {exc})"
    if not hasattr(drv, "cuMemcpyBatchAsync"):
        return "cuda.bindings has no cuMemcpyBatchAsync (needs CUDA >= 12.8 bindings)"
    return None


class BatchedCopies:
    """Every copy of a list in one ``cuMemcpyBatchAsync`` (stream-ordered source access)."""

    name = "batched"

    def __init__(self) -> None:
        problem = batched_copy_problem()
        if problem is not None:
            raise RuntimeError(f"batched copies unavailable: {problem}")
        drv = _driver()
        attr = drv.CUmemcpyAttributes()
        attr.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        self._drv = drv
        self._attrs = [attr]

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
        n = len(copies)
        if n == 0:
            return
        drv = self._drv
        base = np.array([s.data_ptr() for s in spaces], dtype=np.int64)
        r = copies.rows
        dst = (base[r[0]] + r[1]).tolist()
        src = (base[r[2]] + r[3]).tolist()
        stream = torch.cuda.current_stream().cuda_stream
        res = drv.cuMemcpyBatchAsync(
            [drv.CUdeviceptr(a) for a in dst],
            [drv.CUdeviceptr(a) for a in src],
            r[4].tolist(),
            n,
            self._attrs,
            [0],
            1,
            drv.CUstream(stream),
        )
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError(f"cuMemcpyBatchAsync failed: {err}")


class FallbackCopies:
    """``primary`` until it fails once (an API it cannot call, an error code), then ``fallback``
    for good, with one warning. The failed list is re-issued through ``fallback``."""

    def __init__(self, primary: CopyExecutor, fallback: CopyExecutor) -> None:
        self.primary: CopyExecutor | None = primary
        self.fallback = fallback

    @property
    def name(self) -> str:
        return self.primary.name if self.primary is not None else self.fallback.name

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
        if self.primary is not None:
            try:
                self.primary.run(spaces, copies)
                return
            except Exception as exc:  # noqa: BLE001 - any failure of the optional API: stop using it
                logger.warning(
                    "%s copies failed (%s: %s); using %s copies from now on",
                    self.primary.name,
                    type(exc).__name__,
                    exc,
                    self.fallback.name,
                )
                self.primary = None
        self.fallback.run(spaces, copies)
