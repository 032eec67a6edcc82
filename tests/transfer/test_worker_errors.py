"""TransferWorker: bad input gives typed errors before anything is written; constructor checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.transfer.worker import TransferWorker
from tests.transfer.test_worker import Cache, _simple_store, _worker, groups_three

# ----------------------------------------------------------------------------- bad input


def _snapshot(w: TransferWorker, cache: Cache) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    return w.host_pool.buffer.clone(), cache.clone_bases()


def _unchanged(w: TransferWorker, cache: Cache, snap: tuple[torch.Tensor, list[list[torch.Tensor]]]) -> bool:
    pool, bases = snap
    return torch.equal(w.host_pool.buffer, pool) and all(
        torch.equal(a, b) for a, b in zip(sum(cache.bases, []), sum(bases, []), strict=True)
    )


BAD_SPECS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    (
        "slot out of range",
        lambda: (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 6])),
        InvalidArgumentError,
        "slot id 6",
    ),
    (
        "load slot out of range",
        lambda: (CPULoadStoreSpec([0, 9, 1]), GPULoadStoreSpec([3, 1, 4], [1, 1, 1])),
        InvalidArgumentError,
        "slot id 9",
    ),
    (
        "too many slots",
        lambda: (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2, 3])),
        InvalidArgumentError,
        "slot ids",
    ),
    (
        "too few slots",
        lambda: (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1])),
        InvalidArgumentError,
        "slot ids",
    ),
    (
        "group count",
        lambda: (GPULoadStoreSpec([3, 1], [1, 1]), CPULoadStoreSpec([0, 1])),
        InvalidArgumentError,
        "groups",
    ),
    (
        "gpu block out of range",
        lambda: (GPULoadStoreSpec([3, 7, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2])),
        InvalidArgumentError,
        "block id 7 of group 1",
    ),
    (
        "store same slot twice",
        lambda: (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 1])),
        InvalidArgumentError,
        "same slot",
    ),
    (
        "load same block twice",
        lambda: (CPULoadStoreSpec([0, 1, 2, 3]), GPULoadStoreSpec([3, 3, 1, 4], [2, 1, 1])),
        InvalidArgumentError,
        "same GPU block",
    ),
    (
        "gpu gpu",
        lambda: (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), GPULoadStoreSpec([3, 1, 4], [1, 1, 1])),
        InvalidTypeError,
        "GPULoadStoreSpec",
    ),
    (
        "cpu cpu",
        lambda: (CPULoadStoreSpec([0, 1, 2]), CPULoadStoreSpec([0, 1, 2])),
        InvalidTypeError,
        "CPULoadStoreSpec",
    ),
    ("not a pair", lambda: (CPULoadStoreSpec([0, 1, 2]),), InvalidTypeError, "pair"),
    (
        "three specs",
        lambda: (CPULoadStoreSpec([0]), CPULoadStoreSpec([0]), CPULoadStoreSpec([0])),
        InvalidTypeError,
        "pair",
    ),
    ("not specs", lambda: ([0, 1, 2], [3, 1, 4]), InvalidTypeError, "LoadStoreSpec"),
    ("dict", lambda: {"src": 1}, InvalidTypeError, "pair"),
]


@pytest.mark.parametrize("name, make, exc, match", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_typed_error_nothing_written(name: str, make: Callable[[], object], exc: type, match: str) -> None:
    w, cache = _worker()
    snap = _snapshot(w, cache)
    with pytest.raises(exc, match=match):
        w.transfer_async(1, make())  # type: ignore[arg-type]
    assert _unchanged(w, cache, snap)
    assert w.get_finished() == [] and w.num_in_flight == 0


@pytest.mark.parametrize("job_id, exc", [(True, InvalidTypeError), (1.0, InvalidTypeError), ("1", InvalidTypeError)])
def test_bad_job_id(job_id: object, exc: type) -> None:
    w, cache = _worker()
    gpu, cpu = _simple_store(w)
    with pytest.raises(exc, match="job_id"):
        w.transfer_async(job_id, (gpu, cpu))  # type: ignore[arg-type]
    assert w.get_finished() == []


def test_bad_constructor_arguments() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    table = cache.table()
    with pytest.raises(InvalidTypeError, match="table"):
        TransferWorker(cache.tensors, 4)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="num_cpu_blocks"):
        TransferWorker(table, 0)
    with pytest.raises(InvalidTypeError, match="num_cpu_blocks"):
        TransferWorker(table, True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="block_size_factors"):
        TransferWorker(table, 4, [1, 2])
    with pytest.raises(InvalidArgumentError, match=r"block_size_factors\[1\]"):
        TransferWorker(table, 4, [1, 0, 1])
    with pytest.raises(InvalidTypeError, match="block_size_factors"):
        TransferWorker(table, 4, True)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="block_size_factors"):
        TransferWorker(table, 4, "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="max_programs"):
        TransferWorker(table, 4, max_programs=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_programs"):
        TransferWorker(table, 4, backend=TorchBackend(), max_programs=4)
    with pytest.raises(InvalidTypeError, match="backend"):
        TransferWorker(table, 4, backend=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="unknown kernel backend"):
        TransferWorker(table, 4, backend="nope")


def test_device_mismatch_backend_unavailable() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)

    class GpuOnly(TorchBackend):
        name = "gpu-only"

        @classmethod
        def is_available(cls, device: torch.device) -> bool:
            return torch.device(device).type == "cuda"

    with pytest.raises(BackendUnavailableError):
        TransferWorker(cache.table(), 4, backend=GpuOnly())
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError):
            TransferWorker(cache.table(), 4, backend="page_loop")


def test_slot_bytes_sized_for_largest_group_and_factor() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    rb = [cache.record_bytes(g) for g in range(3)]
    assert rb == [128, 72, 32]
    w = TransferWorker(cache.table(), 5, [1, 3, 5])
    assert w.host_pool.slot_bytes == max(128, 3 * 72, 5 * 32) == 216
    assert w.host_pool.buffer.numel() == 5 * 216


def test_max_programs_reaches_triton_backend() -> None:
    from kvoffload.kernels.registry import available_backends

    if "triton" not in available_backends("cpu"):
        pytest.skip("triton not available")
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 3)
    w = TransferWorker(cache.table(), 4, backend="triton", max_programs=3)
    assert w.backend.config(cache.table().device).num_programs == 3  # type: ignore[attr-defined]
    w2 = TransferWorker(cache.table(), 4, backend="torch", max_programs=3)  # no programs: ignored
    assert isinstance(w2.backend, TorchBackend)


@pytest.mark.parametrize("ids,idx", [([1.5], 0), ([1, 2.5], 1), ((3, 4, "5"), 2), ([0, True], 1)])
def test_wait_names_the_bad_index(ids: object, idx: int) -> None:
    from tests.transfer.test_worker import _worker

    w, _ = _worker()
    with pytest.raises(InvalidTypeError, match=rf"job_ids\[{idx}\]"):
        w.wait(ids)  # type: ignore[arg-type]
