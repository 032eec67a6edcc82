"""TransferWorker over a host pool page-locked in chunks, in the background, under fake CUDA
(kvoffload.testing.fake_cuda records the registrations): no copy-engine copy runs across two
registrations, a job waits for the registration of its slots, a background failure fails the next
job (not accepted, registrations undone), shutdown while pinning, no pinning cost once done."""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import TransferError
from kvoffload.kernels.copy_engine import CopyExecutor, CopyList, coalesce
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.testing.fake_cuda import FakeCuda, as_cuda_table, fake_cuda
from kvoffload.transfer import pin_plan
from kvoffload.transfer.worker import TransferWorker

P = mmap.PAGESIZE
NUM_BLOCKS, NUM_SLOTS, TOKENS, DIM = 24, 8, 16, 64
RECORD = TOKENS * DIM * 2  # one MLA layer, bf16: 2 KiB
FACTOR = 2  # slot = 2 records = 4 KiB: one page


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    monkeypatch.setattr(pin_plan, "MAX_REGISTER_BYTES", 2 * P)  # chunks of two slots
    with fake_cuda() as f:
        yield f


class CheckedCopies:
    """Runs ``inner``, first asserting that every copy's host range lies inside ONE live registration."""

    name = "checked"

    def __init__(self, inner: CopyExecutor, fake: FakeCuda) -> None:
        self.inner, self.fake, self.host_copies = inner, fake, 0

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
        base = spaces[0].data_ptr()
        for ds, do, ss, so, n in copies.rows.T.tolist():
            off = do if ds == 0 else so if ss == 0 else None
            if off is not None:
                self.host_copies += 1
                assert self.fake.registration_of(base + off, n) is not None, (
                    f"host copy [{off}, {off + n}) is not inside one registration: {self.fake.registered}"
                )
        self.inner.run(spaces, copies)


def _cache() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (NUM_BLOCKS, TOKENS, DIM * 2), dtype=torch.uint8, generator=g).view(torch.bfloat16)


def _worker(fake: FakeCuda, cache: torch.Tensor, path: str = "dma", **kw: Any) -> tuple[TransferWorker, CheckedCopies]:
    table = as_cuda_table(KVCacheTable.from_tensors([[cache]], "mla"))
    w = TransferWorker(table, NUM_SLOTS, FACTOR, backend="torch", path=path, staging_bytes=64 * RECORD, **kw)
    checked = CheckedCopies(w.paths.copies, fake)
    w.paths.copies = checked
    return w, checked


def _store(blocks: list[int], slots: list[int]) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    return GPULoadStoreSpec(blocks, [len(blocks)], [0]), CPULoadStoreSpec(slots)


