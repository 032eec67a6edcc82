"""The CUDA submit path on a CPU-only machine (kvoffload.testing.fake_cuda): the job table each
launch reads against an independent reference, every bad input a typed error with nothing
enqueued, the compiled entry and its fallback to Triton's public launch, merged launches and
expedited loads beside them."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec  # noqa: E402
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, StreamCaptureError  # noqa: E402
from kvoffload.kernels.layout import KVCacheTable  # noqa: E402
from kvoffload.kernels.triton_backend import TritonBackend  # noqa: E402
from kvoffload.kernels.triton_launch import Pointer  # noqa: E402
from kvoffload.testing.fake_cuda import FakeCuda, as_cuda_table, fake_cuda  # noqa: E402
from kvoffload.transfer.worker import TransferWorker  # noqa: E402

NUM_BLOCKS, NUM_SLOTS, LAYERS = 16, 12, 3


@pytest.fixture
def fake() -> Iterator[FakeCuda]:
    with fake_cuda() as f:
        yield f


def _table(groups: int = 1) -> KVCacheTable:
    g0 = [torch.zeros(2, NUM_BLOCKS, 2, 2, 8, dtype=torch.float16) for _ in range(LAYERS)]
    if groups == 1:
        return as_cuda_table(KVCacheTable.from_tensors([g0], "flash_attn"))
    g1 = [torch.zeros(NUM_BLOCKS, 4, 8, dtype=torch.bfloat16)]
    return as_cuda_table(KVCacheTable.from_tensors([g0, g1], ["flash_attn", "mla"]))


def _worker(groups: int = 1, factors: Any = 1, backend: Any = "triton", **kw: Any) -> TransferWorker:
    return TransferWorker(_table(groups), NUM_SLOTS, factors, backend=backend, path="direct", **kw)


def _rows(address: int, n: int) -> list[list[int]]:
    """The ``n`` rows of the job table at ``address``, read from memory as the kernel would."""
    return np.ctypeslib.as_array((ctypes.c_int64 * (3 * n)).from_address(address)).reshape(n, 3).tolist()


def _reference_rows(w: TransferWorker, gpu: GPULoadStoreSpec, cpu: CPULoadStoreSpec) -> list[list[int]]:
    """Rows from the documented mapping, one block at a time (host offsets in the kernel's units)."""
    unit = w.kernel.unit  # type: ignore[union-attr]
    rows, c, first = [], 0, 0
    for g, n in enumerate(gpu.group_sizes.tolist()):
        f = int(w.factors[g])
        skip = int(gpu.block_indices[g]) % f
        rec = w.table.groups[g].record_bytes
        for j in range(n):
            slot = int(cpu.block_ids[c + (skip + j) // f])
            if rec:
                off = slot * w.host_pool.slot_bytes + ((skip + j) % f) * rec
                rows.append([int(gpu.block_ids[first + j]), g, off // unit])
        c += 0 if n == 0 else -(-(skip + n) // f)
        first += n
    return rows


def _launch_args(fake: FakeCuda, k: int = -1) -> tuple[int, tuple[Any, ...]]:
    grid, args = fake.launches[k]
    return grid[0], args


def _address(arg: Any) -> int:
    return arg if isinstance(arg, int) else arg.data_ptr()


# ----------------------------------------------------------------------------- job tables


@pytest.mark.parametrize(
    "groups, factors, sizes, indices",
    [(1, 1, [5], [0]), (1, 3, [7], [4]), (2, [1, 1], [3, 2], [0, 0]), (2, [2, 3], [4, 5], [1, 7])],
)
@pytest.mark.parametrize("store", [True, False])
def test_job_table_matches_the_mapping(
    fake: FakeCuda, groups: int, factors: Any, sizes: list[int], indices: list[int], store: bool
) -> None:
    w = _worker(groups, factors)
    assert w.kernel is not None and w.kernel.entry == "compiled"
    rng = np.random.default_rng(sum(sizes))
    ids = np.concatenate([rng.permutation(NUM_BLOCKS)[:n] for n in sizes])
    fs = [factors] * groups if isinstance(factors, int) else factors
    need = sum(-(-(i % f + n) // f) for n, i, f in zip(sizes, indices, fs, strict=True) if n)
    gpu, cpu = GPULoadStoreSpec(ids, sizes, indices), CPULoadStoreSpec(rng.permutation(NUM_SLOTS)[:need])
    assert w.transfer_async(1, (gpu, cpu) if store else (cpu, gpu))
    grid, args = _launch_args(fake)
    expected = _reference_rows(w, gpu, cpu)
    assert args[5] == len(expected) and _rows(args[4], args[5]) == expected
    assert args[4] % 16 == 0 and args[1] == w.host_pool.buffer.data_ptr()
    assert args[8] is store and 1 <= grid <= w.backend.config(w.device).num_programs  # type: ignore[attr-defined]
    (res,) = w.get_finished()
    assert (
        res.job_id == 1
        and res.success
        and res.transfer_size == sum(w.table.groups[g].record_bytes for _, g, _ in expected)
    )
    w.shutdown()


# ----------------------------------------------------------------------------- bad input


def _state(w: TransferWorker, fake: FakeCuda) -> tuple[Any, ...]:
    free = sorted((cap, len(tables)) for cap, tables in w._tables._free.items())
    batch = None if w._batch is None else (w._batch.rows, len(w._batch.jobs))
    return len(fake.launches), dict(fake.calls), free, w.num_in_flight, batch, set(w._unreported)


GOOD_STORE = (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([3, 4]))
BAD = [
    ("x", GOOD_STORE, {}, InvalidTypeError, "job_id"),
    (1, (GPULoadStoreSpec([1, 2]),), {}, InvalidTypeError, "pair"),
    (1, (GPULoadStoreSpec([1]), GPULoadStoreSpec([1])), {}, InvalidTypeError, "GPULoadStoreSpec"),
    (1, (GPULoadStoreSpec([1, 2]), "x"), {}, InvalidTypeError, "LoadStoreSpec"),
    (1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([3])), {}, InvalidArgumentError, "slot ids"),
    (1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([3, NUM_SLOTS])), {}, InvalidArgumentError, "out of range"),
    (1, (GPULoadStoreSpec([1, NUM_BLOCKS]), CPULoadStoreSpec([3, 4])), {}, InvalidArgumentError, "block id"),
    (1, (GPULoadStoreSpec([-1, 2]), CPULoadStoreSpec([3, 4])), {}, InvalidArgumentError, "non-negative"),
    (1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([-3, 4])), {}, InvalidArgumentError, "non-negative"),
    (1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([3, 3])), {}, InvalidArgumentError, "same slot"),
    (1, (CPULoadStoreSpec([3, 4]), GPULoadStoreSpec([2, 2])), {}, InvalidArgumentError, "same GPU block"),
    (1, (GPULoadStoreSpec([1], [1], [-1]), CPULoadStoreSpec([3])), {}, InvalidArgumentError, "block_indices"),
    (1, GOOD_STORE, {"expedited": True}, InvalidArgumentError, "only loads"),
    (1, GOOD_STORE, {"expedited": 1}, InvalidTypeError, "expedited"),
    (1, GOOD_STORE, {"after": object()}, InvalidTypeError, "after"),
    (7, GOOD_STORE, {}, InvalidArgumentError, "already in flight"),  # job 7 is in flight
]


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("job_id, spec, kw, error, match", BAD)
def test_bad_input_is_a_typed_error_with_nothing_enqueued(
    fake: FakeCuda, merge: bool, job_id: Any, spec: Any, kw: dict[str, Any], error: type, match: str
) -> None:
    w = _worker(merge=merge)
    assert w.transfer_async(7, (GPULoadStoreSpec([5]), CPULoadStoreSpec([6])))  # in flight or in the batch
    before = _state(w, fake)
    with pytest.raises(error, match=match):
        w.transfer_async(job_id, spec, **kw)
    assert _state(w, fake) == before
    assert [r.job_id for r in w.get_finished()] == [7]
    w.shutdown()


def test_graph_capture_is_refused_before_anything(fake: FakeCuda) -> None:
    w = _worker()
    before = _state(w, fake)
    fake.capturing = True
    with pytest.raises(StreamCaptureError):
        w.transfer_async(1, GOOD_STORE)
    fake.capturing = False
    assert _state(w, fake) == before
    w.shutdown()


# ----------------------------------------------------------------------------- entries


def test_compiled_and_plain_entries_launch_the_same_kernel_arguments(fake: FakeCuda) -> None:
    compiled = _worker()
    plain = TransferWorker(compiled.table, NUM_SLOTS, backend=TritonBackend(entry="plain"), path="direct")
    assert compiled.kernel.entry == "compiled" and plain.kernel.entry == "plain"  # type: ignore[union-attr]
    spec = (CPULoadStoreSpec([3, 4, 5]), GPULoadStoreSpec([7, 1, 9]))
    compiled.transfer_async(1, spec)
    grid_c, args_c = _launch_args(fake)
    plain.transfer_async(1, spec)
    grid_p, args_p = _launch_args(fake)
    assert grid_c == grid_p and len(args_c) == len(args_p)
    assert all(isinstance(a, Pointer) for a in args_p[:5]) and all(isinstance(a, int) for a in args_c[:5])
    assert [_address(args_p[i]) for i in (0, 2, 3)] == [_address(args_c[i]) for i in (0, 2, 3)]  # cache, tables
    assert (_address(args_c[1]), _address(args_p[1])) == (
        compiled.host_pool.buffer.data_ptr(),
        plain.host_pool.buffer.data_ptr(),
    )
    assert _rows(args_c[4], 3) == _rows(_address(args_p[4]), 3)  # same rows, each worker its own table
    assert args_c[5:] == args_p[5:]  # n, max_views, max_page and the constexprs
    for w in (compiled, plain):
        assert len(w.get_finished()) == 1
        w.shutdown()


@pytest.mark.parametrize("why", ["version", "hook"])
def test_compiled_entry_falls_back_to_the_public_launch(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    import triton
    from triton import knobs

    from kvoffload.kernels import triton_launch

    if why == "version":
        monkeypatch.setattr(triton, "__version__", "3.5.1")
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    monkeypatch.setattr(triton_launch, "_logged", set())
    with caplog.at_level(logging.INFO, logger="kvoffload.kernels.triton_launch"):
        w = _worker()
        w2 = _worker()
    assert w.kernel.entry == "plain" and w2.kernel.entry == "plain"  # type: ignore[union-attr]
    said = [r.getMessage() for r in caplog.records if "kernel[grid]" in r.getMessage()]
    assert len(said) == 1 and ("3.5.1" in said[0] if why == "version" else "hook" in said[0])
    with pytest.raises(InvalidArgumentError, match="compiled"):
        TransferWorker(w.table, NUM_SLOTS, backend=TritonBackend(entry="compiled"))
    w.transfer_async(1, GOOD_STORE)
    assert isinstance(_launch_args(fake)[1][0], Pointer)
    assert len(w.get_finished()) == 1
    w.shutdown()
    w2.shutdown()


# ----------------------------------------------------------------------------- merged launches


def test_merged_jobs_go_out_in_one_launch_and_complete_one_by_one(fake: FakeCuda) -> None:
    w = _worker(merge=True)
    specs = [(GPULoadStoreSpec([k, k + 8]), CPULoadStoreSpec([2 * k, 2 * k + 1])) for k in range(4)]
    for k, spec in enumerate(specs):
        assert w.transfer_async(10 + k, spec)
    assert len(fake.launches) == 0 and w.num_in_flight == 4
    results = w.get_finished()
    assert len(fake.launches) == 1
    grid, args = _launch_args(fake)
    expected = sum((_reference_rows(w, g, c) for g, c in specs), [])
    assert args[5] == 8 and _rows(args[4], 8) == expected
    record = w.table.groups[0].record_bytes
    assert [(r.job_id, r.success, r.transfer_size) for r in results] == [(10 + k, True, 2 * record) for k in range(4)]
    assert w.num_in_flight == 0 and w.get_finished() == []
    w.shutdown()


def test_merged_launch_waits_for_every_jobs_producers(fake: FakeCuda) -> None:
    w = _worker(merge=True)
    events = [torch.cuda.Event(), torch.cuda.Event()]
    w.transfer_async(1, (GPULoadStoreSpec([1]), CPULoadStoreSpec([1])), after=events[0])
    w.transfer_async(2, (GPULoadStoreSpec([2]), CPULoadStoreSpec([2])))  # the current stream
    w.transfer_async(3, (GPULoadStoreSpec([3]), CPULoadStoreSpec([3])), after=events[1])
    w.transfer_async(4, (GPULoadStoreSpec([4]), CPULoadStoreSpec([4])))  # the current stream again
    assert w._batch is not None and w._batch.producers[0] is events[0] and w._batch.producers[2] is events[1]
    assert len(w._batch.producers) == 3  # one event for the current stream, re-recorded at each submit
    waits = fake.calls["stream.wait_event"]
    w.flush()
    assert fake.calls["stream.wait_event"] - waits == 3 and len(fake.launches) == 1
    assert len(w.get_finished()) == 4
    w.shutdown()


def test_a_job_of_the_other_direction_or_naming_a_batched_destination_starts_a_new_launch(fake: FakeCuda) -> None:
    w = _worker(merge=True)
    w.transfer_async(1, (GPULoadStoreSpec([1, 2]), CPULoadStoreSpec([1, 2])))
    w.transfer_async(2, (GPULoadStoreSpec([3]), CPULoadStoreSpec([2])))  # slot 2 again: after job 1
    w.transfer_async(3, (GPULoadStoreSpec([4]), CPULoadStoreSpec([5])))
    assert len(fake.launches) == 0
    w.transfer_async(4, (CPULoadStoreSpec([2]), GPULoadStoreSpec([6])))  # a load: the stores go first
    assert [a[5] for _, a in fake.launches] == [2, 2]  # job 1, then jobs 2 and 3
    assert [r[2] for r in _rows(fake.launches[1][1][4], 2)] == [
        2 * w.host_pool.slot_bytes // w.kernel.unit,
        5 * w.host_pool.slot_bytes // w.kernel.unit,
    ]  # type: ignore[union-attr]
    assert w._batch is not None and not w._batch.store
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2, 3, 4]
    assert len(fake.launches) == 3
    w.shutdown()


def test_expedited_loads_never_wait_for_a_merge(fake: FakeCuda) -> None:
    w = _worker(merge=True)
    w.transfer_async(1, (CPULoadStoreSpec([1]), GPULoadStoreSpec([1])))
    w.transfer_async(2, (CPULoadStoreSpec([2]), GPULoadStoreSpec([2])), expedited=True)
    assert len(fake.launches) == 1 and fake.launches[0][1][5] == 1  # the expedited one, alone, at once
    assert w._batch is not None and [j[0] for j in w._batch.jobs] == [1]
    w.wait([1])  # waiting flushes
    assert len(fake.launches) == 2 and w._batch is None
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2]
    w.shutdown()


def test_a_failed_merged_launch_fails_its_jobs_only(fake: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _worker(merge=True)
    real = w.kernel.launch  # type: ignore[union-attr]
    calls = [0]

    def flaky(*a: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("launch failed")
        real(*a)

    monkeypatch.setattr(w.kernel, "launch", flaky)
    for k in range(2):
        w.transfer_async(k, (GPULoadStoreSpec([k]), CPULoadStoreSpec([k])))
    w.flush()
    for k in range(2, 5):
        w.transfer_async(k, (GPULoadStoreSpec([k]), CPULoadStoreSpec([k])))
    w.flush()
    w.transfer_async(5, (GPULoadStoreSpec([5]), CPULoadStoreSpec([5])))
    results = {r.job_id: r.success for r in w.get_finished()}
    assert results == {0: True, 1: True, 2: False, 3: False, 4: False, 5: True}
    free_before = sum(len(t) for t in w._tables._free.values())
    w.shutdown()
    assert free_before == sum(len(t) for t in w._tables._free.values())  # every table came back
