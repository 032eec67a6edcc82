"""HostPool page-locking under a faked CUDA runtime (kvoffload.testing.fake_cuda records every
registration): bounded row-aligned chunks, rollback, no silent pageable fallback, background
pinning, waiting for rows, shutdown while pinning."""

from __future__ import annotations

import gc
import logging
import mmap
import threading
import time
from collections.abc import Iterator

import pytest

from kvoffload.errors import InvalidArgumentError, InvalidTypeError, TransferError
from kvoffload.testing.fake_cuda import FakeCuda, fake_cuda
from kvoffload.transfer import pin_plan
from kvoffload.transfer.host_pool import HostPool

P = mmap.PAGESIZE
MiB = 1 << 20


@pytest.fixture
def fake() -> Iterator[FakeCuda]:
    with fake_cuda() as f:
        yield f


class Gate:
    """A ``register_hook`` that holds the ``at``-th registration (and every later one) until opened."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.open = threading.Event()
        self.reached = threading.Event()

    def __call__(self, n: int, ptr: int, size: int) -> None:
        if n >= self.at:
            self.reached.set()
            assert self.open.wait(10), "the test never opened the gate"


def _wait(cond: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_registers_the_plan_in_bounded_row_aligned_chunks(fake: FakeCuda) -> None:
    pool = HostPool(10, 2 * P, device="cuda", max_register_bytes=5 * P)
    base = pool.buffer.data_ptr()
    assert pool.pinned and pool.pinning_done and pool.ready_rows == 10
    assert fake.register_log == [
        (base, 4 * P),
        (base + 4 * P, 4 * P),
        (base + 8 * P, 4 * P),
        (base + 12 * P, 4 * P),
        (base + 16 * P, 4 * P),
    ]
    assert pool.copy_cuts.tolist() == [4 * P, 8 * P, 12 * P, 16 * P]
    assert sorted(fake.registered.items()) == fake.register_log
    pool.shutdown()
    pool.shutdown()
    assert fake.registered == {} and fake.calls["cudaHostUnregister"] == 5


def test_default_bound_is_64_gib(fake: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pin_plan.MAX_REGISTER_BYTES == 64 << 30
    monkeypatch.setattr(pin_plan, "MAX_REGISTER_BYTES", 3 * P)  # read at construction
    pool = HostPool(6, P, device="cuda")
    assert [size for _, size in fake.register_log] == [3 * P, 3 * P]
    pool.shutdown()


def test_only_this_workers_area_of_each_row_in_a_shared_region(fake: FakeCuda) -> None:
    area, workers, rows = 3 * MiB + 100, 2, 4
    row = -(-workers * area // P) * P
    mm = mmap.mmap(-1, rows * row, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    pool = HostPool(rows, row, device="cuda", memory=mm, offset=area, used_bytes=area)
    base = pool.buffer.data_ptr()
    assert pool.plan is not None and pool.plan.per_row
    want = [((base + r * row) // P * P, -(-(base + r * row + area) // P) * P) for r in range(rows)]
    assert [(s, s + n) for s, n in fake.register_log] == want
    assert sum(n for _, n in fake.register_log) < rows * (area + 2 * P)
    pool.shutdown()
    assert fake.registered == {}
    mm.close()


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_a_failed_registration_rolls_back_and_names_the_size(fake: FakeCuda, fail_at: int) -> None:
    fake.fail_register_at = fail_at
    with pytest.raises(
        TransferError, match=rf"cannot pin a host pool of {10 * 2 * P} bytes.*registration {fail_at} of 5"
    ):
        HostPool(10, 2 * P, device="cuda", max_register_bytes=4 * P)
    assert fake.registered == {}
    assert fake.calls["cudaHostUnregister"] == fail_at - 1
    assert fake.calls["cudaGetLastError"] == 1  # the failure is not left for a later CUDA call to report


def test_pin_true_on_a_cpu_device_raises_too(fake: FakeCuda) -> None:
    fake.fail_register_at = 1
    with pytest.raises(TransferError, match="cannot pin"):
        HostPool(4, P, pin=True)
    assert fake.registered == {}


def test_optional_pinning_failure_is_a_warning_naming_size_and_reason(
    fake: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    """pin=None with a CPU device (CUDA present): pageable, with a WARNING for every such pool."""
    for _ in range(2):
        fake.fail_register_at = fake.calls["cudaHostRegister"] + 2
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvoffload.transfer.host_pool"):
            pool = HostPool(8, 2 * P, max_register_bytes=4 * P)
        assert not pool.pinned and pool.plan is None and fake.registered == {}
        (rec,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert f"{8 * 2 * P} bytes" in rec.getMessage() and "returned 2" in rec.getMessage()
        assert "pageable" in rec.getMessage()
        pool.shutdown()


def test_background_pins_the_first_chunk_then_the_rest(fake: FakeCuda) -> None:
    gate = Gate(at=3)
    fake.register_hook = gate
    pool = HostPool(12, 2 * P, device="cuda", max_register_bytes=4 * P, background=True)
    # returned with the first chunk registered; the thread holds the third registration
    assert pool.pinned and len(fake.register_log) >= 1 and fake.register_log[0][0] == pool.buffer.data_ptr()
    assert gate.reached.wait(5)
    assert pool.ready_rows == 4 and not pool.pinning_done and pool.check_pinning() == 4
    assert pool.wait_rows(4, timeout=0) and not pool.wait_rows(5, timeout=0.05)
    assert "rows ready" in repr(pool)
    gate.open.set()
    assert pool.wait_rows(12, timeout=5)
    _wait(lambda: pool.pinning_done)
    assert pool.ready_rows == 12 and pool.check_pinning() == 12
    assert [s for s, _ in fake.register_log] == sorted(s for s, _ in fake.register_log)  # ascending
    assert len(fake.registered) == 6
    pool.shutdown()
    assert fake.registered == {}


def test_wait_rows_blocks_until_its_chunk_is_registered(fake: FakeCuda) -> None:
    gate = Gate(at=2)
    fake.register_hook = gate
    pool = HostPool(8, 2 * P, device="cuda", max_register_bytes=4 * P, background=True)
    assert gate.reached.wait(5)
    done = threading.Event()
    seen: list[int] = []

    def waiter() -> None:
        pool.wait_rows(5)
        seen.append(len(fake.registered))
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert not done.wait(0.1)  # rows 4 and up are not registered yet
    gate.open.set()
    assert done.wait(5)
    t.join()
    assert seen[0] >= 3  # rows [0, 5) need the first three registrations
    pool.shutdown()


def test_background_failure_surfaces_and_leaves_the_rollback_to_the_owner(fake: FakeCuda) -> None:
    fake.fail_register_at = 3
    pool = HostPool(12, 2 * P, device="cuda", max_register_bytes=4 * P, background=True)
    with pytest.raises(TransferError, match=rf"{12 * 2 * P} bytes.*registration 3 of 6 failed"):
        pool.wait_rows(12, timeout=5)
    with pytest.raises(TransferError, match="registration 3 of 6"):
        pool.check_pinning()
    # rows registered before the failure may be in use by transfers: still registered ...
    assert len(fake.registered) == 2 and pool.ready_rows == 4
    # ... until the owner undoes them
    pool.unpin()
    assert fake.registered == {} and not pool.pinned
    with pytest.raises(TransferError, match="registration 3 of 6"):
        pool.check_pinning()
    pool.shutdown()
    assert fake.calls["cudaHostUnregister"] == 2


def test_shutdown_while_pinning_stops_the_thread_and_unregisters_everything(fake: FakeCuda) -> None:
    gate = Gate(at=3)
    fake.register_hook = gate
    pool = HostPool(12, 2 * P, device="cuda", max_register_bytes=4 * P, background=True)
    assert gate.reached.wait(5)
    finished = threading.Event()
    stopper = threading.Thread(target=lambda: (pool.shutdown(), finished.set()))
    stopper.start()
    assert not finished.wait(0.1)  # waits for the registration in progress
    gate.open.set()
    assert finished.wait(5)
    stopper.join()
    assert len(fake.register_log) == 3  # nothing registered after the stop
    assert fake.registered == {} and fake.calls["cudaHostUnregister"] == 3
    assert not any(t.name == "kvoffload-pinning" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(TransferError):
        pool.wait_rows(12)


def test_a_forgotten_pool_stops_pinning_and_unregisters(fake: FakeCuda) -> None:
    gate = Gate(at=2)
    fake.register_hook = gate
    pool = HostPool(12, 2 * P, device="cuda", max_register_bytes=4 * P, background=True)
    assert gate.reached.wait(5)
    gate.open.set()
    del pool
    gc.collect()
    assert fake.registered == {}
    assert not any(t.name == "kvoffload-pinning" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"used_bytes": 2 * P + 1}, InvalidArgumentError, "used_bytes"),
        ({"used_bytes": 0}, InvalidArgumentError, "used_bytes"),
        ({"used_bytes": 1.0}, InvalidTypeError, "used_bytes"),
        ({"max_register_bytes": 0}, InvalidArgumentError, "max_register_bytes"),
        ({"max_register_bytes": "64G"}, InvalidTypeError, "max_register_bytes"),
        ({"background": 1}, InvalidTypeError, "background"),
    ],
)
def test_bad_pinning_arguments(fake: FakeCuda, kw: dict[str, object], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        HostPool(4, 2 * P, device="cuda", **kw)  # type: ignore[arg-type]
    assert fake.calls["cudaHostRegister"] == 0


def test_wait_rows_bad_input(fake: FakeCuda) -> None:
    pool = HostPool(4, P, device="cuda")
    with pytest.raises(InvalidArgumentError, match="rows"):
        pool.wait_rows(5)
    with pytest.raises(InvalidTypeError, match="rows"):
        pool.wait_rows(1.5)  # type: ignore[arg-type]
    assert pool.wait_rows(4)
    pool.shutdown()
