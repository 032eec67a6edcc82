"""kvoffload's host pool as vLLM's shared offload region.

vLLM's ``SharedOffloadRegion`` is a ``/dev/shm`` file (``vllm_offload_<engine_id>.mmap``) of
``num_chunks`` rows, one offloaded chunk per row. ``KVOffloadSpec`` keeps its pool there when
something besides a worker's own stores must see the pool:

* with ``secondary_tiers``: vLLM's tiers run in the scheduler process and read / write the pool
  through a memoryview, so the scheduler maps the whole region (a ``(num_chunks, row_bytes)``
  memoryview for the tiers) and every worker maps it too;
* under vLLM's replicated layout (MLA at tensor-parallel > 1: every worker holds the same KV),
  the pool holds ONE copy: each row has a single worker slot, which every worker maps; only
  rank 0 stores into it, every worker loads from it.

A worker's kvoffload transfer worker keeps its host pool in its slot of each row and page-locks
the mapping::

    row c (row_bytes, a whole number of OS pages) = slot 0 | slot 1 | ... | slot copies-1 | padding
    slot s for chunk c starts at c * row_bytes + s * worker_bytes

``copies`` is the world size (worker r uses slot r), or 1 under a replicated layout (every
worker uses slot 0). A row is rounded up to vLLM's ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``
(the OS page) as vLLM's CPU spec rounds its chunks, so ``cpu_bytes_to_use`` buys the same number
of chunks here as there; a private pool (neither case) is sized by the same rule.

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
        row_bytes: bytes of one row: ``copies`` worker slots, rounded up to
            ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``.
        worker_bytes: bytes of one worker's slot within a row (one worker's KV of one chunk).
        copies: worker slots in a row: the world size, or 1 under a replicated layout.
    """

    num_chunks: int
    row_bytes: int
    worker_bytes: int
    copies: int = 1


def region_geometry(
    cpu_bytes: int, worker_kv_bytes_per_block: int, blocks_per_chunk: int, copies: int
) -> RegionGeometry:
    """The pool that ``cpu_bytes`` buys: as many whole rows as fit (vLLM's CPU spec's sizing).

    Args:
        cpu_bytes: ``cpu_bytes_to_use``.
        worker_kv_bytes_per_block: KV bytes of one GPU block on one worker.
        blocks_per_chunk: GPU blocks per offloaded chunk.
        copies: worker copies of a chunk in a row: the world size, or 1 under a replicated layout.

    Raises:
        InvalidArgumentError: ``cpu_bytes`` holds no row (while a row has bytes).
    """
    worker_bytes = int(worker_kv_bytes_per_block) * int(blocks_per_chunk)
    copies = max(1, int(copies))
    row = worker_bytes * copies
    align = SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
    row_bytes = -(-row // align) * align if row else 0
    num_chunks = cpu_bytes // row_bytes if row_bytes else 0
    if row_bytes and num_chunks == 0:
        raise InvalidArgumentError(
            f"kv_connector_extra_config['cpu_bytes_to_use']={cpu_bytes} holds no chunk of {row_bytes} bytes"
        )
    return RegionGeometry(num_chunks, row_bytes, worker_bytes, copies)


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

    Args:
        engine_id: vLLM's engine id (names the file).
        geometry: the region's shape.
        slot: the slot of each row this worker maps: its rank, or 0 for every worker under a
            replicated layout (vLLM's ``SharedOffloadRegion`` mapped with ``rank=slot``).

    Attributes:
        memory: the shared mapping (an ``mmap.mmap``) of the whole region.
        offset: byte offset of this worker's slot in row 0 (``slot * worker_bytes``).
        stride: bytes from one row to the next (``row_bytes``).
        worker_bytes: bytes of this worker's slot in each row.

    Raises:
        InvalidArgumentError: ``slot`` is not one of the row's ``geometry.copies`` slots.
    """

    def __init__(self, engine_id: str, geometry: RegionGeometry, slot: int) -> None:
        if not 0 <= slot < geometry.copies:
            raise InvalidArgumentError(f"slot must be in [0, {geometry.copies}) (the slots of a row), got {slot}")
        self.region = SharedOffloadRegion(
            engine_id=engine_id,
            num_chunks=geometry.num_chunks,
            rank=slot,
            kv_bytes_per_chunk=geometry.row_bytes,
            cpu_page_size=geometry.worker_bytes,
        )
        memory: Any = self.region.mmap_obj
        self.memory: mmap.mmap = memory
        self.offset = slot * geometry.worker_bytes
        self.stride = geometry.row_bytes
        self.worker_bytes = geometry.worker_bytes

    def close(self) -> None:
        """Unmap the region (the host pool must be shut down first)."""
        self.region.cleanup()
