"""HostPool: exact size, slot geometry, pinning policy, shutdown, bad input."""

from __future__ import annotations

import logging
import mmap

import pytest
import torch

import kvoffload.transfer.host_pool as hp
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError, TransferError
from kvoffload.transfer.host_pool import HostPool, _chunk_ranges

CUDA = torch.cuda.is_available()


def test_exact_size_and_slots() -> None:
    pool = HostPool(7, 3000, pin=False)
    buf = pool.buffer
    assert buf.dtype == torch.uint8 and buf.dim() == 1 and buf.device.type == "cpu"
    assert buf.numel() == 7 * 3000 == pool.nbytes
    assert buf.untyped_storage().nbytes() == 7 * 3000  # no power-of-two rounding
    assert pool.slot_offset(0) == 0 and pool.slot_offset(6) == 6 * 3000
    v = pool.slot_view(4)
    assert v.numel() == 3000 and v.data_ptr() == buf.data_ptr() + 4 * 3000
    buf.zero_()
    v.fill_(9)
    assert int(buf[4 * 3000 - 1]) == 0 and int(buf[4 * 3000]) == 9 and int(buf[5 * 3000 - 1]) == 9
    assert int(buf[5 * 3000]) == 0
    assert not pool.pinned
    pool.shutdown()


@pytest.mark.parametrize("slot", [-1, 7, 100])
def test_slot_out_of_range(slot: int) -> None:
    pool = HostPool(7, 16, pin=False)
    with pytest.raises(InvalidArgumentError, match="slot"):
        pool.slot_offset(slot)
    with pytest.raises(InvalidArgumentError, match="slot"):
        pool.slot_view(slot)


