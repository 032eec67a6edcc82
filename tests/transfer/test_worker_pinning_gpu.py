"""On CUDA: a host pool registered in many row-aligned chunks, in the background, round-trips jobs
whose records run across the chunk boundaries on every data path (the copy engines refuse a copy
that crosses two registrations, so this fails unless the paths split their copies there)."""

from __future__ import annotations

import mmap

import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.transfer import pin_plan
from kvoffload.transfer.worker import TransferWorker

pytestmark = pytest.mark.gpu

P = mmap.PAGESIZE
NUM_BLOCKS, NUM_SLOTS, TOKENS, DIM = 64, 24, 16, 64  # MLA bf16: 2 KiB records, 2 per slot: 4 KiB slots


@pytest.mark.parametrize(("backend", "path"), [("triton", "direct"), ("torch", "dma"), ("torch", "staged")])
def test_round_trip_across_registration_boundaries(monkeypatch: pytest.MonkeyPatch, backend: str, path: str) -> None:
    monkeypatch.setattr(pin_plan, "MAX_REGISTER_BYTES", 3 * P)  # three slots per registration
    cache = torch.randint(0, 256, (NUM_BLOCKS, TOKENS, DIM * 2), dtype=torch.uint8, device="cuda")
    want = cache.clone()
    table = KVCacheTable.from_tensors([[cache.view(torch.bfloat16)]], "mla")
    w = TransferWorker(table, NUM_SLOTS, 2, backend=backend, path=path, staging_bytes=8 * P)
    pool = w.host_pool
    assert pool.plan is not None and len(pool.plan) == NUM_SLOTS // 3 and pool.pinned
    blocks, slots = list(range(2, 42)), list(range(1, 21))  # slots 1..20: across six boundaries
    gpu, cpu = GPULoadStoreSpec(blocks, [len(blocks)], [0]), CPULoadStoreSpec(slots)
    assert w.transfer_async(1, (gpu, cpu))  # may wait for the background registrations
    w.wait([1])
    assert [r.success for r in w.get_finished()] == [True]
    assert w.check_pinning() == NUM_SLOTS or pool.wait_rows(NUM_SLOTS, timeout=30)
    assert torch.equal(pool.buffer[P : 21 * P], want[2:42].reshape(-1).cpu())
    cache.zero_()
    assert w.transfer_async(2, (cpu, gpu))
    w.wait([2])
    assert [r.success for r in w.get_finished()] == [True]
    assert torch.equal(cache[2:42], want[2:42]) and not cache[:2].any()
    w.shutdown()
