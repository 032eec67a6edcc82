"""The :class:`KernelBackend` interface every pack/unpack backend implements.

Kept apart from :mod:`kvoffload.kernels.registry` so that backend modules (which subclass it) and
the registry (which names them) do not import each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch

from kvoffload.errors import BackendUnavailableError
from kvoffload.kernels.job import CopyJob, validate_job
from kvoffload.kernels.layout import KVCacheTable

__all__ = ["KernelBackend"]


class KernelBackend(ABC):
    """Moves packed block records between a :class:`KVCacheTable` and a host buffer.

    Subclasses set ``name``, implement :meth:`is_available` and :meth:`_copy` (which receives an
    already validated :class:`CopyJob`); :meth:`pack`/:meth:`unpack` validate first, so a
    subclass never sees bad input. Out-of-tree backends may also override ``pack``/``unpack``
    entirely; the conformance suite (:mod:`kvoffload.testing`) checks the contract either way.
    """

    name: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def is_available(cls, device: torch.device) -> bool:
        """Whether this backend can move a KV cache that lives on ``device``."""

    def pack(
        self,
        table: KVCacheTable,
        host: torch.Tensor,
        block_ids: np.ndarray,
        group_ids: np.ndarray,
        host_offsets: np.ndarray,
    ) -> None:
        """GPU pages -> host records.

        For each ``i``: the record of GPU block ``block_ids[i]`` of group ``group_ids[i]`` (all its
        views' pages, each at its ``record_offset``) is written to
        ``host[host_offsets[i] : host_offsets[i] + table.groups[group_ids[i]].record_bytes]``.
        ``host`` is a 1-D ``torch.uint8`` CPU tensor (pinned when ``table.device`` is CUDA);
        ``block_ids``/``host_offsets`` int64, ``group_ids`` int32 (numpy, same length).
        Enqueued on the current CUDA stream of ``table.device`` (no host sync); synchronous on
        CPU. Everything is validated first: typed errors before any byte is written.
        """
        job = validate_job(table, host, block_ids, group_ids, host_offsets, to_host=True)
        self._check_device(table.device)
        if job.total_bytes:
            self._copy(job, to_host=True)

    def unpack(
        self,
        table: KVCacheTable,
        host: torch.Tensor,
        block_ids: np.ndarray,
        group_ids: np.ndarray,
        host_offsets: np.ndarray,
    ) -> None:
        """Host records -> GPU pages; same arguments as :meth:`pack`, reverse direction."""
        job = validate_job(table, host, block_ids, group_ids, host_offsets, to_host=False)
        self._check_device(table.device)
        if job.total_bytes:
            self._copy(job, to_host=False)

    def prepare(self, table: KVCacheTable, host_alignment: int = 1) -> None:  # noqa: B027 - optional hook
        """Build per-table device state and compile both directions ahead of the first job.

        Called once by the transfer worker at construction so that nothing on the submit path
        compiles or waits for the device. ``host_alignment``: a power of two dividing the host
        buffer address and every host offset the caller will use. Default: nothing to do.
        """

    def _check_device(self, device: torch.device) -> None:
        if not type(self).is_available(device):
            raise BackendUnavailableError(f"kernel backend {self.name!r} cannot run on {device}")

    @abstractmethod
    def _copy(self, job: CopyJob, to_host: bool) -> None:
        """Move the bytes of a validated, non-empty job (``to_host``: pack, else unpack)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
