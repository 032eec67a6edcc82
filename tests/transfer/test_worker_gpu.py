"""TransferWorker on CUDA: compiled kernels, stream ordering, event-polled completion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidTypeError, StreamCaptureError
from kvoffload.transfer.worker import STORE, TransferWorker
from tests.transfer.test_worker import Cache, RaisingBackend, _backend_or_skip, groups_three, run_round_trip

pytestmark = pytest.mark.gpu

GPU_BACKENDS = ["triton", "torch", "page_loop"]
_SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU spin: long enough to observe ordering


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize(
    "factors, third, sizes, indices",
    [
        ([1, 1, 1], "empty", [4, 3, 2], [0, 0, 0]),
        ([3, 3, 3], "empty", [5, 4, 3], [4, 2, 0]),
        ([3, 1, 2], "flashinfer", [7, 3, 0], [1, 5, 3]),
    ],
)
def test_round_trip_cuda(backend: str, factors: list[int], third: str, sizes: list[int], indices: list[int]) -> None:
    run_round_trip(_backend_or_skip(backend, "cuda"), factors, third, sizes, indices, seed=11, device="cuda")


def test_random_round_trips_cuda_triton() -> None:
    rng = np.random.default_rng(2)
    for seed in range(8):
        factors = rng.integers(1, 4, 3).tolist()
        sizes = [int(rng.integers(0, 6)) for _ in range(2)] + [int(rng.integers(0, 5))]
        run_round_trip(
            "triton", factors, "flashinfer", sizes, rng.integers(0, 9, 3).tolist(), seed, device="cuda", num_slots=20
        )


def _store_spec() -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    return GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2])


@pytest.mark.parametrize("engine_stream", [False, True])
def test_store_waits_for_engine_stream_and_polls_without_blocking(engine_stream: bool) -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 5, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    assert w.host_pool.pinned and w.host_pool.buffer.is_pinned()
    k = cache.tensors[0][0]  # group 0, tensor 0: flash-attn fp16 [2, 9, 2, 2, 4]
    stream = torch.cuda.Stream() if engine_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(_SLEEP_CYCLES)
        k[0, 3].fill_(1.5)  # the "forward pass" writes block 3 after a long kernel
        assert w.transfer_async(1, _store_spec())
        assert w.get_finished() == []  # still queued behind the engine's work: polled, not waited
    w.wait([1])
    res = w.get_finished()
    assert [(r.job_id, r.success, r.transfer_type) for r in res] == [(1, True, STORE)]
    assert res[0].transfer_time > 0
    page = w.host_pool.slot_view(0)[: k[0, 3].numel() * 2]
    assert torch.equal(page, k[0, 3].contiguous().view(torch.uint8).flatten().cpu())
    assert torch.equal(page.view(torch.float16), torch.full((page.numel() // 2,), 1.5, dtype=torch.float16))
    w.shutdown()


def test_load_is_ordered_after_engine_work_on_its_blocks() -> None:
    """A load must not overwrite GPU blocks that earlier engine kernels still read."""
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 6, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    k = cache.tensors[0][0]
    w.host_pool.buffer.fill_(0)
    before = k[0, 3].clone()
    torch.cuda._sleep(_SLEEP_CYCLES)
    snapshot = k[0, 3].clone()  # engine reads block 3 after a long kernel
    assert w.transfer_async(2, (CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([3, 1, 4], [1, 1, 1])))
    w.wait([2])
    torch.cuda.synchronize()
    assert torch.equal(snapshot, before)  # the read saw the old bytes
    assert int(k[0, 3].view(torch.uint8).abs().sum()) == 0
    assert [r.success for r in w.get_finished()] == [True]


def test_launch_failure_is_success_false_on_cuda() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 7, "cuda")
    w = TransferWorker(cache.table(), 4, backend=RaisingBackend())
    assert w.transfer_async(1, _store_spec())
    w.wait([1])
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(1, False, 0)]


def test_shutdown_drains_in_flight_jobs() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 8, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    torch.cuda._sleep(_SLEEP_CYCLES)
    assert w.transfer_async(1, _store_spec())
    w.shutdown()
    assert [r.success for r in w.get_finished()] == [True]


def test_max_programs_on_cuda() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 9, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton", max_programs=2)
    assert w.backend.config(torch.device("cuda")).num_programs == 2  # type: ignore[attr-defined]
    run_round_trip("triton", [1, 1, 1], "flashinfer", [3, 3, 3], [0, 0, 0], seed=3, device="cuda")


# ----------------------------------------------------------------------------- data path v2 on CUDA


@pytest.mark.parametrize("path", ["direct", "staged", "dma"])
def test_round_trip_every_path_cuda(path: str) -> None:
    run_round_trip("triton", [3, 1, 2], "flashinfer", [7, 3, 2], [1, 5, 3], seed=21, device="cuda", path=path)
    # a staging ring smaller than the job: pieces through reused segments, copy/compute streams
    run_round_trip(
        "triton", [2, 2, 2], "flashinfer", [5, 4, 3], [0, 1, 0], seed=22, device="cuda", path=path, staging_bytes=512
    )


@pytest.mark.parametrize("path", ["direct", "staged", "dma"])
def test_submit_path_does_not_synchronize_cuda(path: str) -> None:
    """torch's sync debug mode raises on any synchronising CUDA call made while submitting."""
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 31, "cuda")
    w = TransferWorker(cache.table(), 6, [2, 1, 1], backend="triton", path=path)
    store = (GPULoadStoreSpec([3, 1, 4, 0, 2, 4, 1], [3, 2, 2]), CPULoadStoreSpec([0, 1, 2, 3, 4, 5]))
    load = (CPULoadStoreSpec([0, 1, 2, 3, 4, 5]), GPULoadStoreSpec([6, 7, 5, 3, 1, 0, 4], [3, 2, 2]))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert w.transfer_async(1, store) and w.transfer_async(2, load)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    w.wait([1, 2])
    assert [r.success for r in w.get_finished()] == [True, True]
    w.shutdown()


def test_worker_stream_has_high_priority() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 32, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    assert w._jobs.stream.priority < torch.cuda.Stream().priority
    w.shutdown()


def test_after_event_orders_a_store_behind_the_producer() -> None:
    """The engine names the event after the forward pass that wrote the KV; the caller's current
    stream has nothing to do with it."""
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 33, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    k = cache.tensors[0][0]
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(_SLEEP_CYCLES)
        k[0, 3].fill_(2.5)
        done = torch.cuda.Event()
        done.record(producer)
    assert w.transfer_async(1, _store_spec(), after=done)  # submitted from the default stream
    w.wait([1])
    assert [r.success for r in w.get_finished()] == [True]
    page = w.host_pool.slot_view(0)[: k[0, 3].numel() * 2].view(torch.float16)
    assert torch.equal(page, torch.full_like(page, 2.5))
    with pytest.raises(InvalidTypeError, match="after"):
        w.transfer_async(2, _store_spec(), after="stream")
    w.shutdown()


def test_submit_during_graph_capture_is_a_typed_error() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 34, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    x = torch.zeros(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
        with pytest.raises(StreamCaptureError, match="CUDA graph"):
            w.transfer_async(1, _store_spec())
    assert w.num_in_flight == 0
    w.shutdown()
