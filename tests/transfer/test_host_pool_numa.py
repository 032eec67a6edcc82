"""The host pool's pages on a NUMA node: a private pool's whole mapping, a shared region's own area of
each row (and nothing of the other workers' areas), read back with ``get_mempolicy`` and
``move_pages``; off with ``numa=False``; a bad ``numa`` refused before anything is allocated."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels import KVCacheTable
from kvoffload.transfer import HostPool, TransferWorker
from kvoffload.transfer.numa import MAX_BIND_RANGES, bound_node, own_ranges, placement
from tests.transfer.test_numa import USABLE, needs_syscalls

PAGE = mmap.PAGESIZE
NODE = USABLE[-1] if USABLE else 0


@needs_syscalls
def test_a_private_pool_is_placed_before_its_first_touch() -> None:
    pool = HostPool(4, 3 * PAGE, numa=NODE)
    try:
        base = pool.buffer.data_ptr()
        assert pool.numa_node == NODE
        assert {bound_node(base + k * PAGE) for k in range(12)} == {NODE}
        pool.buffer.fill_(7)  # the first touch
        assert placement(base, pool.nbytes) == {NODE: 12}
    finally:
        pool.shutdown()


@needs_syscalls
def test_numa_false_places_nothing() -> None:
    pool = HostPool(2, PAGE, numa=False)
    try:
        assert pool.numa_node is None and bound_node(pool.buffer.data_ptr()) is None
    finally:
        pool.shutdown()


@needs_syscalls
def test_a_shared_region_binds_only_this_workers_area_of_each_row() -> None:
    """Rows of 4 pages: worker 1's area is pages 1-2 of each row; the other pages belong to other
    workers and keep whatever policy they had (none here)."""
    rows, row = 5, 4 * PAGE
    memory = mmap.mmap(-1, rows * row, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    pool = HostPool(rows, row, memory=memory, offset=PAGE, used_bytes=2 * PAGE, numa=NODE)
    try:
        base = pool.buffer.data_ptr() - PAGE
        assert pool.numa_node == NODE
        nodes = [bound_node(base + p * PAGE) for p in range(rows * 4)]
        assert nodes == [None, NODE, NODE, None] * rows
    finally:
        pool.shutdown()
        del pool
        memory.close()


def test_own_ranges() -> None:
    """One range for contiguous rows, one per row (rounded out to pages) for strided rows, none when
    two rows' areas would share a page or when there are too many rows."""
    assert own_ranges(10 * PAGE + 8, 3, 100, 100, 10 * PAGE + 308) == [(10 * PAGE, PAGE)]
    assert own_ranges(0, 2, 4 * PAGE, PAGE + 1, 8 * PAGE) == [(0, 2 * PAGE), (4 * PAGE, 2 * PAGE)]
    assert own_ranges(0, 2, 4 * PAGE, 4 * PAGE - 100, 8 * PAGE) == []  # 100 bytes of others per row
    assert own_ranges(0, MAX_BIND_RANGES + 1, 2 * PAGE, PAGE, (MAX_BIND_RANGES + 1) * 2 * PAGE) == []
    last = own_ranges(0, 2, 4 * PAGE, 2 * PAGE, 5 * PAGE)[-1]  # the last row ends with the pool
    assert last == (4 * PAGE, PAGE)


@pytest.mark.parametrize(("numa", "error"), [("0", InvalidTypeError), (-1, InvalidArgumentError)])
def test_a_bad_numa_is_refused_before_anything_is_allocated(
    numa: object, error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    allocated: list[int] = []
    monkeypatch.setattr("kvoffload.transfer.host_pool._allocate", lambda n: allocated.append(n))
    with pytest.raises(error, match="numa"):
        HostPool(2, PAGE, numa=numa)  # type: ignore[arg-type]
    assert allocated == []


@needs_syscalls
def test_the_transfer_worker_places_its_pool() -> None:
    kv = [torch.zeros(2, 4, 16, 2, 8)]
    worker = TransferWorker(KVCacheTable.from_tensors([kv], "flash_attn"), num_cpu_blocks=4, backend="torch", numa=NODE)
    try:
        assert worker.host_pool.numa_node == NODE
        assert bound_node(worker.host_pool.buffer.data_ptr()) == NODE
    finally:
        worker.shutdown()
    off = TransferWorker(KVCacheTable.from_tensors([kv], "flash_attn"), num_cpu_blocks=4, backend="torch", numa=False)
    try:
        assert off.host_pool.numa_node is None
        assert np.all(off.host_pool.records() == 0)
    finally:
        off.shutdown()
