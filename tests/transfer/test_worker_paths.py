"""TransferWorker v2 on CPU: every data path through the worker, no hidden sync on the submit
path (checked with a mocked CUDA stream/event/copy API), producer events, graph capture,
block size factors checked at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, StreamCaptureError
from kvoffload.kernels import device as kdevice
from kvoffload.kernels.config import LaunchConfig
from kvoffload.transfer.cuda_jobs import CudaJobs
from kvoffload.transfer.worker import TransferWorker
from tests.transfer.test_worker import BACKENDS, Cache, _backend_or_skip, groups_three, run_round_trip

PATHS = ["direct", "staged", "dma"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "factors, third, sizes, indices",
    [([1, 1, 1], "empty", [4, 3, 2], [0, 0, 0]), ([3, 1, 2], "flashinfer", [7, 3, 2], [1, 5, 3])],
)
def test_round_trip_every_path(
    backend: str, path: str, factors: list[int], third: str, sizes: list[int], indices: list[int]
) -> None:
    if backend == "triton" and path == "dma":
        pytest.skip("the copy-engine-only path runs no kernel")
    # a staging ring smaller than a job: several pieces, segments reused
    run_round_trip(
        _backend_or_skip(backend, "cpu"), factors, third, sizes, indices, seed=5, path=path, staging_bytes=512
    )


def test_auto_path_uses_the_config_crossover(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = LaunchConfig(unpack_staged_min_bytes=1, pack_staged_min_bytes=-1, staging_bytes=4096)
    monkeypatch.setattr("kvoffload.transfer.worker.launch_config", lambda dev: cfg)
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    w = TransferWorker(cache.table(), 4, backend="torch")
    assert w.paths.choose(True, 1 << 30) == "direct" and w.paths.choose(False, 10) == "staged"
    assert w.paths.staging_bytes >= 4096


# ----------------------------------------------------------------------------- no hidden sync


class _Forbidden(BaseException):
    """Not an Exception: the worker's failure handling (success=False) must not swallow it."""


@dataclass
class _FakeEvent:
    log: list[str]
    enable_timing: bool = False

    def record(self, stream: Any = None) -> None:
        self.log.append("event.record")

    def synchronize(self) -> None:
        raise _Forbidden("Event.synchronize on the submit path")

    def query(self) -> bool:
        raise _Forbidden("Event.query on the submit path")


class _FakeStream:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def wait_event(self, ev: Any) -> None:
        self.log.append("stream.wait_event")

    def wait_stream(self, other: Any) -> None:
        self.log.append("stream.wait_stream")

    def synchronize(self) -> None:
        raise _Forbidden("Stream.synchronize on the submit path")


class _Ctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _raiser(what: str) -> Any:
    def f(*a: Any, **k: Any) -> Any:
        raise _Forbidden(what)

    return f


