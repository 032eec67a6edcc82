"""Pure-torch reference backend (``"torch"``): the CPU default, also usable on CUDA.

Per group of the job and per view, with every tensor viewed as the widest integer word
(8/4/2/1 bytes) that the addresses, strides, page sizes and host offsets allow (byte-wise
indexing in torch is an order of magnitude slower):

* pack: gather the view's pages of the job's blocks (``index_select``), scatter them into the
  view's columns of the host records (``index_copy_``);
* unpack: the reverse.

Host rows are addressed as a strided ``[rows, record_words]`` view when every offset is a multiple
of some ``d >= record_bytes`` (records at slot boundaries, the usual case), otherwise through a
flat element index. On CUDA the host side is copied record by record with ``non_blocking=True``
on the current stream (the host buffer is pinned), so nothing waits on the device.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.device import upload
from kvoffload.kernels.job import CopyJob
from kvoffload.kernels.layout import GroupTable

__all__ = ["TorchBackend"]

_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _word(values: list[int]) -> int:
    """Largest of 8/4/2/1 dividing every value."""
    bits = 0
    for v in values:
        bits |= v
    w = 8
    while bits % w:
        w //= 2
    return w


def _typed(
    t: torch.Tensor, byte_offset: int, shape: tuple[int, ...], byte_strides: tuple[int, ...], w: int
) -> torch.Tensor:
    """A view of ``t``'s storage as ``w``-byte words (offset/strides given in bytes, multiples of ``w``)."""
    storage = t.untyped_storage()
    out = torch.empty(0, dtype=_WORD_DTYPES[w], device=t.device)
    out.set_(storage, byte_offset // w, shape, tuple(s // w for s in byte_strides))
    return out


class TorchBackend(KernelBackend):
    """Reference implementation with plain torch indexing (a few ops per group of the job)."""

    name = "torch"

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        device = torch.device(device)
        if device.type == "cpu":
            return True
        return device.type == "cuda" and torch.cuda.is_available()

    def _copy(self, job: CopyJob, to_host: bool) -> None:
        dev = job.table.device
        ctx = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
        with ctx:
            for g in np.unique(job.group_ids):
                group = job.table.groups[int(g)]
                if group.views:
                    sel = np.flatnonzero(job.group_ids == g)
                    self._copy_group(job, group, sel, to_host)

    @staticmethod
    def _copy_group(job: CopyJob, group: GroupTable, sel: np.ndarray, to_host: bool) -> None:
        host, dev = job.host, job.table.device
        on_cuda = dev.type == "cuda"
        offsets = job.host_offsets[sel]
        rb = group.record_bytes
        host_rel = host.data_ptr() - host.untyped_storage().data_ptr()
        vals = [host_rel, rb, *offsets.tolist()] if not on_cuda else [rb]
        for v in group.views:
            vals += [v.ptr - v.pages.untyped_storage().data_ptr(), v.block_stride, v.page_bytes]
        w = _word(vals)
        pages = [
            _typed(
                v.pages,
                v.ptr - v.pages.untyped_storage().data_ptr(),
                (v.num_blocks, v.page_bytes // w),
                (v.block_stride, w),
                w,
            )
            for v in group.views
        ]
        ids = upload(job.block_ids[sel], dev)
        n, rw = len(sel), rb // w
        if on_cuda:
            host_w = host.view(torch.uint8)
            if to_host:
                records = torch.cat([p.index_select(0, ids) for p in pages], dim=1).view(torch.uint8)
                for j, off in enumerate(offsets.tolist()):
                    host_w[off : off + rb].copy_(records[j], non_blocking=True)
            else:
                records_b = torch.empty((n, rb), dtype=torch.uint8, device=dev)
                for j, off in enumerate(offsets.tolist()):
                    records_b[j].copy_(host_w[off : off + rb], non_blocking=True)
                records = records_b.view(_WORD_DTYPES[w])
                col = 0
                for v, p in zip(group.views, pages, strict=True):
                    p.index_copy_(0, ids, records[:, col : col + v.page_bytes // w])
                    col += v.page_bytes // w
            return
        # CPU, one view at a time (no record-sized temporaries): host rows as words, strided rows
        # when the offsets allow, else a flat element index per view
        d = int(np.gcd.reduce(offsets))
        if d >= rb:
            nrows = int(offsets.max()) // d + 1
            rows = _typed(host, host_rel, (nrows, rw), (d, w), w)
            row_idx = torch.from_numpy(offsets // d)
        else:
            flat_host = _typed(host, host_rel, (host.numel() // w,), (w,), w)
            starts = offsets // w
        col = 0
        for v, p in zip(group.views, pages, strict=True):
            pw = v.page_bytes // w
            if d >= rb:
                dst = rows[:, col : col + pw]
                if to_host:
                    dst.index_copy_(0, row_idx, p.index_select(0, ids))
                else:
                    p.index_copy_(0, ids, dst.index_select(0, row_idx))
            else:
                flat = torch.from_numpy((starts + col)[:, None] + np.arange(pw, dtype=np.int64)).reshape(-1)
                if to_host:
                    flat_host.index_put_((flat,), p.index_select(0, ids).reshape(-1))
                else:
                    p.index_copy_(0, ids, flat_host[flat].view(n, pw))
            col += pw
