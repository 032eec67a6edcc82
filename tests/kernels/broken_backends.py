"""Deliberately wrong out-of-tree backends: the conformance suite must fail them."""

from __future__ import annotations

from typing import Any

import torch

from kvoffload.kernels.job import CopyJob
from kvoffload.kernels.torch_ref import TorchBackend


class ShiftedRecords(TorchBackend):
    """Writes/reads each record one byte late (an off-by-one in the host offset)."""

    name = "broken-shifted"

    def _copy(self, job: CopyJob, to_host: bool) -> None:
        shifted = CopyJob(
            job.table, job.host, job.block_ids, job.group_ids, job.host_offsets + 1, job.record_bytes, job.total_bytes
        )
        super()._copy(shifted, to_host)


class SkipsLastView(TorchBackend):
    """Forgets the last view of every group (e.g. the V half of the last layer)."""

    name = "broken-skip"

    def _copy(self, job: CopyJob, to_host: bool) -> None:
        for b, g, off in zip(job.block_ids.tolist(), job.group_ids.tolist(), job.host_offsets.tolist(), strict=True):
            for v in job.table.groups[g].views[:-1]:
                dst = job.host[off + v.record_offset : off + v.record_offset + v.page_bytes]
                if to_host:
                    dst.copy_(v.pages[b])
                else:
                    v.pages[b].copy_(dst)


class NoValidation(TorchBackend):
    """Skips validation: clamps out-of-range input instead of raising."""

    name = "broken-novalidate"

    def pack(self, table: Any, host: torch.Tensor, block_ids: Any, group_ids: Any, host_offsets: Any) -> None:
        return None

    def unpack(self, table: Any, host: torch.Tensor, block_ids: Any, group_ids: Any, host_offsets: Any) -> None:
        return None