@pytest.mark.parametrize("slot", [True, 1.0, "1", None])
def test_slot_wrong_type(slot: object) -> None:
    pool = HostPool(7, 16, pin=False)
    with pytest.raises(InvalidTypeError, match="slot"):
        pool.slot_offset(slot)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((0, 16), InvalidArgumentError, "num_slots"),
        ((4, 0), InvalidArgumentError, "slot_bytes"),
        ((True, 16), InvalidTypeError, "num_slots"),
        ((4, 16.0), InvalidTypeError, "slot_bytes"),
        ((-3, 16), InvalidArgumentError, "num_slots"),
    ],
)
def test_bad_sizes(args: tuple, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        HostPool(*args, pin=False)


def test_bad_device_and_pin() -> None:
    with pytest.raises(InvalidArgumentError, match="device"):
        HostPool(2, 16, device="meta", pin=False)
    with pytest.raises(InvalidTypeError, match="device"):
        HostPool(2, 16, device=0, pin=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="pin"):
        HostPool(2, 16, pin=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="pin=False"):
        HostPool(2, 16, device="cuda", pin=False)


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA behaviour")
def test_no_cuda_pin_required_is_typed_error() -> None:
    with pytest.raises(BackendUnavailableError, match="CUDA"):
        HostPool(2, 16, pin=True)
    with pytest.raises(BackendUnavailableError, match="CUDA"):
        HostPool(2, 16, device="cuda")


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA behaviour")
def test_no_cuda_fallback_warns_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(hp, "_warned_pageable", False)
    with caplog.at_level(logging.WARNING, logger="kvoffload.transfer.host_pool"):
        pools = [HostPool(2, 16) for _ in range(3)]
    warnings = [r for r in caplog.records if r.name == "kvoffload.transfer.host_pool"]
    assert len(warnings) == 1 and "pageable" in warnings[0].getMessage()
    assert not any(p.pinned for p in pools)
    caplog.clear()
    monkeypatch.setattr(hp, "_warned_pageable", False)
    with caplog.at_level(logging.WARNING, logger="kvoffload.transfer.host_pool"):
        HostPool(2, 16, pin=False)  # explicit pageable: no warning
    assert not caplog.records


def test_shutdown_idempotent() -> None:
    pool = HostPool(3, 8, pin=False)
    assert not pool.is_shutdown
    pool.shutdown()
    pool.shutdown()
    assert pool.is_shutdown
    with pytest.raises(TransferError, match="shut down"):
        _ = pool.buffer
    with pytest.raises(TransferError):
        pool.slot_view(0)
    assert "shut down" in repr(pool)


def test_chunk_ranges_page_aligned_and_cover() -> None:
    for base in (0, 64, 4096 * 3 + 80, 12345):
        for nbytes in (1, 4095, 4096, 10 * 4096 + 17, 1 << 20):
            for chunk in (1000, 4096, 3 * 4096, 1 << 16):
                ranges = _chunk_ranges(base, nbytes, chunk)
                assert ranges[0][0] == base
                pos = base
                for i, (start, size) in enumerate(ranges):
                    assert start == pos and size > 0
                    pos += size
                    if i < len(ranges) - 1:
                        assert pos % 4096 == 0  # inner boundaries page aligned
                        assert size <= max(chunk, 4096)
                assert pos == base + nbytes


def test_register_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration path, with a fake CUDA runtime: chunked, undone on failure, freed on shutdown."""
    calls: list[tuple[str, int, int]] = []

    class FakeCudart:
        fail_at: int | None = None

        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
            calls.append(("reg", ptr, size))
            n_reg = sum(1 for c in calls if c[0] == "reg")
            return 1 if self.fail_at is not None and n_reg == self.fail_at else 0

        def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
            calls.append(("unreg", ptr, 0))
            return 0

    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(hp, "REGISTER_CHUNK_BYTES", 8192)
    pool = HostPool(10, 5000, pin=True)
    regs = [c for c in calls if c[0] == "reg"]
    assert pool.pinned and len(regs) >= 6
    assert pool.buffer.data_ptr() % mmap.PAGESIZE == 0 and pool.mapped_bytes % mmap.PAGESIZE == 0
    assert sum(c[2] for c in regs) == pool.mapped_bytes >= 50000 and regs[0][1] == pool.buffer.data_ptr()
    calls.clear()
    pool.shutdown()
    assert sorted(c[1] for c in calls if c[0] == "unreg") == sorted(r[1] for r in regs)
    pool.shutdown()
    assert len([c for c in calls if c[0] == "unreg"]) == len(regs)

    # a failure half-way unregisters what was registered; required pinning -> TransferError
    calls.clear()
    fake.fail_at = 3
    with pytest.raises(TransferError, match="cannot pin"):
        HostPool(10, 5000, pin=True)
    regs = [c for c in calls if c[0] == "reg"]
    unregs = [c for c in calls if c[0] == "unreg"]
    assert len(regs) == 3 and sorted(u[1] for u in unregs) == sorted(r[1] for r in regs[:2])
    # optional pinning -> pageable with a warning
    monkeypatch.setattr(hp, "_warned_pageable", False)
    calls.clear()
    pool = HostPool(10, 5000)
    assert not pool.pinned and pool.buffer.numel() == 50000


@pytest.mark.gpu
def test_pinned_on_cuda() -> None:
    pool = HostPool(5, 3 * 4096 + 12, device="cuda")
    assert pool.pinned and pool.buffer.is_pinned()
    assert pool.buffer.numel() == pool.nbytes and pool.mapped_bytes == -(-pool.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert pool.slot_view(4).is_pinned()
    # the GPU reaches the pool directly: a copy to and from the device round-trips
    src = torch.randint(0, 256, (pool.slot_bytes,), dtype=torch.uint8, device="cuda")
    pool.slot_view(2).copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(pool.slot_view(2).cuda(), src)
    pool.shutdown()


@pytest.mark.gpu
def test_cuda_device_needs_pinning_large_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hp, "REGISTER_CHUNK_BYTES", 1 << 20)
    pool = HostPool(100, 40_000, device=torch.device("cuda", 0))
    assert pool.pinned and len(pool._registered) > 1
    assert pool.buffer[-1:].is_pinned() and pool.buffer[:1].is_pinned()
    pool.shutdown()


class _RecordingCudart:
    def __init__(self) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        self.registered.append((ptr, size))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered.append(ptr)
        return 0


def test_device_pointer_checked_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _RecordingCudart()
    asked: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(hp, "REGISTER_CHUNK_BYTES", 2 * mmap.PAGESIZE)
    monkeypatch.setattr(hp, "_device_pointer", lambda ptr: asked.append(ptr) or ptr)
    pool = HostPool(7, 3000, pin=True)
    assert pool.pinned and asked == [p for p, _ in fake.registered] and len(asked) >= 3
    pool.shutdown()
    # a chunk whose device address differs from its host address: refused, everything undone
    fake2 = _RecordingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake2)
    monkeypatch.setattr(hp, "_device_pointer", lambda ptr: ptr + (4096 if len(fake2.registered) == 2 else 0))
    with pytest.raises(TransferError, match="device address"):
        HostPool(7, 3000, pin=True)
    assert sorted(fake2.unregistered) == sorted(p for p, _ in fake2.registered)


def test_record_crossing_a_registration_chunk_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of one page and slots that are not page multiples: records straddle chunk
    boundaries; a store/load round trip through the worker is still byte-exact."""
    from tests.transfer.test_worker import run_round_trip

    fake = _RecordingCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(hp, "REGISTER_CHUNK_BYTES", mmap.PAGESIZE)
    monkeypatch.setattr(hp, "_device_pointer", lambda ptr: ptr)
    run_round_trip("torch", [3, 3, 3], "flashinfer", [7, 5, 4], [1, 2, 0], seed=4, num_slots=40)
    # every pool registered whole pages, chunk by chunk, and the slots crossed chunk boundaries
    assert fake.registered and all(size == mmap.PAGESIZE for _, size in fake.registered)
    pool = HostPool(40, 1000, pin=True)
    bounds = {p for p, _ in fake.registered}
    assert any(
        pool.buffer.data_ptr() + s * 1000 < b < pool.buffer.data_ptr() + (s + 1) * 1000
        for s in range(40)
        for b in bounds
    )
    pool.shutdown()
