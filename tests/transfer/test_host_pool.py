"""HostPool: exact size, slot geometry, pinning policy, shutdown, bad input."""

from __future__ import annotations

import logging
import mmap

import numpy as np
import pytest
import torch

import kvoffload.transfer.host_pool as hp
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError, TransferError
from kvoffload.transfer.host_pool import HostPool

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


def test_register_whole_mapping_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration path, with a fake CUDA runtime: one call over the whole mapping, undone on
    failure, freed once on shutdown."""
    calls: list[tuple[str, int, int]] = []

    class FakeCudart:
        fail = False

        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
            calls.append(("reg", ptr, size))
            return 1 if self.fail else 0

        def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
            calls.append(("unreg", ptr, 0))
            return 0

    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    pool = HostPool(10, 5000, pin=True)
    assert pool.pinned and pool.buffer.data_ptr() % mmap.PAGESIZE == 0 and pool.mapped_bytes % mmap.PAGESIZE == 0
    assert calls == [("reg", pool.buffer.data_ptr(), pool.mapped_bytes)] and pool.mapped_bytes >= 50000
    calls.clear()
    pool.shutdown()
    pool.shutdown()
    assert calls == [("unreg", calls[0][1], 0)] and calls[0][1] != 0

    # a failed registration: required pinning -> TransferError, nothing left registered
    calls.clear()
    fake.fail = True
    with pytest.raises(TransferError, match="cannot pin"):
        HostPool(10, 5000, pin=True)
    assert [c[0] for c in calls] == ["reg"]
    # optional pinning -> pageable with a warning
    monkeypatch.setattr(hp, "_warned_pageable", False)
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
@pytest.mark.parametrize("engine", ["torch", "batched"])
def test_copy_engines_reach_across_a_large_pool(engine: str) -> None:
    """A copy-engine copy of host bytes on both sides of the pool's 1 GiB mark round-trips (two
    registrations meeting there made cudaMemcpyAsync fail with cudaErrorInvalidValue)."""
    from kvoffload.kernels.copy_engine import BatchedCopies, CopyList, TorchCopies, batched_copy_problem

    if engine == "batched" and batched_copy_problem() is not None:
        pytest.skip(f"batched copies: {batched_copy_problem()}")
    copies = TorchCopies() if engine == "torch" else BatchedCopies()
    pool = HostPool(1, (1 << 30) + (8 << 20), device="cuda")
    n, at = 4 << 20, (1 << 30) - (2 << 20) + 12
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    back = torch.zeros_like(src)
    with torch.cuda.stream(torch.cuda.Stream()):
        copies.run([pool.buffer, src], CopyList(np.array([[0], [at], [1], [0], [n]], dtype=np.int64)))
        copies.run([back, pool.buffer], CopyList(np.array([[0], [0], [1], [at], [n]], dtype=np.int64)))
        torch.cuda.current_stream().synchronize()
    assert torch.equal(back, src) and torch.equal(pool.buffer[at : at + n].cuda(), src)
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


def test_device_pointer_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _RecordingCudart()
    asked: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(hp, "_device_pointer", lambda ptr: asked.append(ptr) or ptr)
    pool = HostPool(7, 3000, pin=True)
    assert pool.pinned and asked == [p for p, _ in fake.registered] == [pool.buffer.data_ptr()]
    pool.shutdown()
    # a pool whose device address differs from its host address: refused, everything undone
    fake2 = _RecordingCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake2)
    monkeypatch.setattr(hp, "_device_pointer", lambda ptr: ptr + 4096)
    with pytest.raises(TransferError, match="device address"):
        HostPool(7, 3000, pin=True)
    assert fake2.unregistered == [p for p, _ in fake2.registered] and len(fake2.registered) == 1