@pytest.mark.parametrize("path", PATHS)
def test_submit_path_never_waits_for_the_device(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The CUDA submit path, run on CPU tensors with torch.cuda's stream/event/copy API mocked:
    no synchronize anywhere, every copy non-blocking, no metadata uploaded from pageable memory,
    nothing compiled or built for the device at submit time (the worker did it at construction)."""
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    table = cache.table()
    w = TransferWorker(table, 6, [2, 1, 1], backend="torch", path=path, staging_bytes=256)
    log: list[str] = []
    # pretend the cache is on CUDA from here on: the worker and its data path take their CUDA branches
    w._cuda = True
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: _FakeStream(log))
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: _FakeEvent(log, enable_timing))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    w._jobs = CudaJobs(torch.device("cuda", 0))
    w.paths._cuda = True
    w.paths._copy_stream = _FakeStream(log)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream(log))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: _Ctx())
    monkeypatch.setattr(torch.cuda, "device", lambda d: _Ctx())
    for name in ("synchronize", "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, _raiser(f"torch.cuda.{name}"))
    copies: list[tuple[bool, bool]] = []
    real_copy = torch.Tensor.copy_

    def spy_copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        copies.append((non_blocking, src.device.type == "cpu" and self.device.type != "cpu"))
        return real_copy(self, src, non_blocking)

    def no_to(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        raise _Forbidden("Tensor.to on the submit path (pageable host memory would be copied synchronously)")

    cache_keys = set(table.cache)
    monkeypatch.setattr(torch.Tensor, "copy_", spy_copy)
    monkeypatch.setattr(torch.Tensor, "to", no_to)
    monkeypatch.setattr(torch.Tensor, "cuda", no_to)
    for name in ("item", "tolist", "cpu", "__bool__", "synchronize"):
        monkeypatch.setattr(
            torch.Tensor, name, _raiser(f"Tensor.{name} (a device sync on CUDA tensors)"), raising=False
        )
    monkeypatch.setattr(w._jobs, "_complete", lambda *a: None)  # completion is polled later, not here
    # capture check: the real one would call is_current_stream_capturing on a CUDA device only
    monkeypatch.setattr("kvoffload.transfer.worker.check_not_capturing", lambda dev, what: log.append("capture-check"))

    store = (GPULoadStoreSpec([3, 1, 4, 0, 2, 4, 1], [3, 2, 2]), CPULoadStoreSpec([0, 1, 2, 3, 4, 5]))
    load = (CPULoadStoreSpec([0, 1, 2, 3, 4, 5]), GPULoadStoreSpec([6, 7, 5, 3, 1, 0, 4], [3, 2, 2]))
    assert w.transfer_async(1, store) and w.transfer_async(2, load)
    monkeypatch.undo()
    assert len(w._jobs) == 2 and not w._finished and all(j.ok for j in w._jobs._launches.values())
    assert log.count("capture-check") == 2 and "stream.wait_event" in log  # ordered after the engine's stream
    assert all(nb for nb, _ in copies), "a blocking copy on the submit path"
    assert set(table.cache) == cache_keys, "device tables built at submit time"


def test_prepare_runs_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, int]] = []
    from kvoffload.kernels.torch_ref import TorchBackend

    be = TorchBackend()
    monkeypatch.setattr(be, "prepare", lambda table, host_alignment=1: calls.append((table, host_alignment)))
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    w = TransferWorker(cache.table(), 4, backend=be)
    assert len(calls) == 1 and calls[0][0] is w.table
    a = calls[0][1]
    assert a & (a - 1) == 0 and w.host_pool.slot_bytes % a == 0 and w.host_pool.buffer.data_ptr() % a == 0


# ----------------------------------------------------------------------------- integration safety


def test_after_is_checked_before_anything_moves() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    w = TransferWorker(cache.table(), 4, backend="torch")
    spec = (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2]))
    before = w.host_pool.buffer.clone()
    with pytest.raises(InvalidArgumentError, match="after"):
        w.transfer_async(1, spec, after=object())
    assert torch.equal(w.host_pool.buffer, before) and w.get_finished() == []
    assert w.transfer_async(1, spec, after=None) and w.transfer_async(2, spec, after=[])


def test_graph_capture_raises_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(StreamCaptureError, match="CUDA graph"):
        kdevice.check_not_capturing(torch.device("cuda", 0), "transfer_async")
    kdevice.check_not_capturing(torch.device("cpu"), "transfer_async")  # no CUDA, nothing to capture
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    w = TransferWorker(cache.table(), 4, backend="torch")
    w.device = torch.device("cuda", 0)  # as if the cache were on CUDA: the check comes first
    with pytest.raises(StreamCaptureError):
        w.transfer_async(1, (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2])))
    assert w.get_finished() == [] and w.num_in_flight == 0


@dataclass
class _Group:
    gpu_block_size: Any
    offloaded_block_size: Any


def test_block_size_factors_from_block_sizes_checked_at_construction() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    table = cache.table()
    # groups_three: flash-attn [2, nb, 2, ...] -> 2 tokens; MLA [nb, 3, 8] -> 3; flashinfer [nb, 2, 1, ...] -> 1
    assert [g.tokens_per_block for g in table.groups] == [2, 3, 1]
    w = TransferWorker(table, 4, [_Group(2, 8), _Group(3, 3), _Group(1, 2)], backend="torch")
    assert w.factors.tolist() == [4, 1, 2]
    with pytest.raises(InvalidArgumentError, match=r"block_size_factors\[0\].*multiple"):
        TransferWorker(table, 4, [_Group(2, 7), _Group(3, 3), _Group(1, 1)], backend="torch")
    with pytest.raises(InvalidArgumentError, match=r"block_size_factors\[1\].*3 tokens"):
        TransferWorker(table, 4, [_Group(2, 4), _Group(4, 8), _Group(1, 1)], backend="torch")
    with pytest.raises(InvalidTypeError, match=r"block_size_factors\[2\].gpu_block_size"):
        TransferWorker(table, 4, [_Group(2, 4), _Group(3, 3), _Group(True, 1)], backend="torch")