def _wait(cond: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


class Gate:
    """A ``register_hook`` holding the ``at``-th registration (and later ones) until opened."""

    def __init__(self, at: int) -> None:
        self.at, self.open, self.reached = at, threading.Event(), threading.Event()

    def __call__(self, n: int, ptr: int, size: int) -> None:
        if n >= self.at:
            self.reached.set()
            assert self.open.wait(10), "the test never opened the gate"


@pytest.mark.parametrize("path", ["dma", "staged"])
def test_copy_engine_copies_never_cross_a_registration(fake: FakeCuda, path: str) -> None:
    cache = _cache()
    want = cache.clone()
    w, checked = _worker(fake, cache, path)
    pool = w.host_pool
    assert pool.plan is not None and len(pool.plan) == NUM_SLOTS // 2
    assert pool.copy_cuts.tolist() == [2 * P, 4 * P, 6 * P]
    _wait(lambda: w.check_pinning() == NUM_SLOTS)
    # blocks 0..11 into slots 1..6: host records contiguous from slot 1 to slot 6, across three cuts
    gpu, cpu = _store(list(range(12)), [1, 2, 3, 4, 5, 6])
    # (the control: merged without the cuts, one copy would run across a registration)
    rows = w.paths.page_copies(np.arange(12), np.zeros(12, np.int32), np.arange(12) * RECORD + P, True).rows
    assert len(coalesce(*rows)) == 1 and len(coalesce(*rows, cuts=pool.copy_cuts)) == 4
    assert w.transfer_async(1, (gpu, cpu))
    assert [r.success for r in w.get_finished()] == [True]
    host = pool.buffer.view(torch.uint8)
    flat = want.view(torch.uint8).reshape(NUM_BLOCKS, -1)
    assert torch.equal(host[P : 7 * P], flat[:12].reshape(-1))
    assert checked.host_copies >= 4
    cache.view(torch.uint8).zero_()
    assert w.transfer_async(2, (cpu, gpu))
    assert [r.success for r in w.get_finished()] == [True]
    assert torch.equal(cache.view(torch.uint8)[:12], want.view(torch.uint8)[:12])
    w.shutdown()
    assert fake.registered == {}


def test_a_worker_in_a_shared_region_registers_only_its_area_of_each_row(fake: FakeCuda) -> None:
    slot = FACTOR * RECORD
    row = -(-(slot + pin_plan.MIN_SAVED_BYTES_PER_ROW + slot) // P) * P  # this worker's area, then others'
    mm = mmap.mmap(-1, NUM_SLOTS * row, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    cache = _cache()
    w, checked = _worker(fake, cache, host_memory=mm, host_offset=slot, slot_stride=row)
    assert w.host_pool.plan is not None and w.host_pool.plan.per_row
    _wait(lambda: w.check_pinning() == NUM_SLOTS)
    assert sum(n for n in fake.registered.values()) <= NUM_SLOTS * (slot + P)
    gpu, cpu = _store(list(range(6)), [0, 1, 7])
    assert w.transfer_async(1, (gpu, cpu)) and [r.success for r in w.get_finished()] == [True]
    flat = cache.view(torch.uint8).reshape(NUM_BLOCKS, -1)
    for i, s in enumerate([0, 1, 7]):
        start = slot + s * row
        assert mm[start : start + slot] == bytes(flat[2 * i : 2 * i + 2].reshape(-1).numpy())
    assert checked.host_copies >= 3
    w.shutdown()
    assert fake.registered == {}
    mm.close()


def test_a_job_waits_for_the_registration_of_its_slots(fake: FakeCuda) -> None:
    gate = Gate(at=2)
    fake.register_hook = gate
    w, checked = _worker(fake, _cache())
    assert gate.reached.wait(5)
    assert w.check_pinning() == 2 and w._pinning
    # slots of the first chunk: accepted at once
    assert w.transfer_async(1, _store([0, 1, 2, 3], [0, 1]))
    assert [r.success for r in w.get_finished()] == [True]
    # slot 5 is in the third chunk: the submit blocks until it is registered
    accepted = threading.Event()
    thread = threading.Thread(target=lambda: w.transfer_async(2, _store([4, 5], [5])) and accepted.set())
    thread.start()
    assert not accepted.wait(0.15)
    assert checked.host_copies == 1 and w.num_in_flight == 0  # job 2 neither launched nor accepted yet
    gate.open.set()
    assert accepted.wait(5)
    thread.join()
    assert [r.success for r in w.get_finished()] == [True]  # its copy ran inside a registration (checked)
    assert checked.host_copies == 2
    w.shutdown()
    assert fake.registered == {}


def test_no_pinning_check_per_job_once_every_slot_is_registered(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(at=2)
    fake.register_hook = gate
    w, _ = _worker(fake, _cache())
    assert gate.reached.wait(5) and w._pinning
    gate.open.set()
    _wait(lambda: w.host_pool.pinning_done)
    assert w.transfer_async(1, _store([0, 1], [7]))  # the first job after completion notices it
    assert not w._pinning

    def boom(*a: Any) -> int:
        raise AssertionError("pinning checked on the submit path after it completed")

    monkeypatch.setattr(w.host_pool, "check_pinning", boom)
    monkeypatch.setattr(w.host_pool, "wait_rows", boom)
    assert w.transfer_async(2, _store([2, 3], [6]))
    assert [r.success for r in w.get_finished()] == [True, True]
    w.shutdown()


def test_a_background_failure_fails_the_next_job_and_undoes_the_registrations(fake: FakeCuda) -> None:
    gate = Gate(at=3)
    fake.register_hook = gate
    fake.fail_register_at = 3
    w, checked = _worker(fake, _cache(), merge=False)
    assert gate.reached.wait(5)
    assert w.transfer_async(1, _store([0, 1], [0]))  # accepted before the failure
    gate.open.set()
    _wait(lambda: w.host_pool._pinning is not None and w.host_pool._pinning._error is not None)
    copies = checked.host_copies
    order: list[str] = []
    jobs, pool = w._jobs, w.host_pool
    assert jobs is not None
    drain, unpin = jobs.drain, pool.unpin
    jobs.drain = lambda: (order.append("drain"), drain())[1]  # type: ignore[method-assign]
    pool.unpin = lambda: (order.append("unpin"), unpin())[1]  # type: ignore[method-assign]
    with pytest.raises(TransferError, match=r"registration 3 of 4 failed.*returned 2"):
        w.transfer_async(2, _store([2, 3], [1]))
    assert order == ["drain", "unpin"]  # undone only once nothing runs on the pool
    # job 2 not accepted, nothing launched for it; job 1 still reported; no registration left
    assert checked.host_copies == copies and fake.registered == {} and not w.host_pool.pinned
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(1, True)] and w.num_in_flight == 0
    with pytest.raises(TransferError, match="registration 3 of 4"):
        w.check_pinning()
    with pytest.raises(TransferError, match="registration 3 of 4"):
        w.transfer_async(3, _store([2, 3], [1]))
    w.shutdown()
    assert fake.calls["cudaHostUnregister"] == 2


def test_shutdown_while_pinning(fake: FakeCuda) -> None:
    gate = Gate(at=3)
    fake.register_hook = gate
    w, _ = _worker(fake, _cache())
    assert gate.reached.wait(5)
    assert w.transfer_async(1, _store([0, 1], [0]))
    finished = threading.Event()
    stopper = threading.Thread(target=lambda: (w.shutdown(), finished.set()))
    stopper.start()
    assert not finished.wait(0.1)  # the registration in progress ends first
    gate.open.set()
    assert finished.wait(5)
    stopper.join()
    assert len(fake.register_log) == 3 and fake.registered == {}
    assert not any(t.name == "kvoffload-pinning" and t.is_alive() for t in threading.enumerate())
    assert [r.success for r in w.get_finished()] == [True]
    assert w.transfer_async(2, _store([0, 1], [0])) is False
