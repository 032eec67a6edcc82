"""Validation of one pack/unpack job, shared by every backend.

A job is ``(table, host, block_ids, group_ids, host_offsets)``: for each ``i`` the record of GPU
block ``block_ids[i]`` of group ``group_ids[i]`` (``table.groups[g].record_bytes`` bytes: every
view's page at its ``record_offset``) lives at ``host[host_offsets[i]:][:record_bytes]``.
:func:`validate_job` checks everything a kernel relies on and raises a typed error *before*
anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvoffload.checks import INT64_MAX, check_int_array
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.layout import KVCacheTable

__all__ = ["CopyJob", "validate_job", "as_index_array"]


@dataclass(frozen=True)
class CopyJob:
    """One validated pack/unpack job of a kernel backend (the records it copies between the KV
    cache and one host buffer). Arrays are 1-D ``np.int64`` of equal length ``n``.

    Not the scheduler's :class:`~kvoffload.engine.scheduler.jobs.TransferJob` (one request's transfer
    handed to the workers); a worker turns a transfer into copy jobs.

    ``record_bytes[i]`` is the record size of entry ``i`` (0 for blocks of empty groups);
    ``total_bytes`` is their sum (the bytes the job moves).
    """

    table: KVCacheTable
    host: torch.Tensor
    block_ids: np.ndarray
    group_ids: np.ndarray
    host_offsets: np.ndarray
    record_bytes: np.ndarray
    total_bytes: int

    @property
    def n(self) -> int:
        return int(self.block_ids.shape[0])


def as_index_array(x: Any, name: str) -> np.ndarray:
    """``x`` (a sequence of ints, an integer array or an integer tensor) as a 1-D ``np.int64``
    array: :func:`kvoffload.checks.check_int_array` after moving a tensor to numpy."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
            raise InvalidTypeError(f"{name} must hold integers, got a tensor of {x.dtype}")
        x = x.detach().cpu().numpy()
    return check_int_array(x, name)


def _check_host(table: KVCacheTable, host: Any) -> None:
    if not isinstance(host, torch.Tensor):
        raise InvalidTypeError(f"host must be a torch.Tensor, got {type(host).__name__}")
    if host.dtype != torch.uint8:
        raise InvalidTypeError(f"host must have dtype torch.uint8, got {host.dtype}")
    if host.dim() != 1:
        raise InvalidArgumentError(f"host must be 1-D, got shape {list(host.shape)}")
    if host.numel() > 1 and host.stride(0) != 1:
        raise InvalidArgumentError(f"host must be contiguous, got stride {host.stride(0)}")
    if host.device.type != "cpu":
        raise InvalidArgumentError(f"host must be a CPU tensor, got device {host.device}")
    if table.device.type == "cuda" and not host.is_pinned():
        raise InvalidArgumentError(
            f"host must be pinned (page-locked) memory when the KV cache is on {table.device}: "
            "the kernels access it directly"
        )


def validate_job(
    table: Any,
    host: Any,
    block_ids: Any,
    group_ids: Any,
    host_offsets: Any,
    *,
    to_host: bool,
) -> CopyJob:
    """Check a pack (``to_host=True``) or unpack job; return it normalised.

    Errors (all raised before anything is written):
    ``table`` not a :class:`KVCacheTable`; ``host`` not a 1-D contiguous CPU ``torch.uint8`` tensor, or
    not pinned while the cache is on CUDA; index arrays that are not 1-D integers or differ in
    length; a group id outside ``[0, num_groups)``; a block id outside ``[0, num_blocks)`` of its
    group (negative for empty groups); a record outside ``host``; for pack, records that overlap
    each other in ``host``; for unpack, the same block of a group written twice.
    """
    if not isinstance(table, KVCacheTable):
        raise InvalidTypeError(f"table must be a KVCacheTable, got {type(table).__name__}")
    _check_host(table, host)
    bids = as_index_array(block_ids, "block_ids")
    gids = as_index_array(group_ids, "group_ids")
    offs = as_index_array(host_offsets, "host_offsets")
    if not (len(bids) == len(gids) == len(offs)):
        raise InvalidArgumentError(
            f"block_ids, group_ids and host_offsets must have the same length, got "
            f"{len(bids)}, {len(gids)} and {len(offs)}"
        )
    n = len(bids)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return CopyJob(table, host, bids, gids, offs, empty, 0)
    ng = table.num_groups
    bad = (gids < 0) | (gids >= ng)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgumentError(f"group_ids[{i}] = {int(gids[i])} is out of range [0, {ng})")
    nblocks = np.array([g.num_blocks for g in table.groups], dtype=np.int64)
    nviews = np.array([len(g.views) for g in table.groups], dtype=np.int64)
    rbytes_g = np.array([g.record_bytes for g in table.groups], dtype=np.int64)
    limit = np.where(nviews[gids] > 0, nblocks[gids], INT64_MAX)
    bad = (bids < 0) | (bids >= limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        g = int(gids[i])
        raise InvalidArgumentError(
            f"block_ids[{i}] = {int(bids[i])} is out of range [0, {table.groups[g].num_blocks}) for group {g}"
        )
    rb = rbytes_g[gids]
    hsize = host.numel()
    bad = (offs < 0) | (offs > hsize - rb)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgumentError(
            f"host_offsets[{i}] = {int(offs[i])}: the record [{int(offs[i])}, {int(offs[i]) + int(rb[i])}) "
            f"does not fit in host ({hsize} bytes)"
        )
    moving = rb > 0
    if to_host:
        o, r = offs[moving], rb[moving]
        if len(o) > 1:
            order = np.argsort(o, kind="stable")
            o, r = o[order], r[order]
            clash = o[1:] < o[:-1] + r[:-1]
            if clash.any():
                k = int(np.flatnonzero(clash)[0])
                raise InvalidArgumentError(
                    f"host records overlap: offsets {int(o[k])} (+{int(r[k])} bytes) and {int(o[k + 1])}"
                )
    else:
        b, g = bids[moving], gids[moving]
        if len(b) > 1:
            key = g * (int(nblocks.max()) + 1) + b
            uniq, counts = np.unique(key, return_counts=True)
            if (counts > 1).any():
                dup = int(uniq[np.flatnonzero(counts > 1)[0]])
                span = int(nblocks.max()) + 1
                raise InvalidArgumentError(
                    f"block {dup % span} of group {dup // span} appears more than once in an unpack job"
                )
    return CopyJob(table, host, bids, gids, offs, rb, int(rb.sum()))
