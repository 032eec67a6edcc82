"""Job tables reused from launch to launch, in memory the kernel reads directly.

A job table is ``int64[capacity, 3]`` (see :data:`~kvoffload.kernels.backend.JOB_TABLE_COLUMNS`):
the transfer worker writes a job's rows into one and launches the kernel on its address; the
table goes back to :class:`JobTables` when that launch is reported, and the next job reuses it.
On CUDA the tables are pinned (the kernel reads them over the host link, no upload per job); a
table is allocated only when more are in flight, or a bigger one is needed, than ever before.
"""

from __future__ import annotations

import numpy as np
import torch

from kvoffload.kernels.backend import JOB_TABLE_COLUMNS

__all__ = ["JobTable", "JobTables"]

_ROW_BYTES = JOB_TABLE_COLUMNS * 8


class JobTable:
    """One table: ``rows`` (``int64[capacity, 3]``, a numpy view) at ``address`` (16-byte aligned)."""

    __slots__ = ("rows", "address", "capacity", "_memory")

    def __init__(self, memory: torch.Tensor, capacity: int) -> None:
        self._memory = memory  # keeps the bytes alive
        self.rows: np.ndarray = memory.numpy().view(np.int64).reshape(capacity, JOB_TABLE_COLUMNS)
        self.address: int = memory.data_ptr()
        self.capacity = capacity


class JobTables:
    """Free job tables by capacity (powers of two, at least ``min_rows``).

    Args:
        pinned: allocate pinned memory (a KV cache on CUDA), else plain host memory.
        min_rows: the smallest capacity.
        preallocate: tables of ``min_rows`` allocated now, so that the first jobs allocate nothing.
    """

    def __init__(self, pinned: bool, min_rows: int = 1024, preallocate: int = 4) -> None:
        self._pinned = pinned
        self._min_rows = min_rows
        self._free: dict[int, list[JobTable]] = {}
        for _ in range(preallocate):
            self.give(self._allocate(min_rows))

    def _allocate(self, capacity: int) -> JobTable:
        nbytes = capacity * _ROW_BYTES
        memory = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pinned)
        table = JobTable(memory, capacity)
        if table.address % 16:  # the kernels are compiled for 16-byte aligned table addresses
            raise RuntimeError(f"job table at 0x{table.address:x} is not 16-byte aligned")
        return table

    def take(self, rows: int) -> JobTable:
        """A free table of at least ``rows`` rows (allocated if none is free)."""
        capacity = self._min_rows
        while capacity < rows:
            capacity *= 2
        free = self._free.get(capacity)
        return free.pop() if free else self._allocate(capacity)

    def give(self, table: JobTable) -> None:
        """``table`` is free again (its launch has completed)."""
        self._free.setdefault(table.capacity, []).append(table)
