"""Pure-torch reference backend (``"torch"``): the CPU default, also usable on CUDA.

Per group of the job: gather every view's pages of the job's blocks into a ``[n, record_bytes]``
matrix (one ``index_select`` per view), then write the rows to their host offsets. When the host
offsets are all multiples of some ``d >= record_bytes`` the host is viewed as rows of stride ``d``
and written with one ``index_copy_`` (the usual case: records at slot boundaries); otherwise one
slice copy per record. Unpack is the reverse (rows -> records -> one ``index_copy_`` per view).
On CUDA the host side is copied record by record with ``non_blocking=True`` on the current
stream (the host buffer is pinned), so nothing waits on the device.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from kvoffload.kernels.job import TransferJob
from kvoffload.kernels.registry import KernelBackend

__all__ = ["TorchBackend"]


def _host_rows(host: torch.Tensor, offsets: np.ndarray, record_bytes: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(rows, index)`` with ``rows[index[j]] == host[offsets[j]:][:record_bytes]``, or None."""
    d = int(np.gcd.reduce(offsets)) if len(offsets) else 0
    if d < record_bytes:
        return None
    nrows = int(offsets.max()) // d + 1
    rows = host.as_strided((nrows, record_bytes), (d, 1), host.storage_offset())
    return rows, torch.from_numpy(offsets // d)


def _to_device(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class TorchBackend(KernelBackend):
    """Reference implementation with plain torch indexing (a few ops per group of the job)."""

    name = "torch"

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        device = torch.device(device)
        if device.type == "cpu":
            return True
        return device.type == "cuda" and torch.cuda.is_available()

    def _copy(self, job: TransferJob, to_host: bool) -> None:
        table, host = job.table, job.host
        dev = table.device
        on_cuda = dev.type == "cuda"
        ctx = torch.cuda.device(dev) if on_cuda else contextlib.nullcontext()
        with ctx:
            for g in np.unique(job.group_ids):
                group = table.groups[int(g)]
                if not group.views:
                    continue
                sel = np.flatnonzero(job.group_ids == g)
                offsets = job.host_offsets[sel]
                ids = _to_device(job.block_ids[sel], dev)
                rb = group.record_bytes
                rows = None if on_cuda else _host_rows(host, offsets, rb)
                if to_host:
                    parts = [v.pages.index_select(0, ids) for v in group.views]
                    records = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                    if rows is not None:
                        rows[0].index_copy_(0, rows[1], records)
                    else:
                        for j, off in enumerate(offsets.tolist()):
                            host[off:off + rb].copy_(records[j], non_blocking=on_cuda)
                else:
                    if rows is not None:
                        records = rows[0].index_select(0, rows[1])
                    else:
                        records = torch.empty((len(sel), rb), dtype=torch.uint8, device=dev)
                        for j, off in enumerate(offsets.tolist()):
                            records[j].copy_(host[off:off + rb], non_blocking=on_cuda)
                    for v in group.views:
                        v.pages.index_copy_(0, ids, records[:, v.record_offset:v.record_offset + v.page_bytes])

