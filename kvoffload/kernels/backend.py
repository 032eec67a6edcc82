"""The :class:`KernelBackend` interface every pack/unpack backend implements.

Kept apart from :mod:`kvoffload.kernels.registry` so that backend modules (which subclass it) and
the registry (which names them) do not import each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch

from kvoffload.errors import BackendUnavailableError
from kvoffload.kernels.job import CopyJob, validate_job
from kvoffload.kernels.layout import KVCacheTable

__all__ = ["KernelBackend", "BoundKernel", "JOB_TABLE_COLUMNS"]

#: Columns of a job table: one ``int64`` row per block, ``(GPU block id, group id, host offset in
#: units of the bound kernel's ``unit`` bytes)``.
JOB_TABLE_COLUMNS = 3


class BoundKernel(ABC):
    """A backend's kernel bound once to one KV cache and one host buffer.

    For callers that build job tables themselves (the transfer worker): everything fixed for the
    pair is resolved at construction, so a launch costs the host only what changes per job.

    Attributes:
        unit: host offsets in a job table are in units of this many bytes (a power of two
            dividing the host buffer's address and every record offset the caller will use).
        entry: how a launch reaches the device (for logs and benchmarks), e.g. ``"compiled"``.
    """

    unit: int
    entry: str

    @abstractmethod
    def launch(self, table: np.ndarray, address: int, n: int, to_host: bool, stream: Any = None) -> None:
        """Move the ``n`` blocks of the job table ``table`` (``int64[>= n, 3]``, see
        :data:`JOB_TABLE_COLUMNS`; ``address`` is the address of its first row, 16-byte aligned)
        to the host buffer (``to_host``) or back, on ``stream`` (a ``torch.cuda.Stream``; None:
        the current stream; ignored without CUDA, where the launch is synchronous).

        The caller checked the table (ids in range, no overlapping destinations, ``n >= 1``) and
        keeps it unchanged until the launch has completed on the device. On CUDA the table may be
        pinned host memory: the kernel reads it directly.
        """


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

    def bind(self, table: KVCacheTable, host: torch.Tensor, host_alignment: int = 1) -> BoundKernel | None:
        """This backend's kernel bound to ``table`` and the host buffer ``host`` (pinned when the
        cache is on CUDA), for job tables whose host offsets are multiples of ``host_alignment``.

        Default None: the backend has no such entry, callers use :meth:`pack`/:meth:`unpack`.
        """
        return None

    def _check_device(self, device: torch.device) -> None:
        if not type(self).is_available(device):
            raise BackendUnavailableError(f"kernel backend {self.name!r} cannot run on {device}")

    @abstractmethod
    def _copy(self, job: CopyJob, to_host: bool) -> None:
        """Move the bytes of a validated, non-empty job (``to_host``: pack, else unpack)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
