"""``"page_loop"`` backend (CUDA only): one asynchronous copy per page -- the baseline engines use today.

For every (block x view) of a job it issues one ``copy_(..., non_blocking=True)`` between the
page in GPU memory and its place in the pinned host record, i.e. one ``cudaMemcpyAsync`` per
page on the current stream. It exists for the benchmarks (``bench/bench_transfer.py``) to show
what a single launch per job saves; it is correct but slow for small pages.
"""

from __future__ import annotations

import torch

from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.job import CopyJob

__all__ = ["PageLoopBackend"]


class PageLoopBackend(KernelBackend):
    """One ``cudaMemcpyAsync`` (via ``Tensor.copy_``) per page, on the current CUDA stream."""

    name = "page_loop"

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        return torch.device(device).type == "cuda" and torch.cuda.is_available()

    def _copy(self, job: CopyJob, to_host: bool) -> None:
        table, host = job.table, job.host
        with torch.cuda.device(table.device):
            entries = zip(job.block_ids.tolist(), job.group_ids.tolist(), job.host_offsets.tolist(), strict=True)
            for b, g, off in entries:
                for v in table.groups[g].views:
                    page = v.pages[b]
                    dst = host[off + v.record_offset : off + v.record_offset + v.page_bytes]
                    if to_host:
                        dst.copy_(page, non_blocking=True)
                    else:
                        page.copy_(dst, non_blocking=True)
