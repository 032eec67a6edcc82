"""Expedited loads (vLLM 0.33): on CUDA they do not queue behind earlier transfers; only loads qualify."""

from __future__ import annotations

import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.transfer.worker import LOAD, STORE, TransferWorker
from tests.transfer.test_worker import Cache, as_bytes, groups_three

_SLEEP_CYCLES = 400_000_000  # ~0.2 s of GPU spin on the worker's stream: a long queued transfer


def _specs() -> tuple[tuple[GPULoadStoreSpec, CPULoadStoreSpec], tuple[CPULoadStoreSpec, GPULoadStoreSpec]]:
    store = (GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec([0, 1, 2]))
    load = (CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([5, 2, 0], [1, 1, 1]))
    return store, load


def test_expedited_is_for_loads_only_and_checked() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 5)
    w = TransferWorker(cache.table(), 4, backend="torch")
    store, load = _specs()
    with pytest.raises(InvalidArgumentError, match="only loads can be expedited"):
        w.transfer_async(1, store, expedited=True)
    with pytest.raises(InvalidTypeError, match="expedited"):
        w.transfer_async(1, load, expedited=1)  # type: ignore[arg-type]
    assert w.get_finished() == []  # nothing ran
    assert w.transfer_async(1, store) and w.transfer_async(2, load, expedited=True)
    assert [(r.job_id, r.success, r.transfer_type) for r in w.get_finished()] == [(1, True, STORE), (2, True, LOAD)]
    for g in range(3):  # the load wrote what the store read, block for block
        for a, b in zip(cache.pages(g, [3, 1, 4][g]), cache.pages(g, [5, 2, 0][g]), strict=True):
            assert torch.equal(as_bytes(a), as_bytes(b))
    w.shutdown()


@pytest.mark.gpu
def test_expedited_load_overtakes_a_queued_transfer() -> None:
    cache = Cache(groups_three((9, 7, 5), "flashinfer"), 6, "cuda")
    w = TransferWorker(cache.table(), 4, backend="triton")
    store, load = _specs()
    assert w.transfer_async(1, store)
    w.wait([1])
    assert [r.job_id for r in w.get_finished()] == [1]
    with torch.cuda.stream(w._jobs.stream):
        torch.cuda._sleep(_SLEEP_CYCLES)  # the worker's stream is busy with earlier transfers
    assert w.transfer_async(2, load)  # a regular load: queued behind them
    assert w.transfer_async(3, load[:1] + (GPULoadStoreSpec([6, 3, 1], [1, 1, 1]),), expedited=True)
    w.wait([3])
    assert [r.job_id for r in w.get_finished()] == [3]  # the expedited load is done, the queued one is not
    w.wait([2])
    assert [r.job_id for r in w.get_finished()] == [2]
    w.shutdown()
