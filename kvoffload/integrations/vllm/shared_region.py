"""kvoffload's host pool as vLLM's shared offload region (``KVOffloadSpec`` with ``secondary_tiers``).

vLLM's secondary tiers run in the scheduler process and read / write the CPU pool through a
memoryview. So with tiers the pool is vLLM's ``SharedOffloadRegion``: a ``/dev/shm`` file
(``vllm_offload_<engine_id>.mmap``) mapped by the scheduler (the whole region, a
``(num_chunks, row_bytes)`` memoryview for the tiers) and by every worker, whose kvoffload
transfer worker keeps its host pool in its own area of each row and page-locks the mapping::

    row c (row_bytes, a whole number of OS pages) = worker 0's slot | worker 1's slot | ... | padding
    worker r's slot for chunk c starts at c * row_bytes + r * worker_bytes

The first process to open the file creates and sizes it; the creator removes it when it closes.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvoffload.errors import InvalidArgumentError

__all__ = ["RegionGeometry", "region_geometry", "open_scheduler_region", "WorkerRegion"]


@dataclass(frozen=True)
class RegionGeometry:
    """The shape of the shared region.

    Attributes:
        num_chunks: rows (host-pool slots, one offloaded chunk each).
        row_bytes: bytes of one row: every worker's slot, rounded up to whole OS pages.
        worker_bytes: bytes of one worker's slot within a row.
    """

    num_chunks: int
    row_bytes: int
    worker_bytes: int


def region_geometry(
    cpu_bytes: int, worker_kv_bytes_per_block: int, blocks_per_chunk: int, world_size: int
) -> RegionGeometry:
    """The region that ``cpu_bytes`` buys: as many whole rows as fit."""
    worker_bytes = int(worker_kv_bytes_per_block) * int(blocks_per_chunk)
    row = worker_bytes * max(1, int(world_size))
    row_bytes = -(-row // mmap.PAGESIZE) * mmap.PAGESIZE if row else 0
    num_chunks = cpu_bytes // row_bytes if row_bytes else 0
    if row_bytes and num_chunks == 0:
        raise InvalidArgumentError(
            f"kv_connector_extra_config['cpu_bytes_to_use']={cpu_bytes} holds no chunk of {row_bytes} bytes"
        )
    return RegionGeometry(num_chunks, row_bytes, worker_bytes)


def open_scheduler_region(engine_id: str, geometry: RegionGeometry) -> SharedOffloadRegion:
    """The scheduler's mapping of the whole region (vLLM's ``SharedOffloadRegion``, ``rank=None``)."""
    return SharedOffloadRegion(
        engine_id=engine_id,
        num_chunks=geometry.num_chunks,
        rank=None,
        kv_bytes_per_chunk=geometry.row_bytes,
        cpu_page_size=geometry.worker_bytes,
    )


class WorkerRegion:
    """One worker's mapping of the region: where its host pool lives.

    Attributes:
        memory: the shared mapping (an ``mmap.mmap``) of the whole region.
        offset: byte offset of this worker's slot in row 0 (``rank * worker_bytes``).
        stride: bytes from one row to the next (``row_bytes``).
        worker_bytes: bytes of this worker's slot in each row.
    """

    def __init__(self, engine_id: str, geometry: RegionGeometry, rank: int) -> None:
        self.region = SharedOffloadRegion(
            engine_id=engine_id,
            num_chunks=geometry.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=geometry.row_bytes,
            cpu_page_size=geometry.worker_bytes,
        )
        memory: Any = self.region.mmap_obj
        self.memory: mmap.mmap = memory
        self.offset = rank * geometry.worker_bytes
        self.stride = geometry.row_bytes
        self.worker_bytes = geometry.worker_bytes

    def close(self) -> None:
        """Unmap the region (the host pool must be shut down first)."""
        self.region.cleanup()
