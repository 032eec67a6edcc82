"""The host pool in caller-given shared memory (vLLM's shared offload region): HostPool ``memory`` /
``offset``, TransferWorker ``host_memory`` / ``host_offset`` / ``slot_stride``."""

from __future__ import annotations

import mmap

import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.worker import TransferWorker
from tests.transfer.test_worker import Cache, as_bytes, groups_three

FILL = 0xAB


def shared(nbytes: int) -> mmap.mmap:
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    mm.write(bytes([FILL]) * nbytes)
    return mm


def test_pool_in_shared_memory_at_an_offset() -> None:
    mm = shared(3 * 4096)
    pool = HostPool(3, 4096, pin=False, memory=mm, offset=1000)
    assert pool.nbytes == 3 * 4096 - 1000  # ends with the mapping: the last slot is short
    base = torch.frombuffer(mm, dtype=torch.uint8)
    assert pool.buffer.data_ptr() == base.data_ptr() + 1000
    pool.slot_view(1).fill_(7)
    assert mm[1000 + 4096 : 1000 + 2 * 4096] == bytes([7]) * 4096
    assert mm[: 1000 + 4096] == bytes([FILL]) * (1000 + 4096)
    assert pool.slot_view(2).numel() == 4096 - 1000
    del base
    pool.shutdown()
    assert not mm.closed  # the mapping is the caller's
    mm.close()


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"offset": 8}, InvalidArgumentError, "offset is only meaningful with memory"),
        ({"memory": bytearray(64)}, InvalidTypeError, "memory must be an mmap"),
        ({"memory": "mm", "offset": 4096 - 16 * 3}, InvalidArgumentError, "cannot hold 4 slots"),
        ({"memory": "mm", "offset": -1}, InvalidArgumentError, "offset"),
    ],
)
def test_bad_shared_memory(kw: dict[str, object], exc: type, match: str) -> None:
    mm = shared(4096)
    if kw.get("memory") == "mm":
        kw = {**kw, "memory": mm}
    with pytest.raises(exc, match=match):
        HostPool(4, 16, pin=False, **kw)  # type: ignore[arg-type]
    mm.close()


def test_worker_slots_strided_in_shared_memory_match_a_private_pool() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    ref = TransferWorker(cache.table(), 6, 1, backend="torch")
    slot = ref.host_pool.slot_bytes
    stride, offset = slot + 40, 24
    mm = shared(offset + 6 * stride)
    w = TransferWorker(cache.table(), 6, 1, backend="torch", host_memory=mm, host_offset=offset, slot_stride=stride)
    gpu, cpu = GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 2, 5])
    for worker in (ref, w):
        assert worker.transfer_async(1, (gpu, cpu))
        assert [r.success for r in worker.get_finished()] == [True]
    # group g's one record went to the g-th slot of the CPU spec, at the start of that slot
    written = []
    for g, s in enumerate((0, 2, 5)):
        rec = cache.record_bytes(g)
        start = offset + s * stride
        assert mm[start : start + rec] == bytes(ref.host_pool.slot_view(s)[:rec].numpy())
        written.append((start, start + rec))
    bounds = [0] + [x for ab in written for x in ab] + [len(mm)]
    for a, b in zip(bounds[::2], bounds[1::2], strict=True):  # everything else is untouched
        assert mm[a:b] == bytes([FILL]) * (b - a), (a, b)
    # and back: the shared pool's records load into a wiped cache
    before = cache.clone_bases()
    for bases in cache.bases:
        for b in bases:
            b.zero_()
    assert w.transfer_async(2, (cpu, gpu))
    assert [r.success for r in w.get_finished()] == [True]
    for g, blk in enumerate((3, 1, 4)):  # one block per group, in group order
        for got, want in zip(cache.pages(g, blk), cache.pages(g, blk, before), strict=True):
            assert torch.equal(as_bytes(got), as_bytes(want))
            assert as_bytes(got).any()  # not just two zeroed blocks
    ref.shutdown()
    w.shutdown()
    mm.close()


def test_slot_stride_smaller_than_a_slot_is_an_error() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    slot = TransferWorker(cache.table(), 2, 1, backend="torch").host_pool.slot_bytes
    with pytest.raises(InvalidArgumentError, match="slot_stride"):
        TransferWorker(cache.table(), 2, 1, backend="torch", slot_stride=slot - 1)
