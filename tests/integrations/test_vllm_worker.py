"""kvoffload's vLLM worker on vLLM's canonical KV-cache views, its arguments, and the connector's worker metadata."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import os  # noqa: E402
import uuid  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from kvoffload.errors import InvalidArgumentError, InvalidTypeError  # noqa: E402
from kvoffload.integrations.vllm import KVOffloadWorker  # noqa: E402
from kvoffload.integrations.vllm.connector import KVOffloadWorkerMetadata  # noqa: E402
from kvoffload.integrations.vllm.shared_region import WorkerRegion, region_geometry  # noqa: E402

NUM_BLOCKS, PAGE, PADDED = 8, 48, 64


def caches() -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    """Two groups: group 0 has two tensors (one padded), group 1 aliases group 0's first tensor."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 127, (NUM_BLOCKS, PADDED), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 127, (NUM_BLOCKS, PAGE), dtype=torch.int8, generator=g)
    kv = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(a, PADDED), CanonicalKVCacheTensor(b, PAGE)],
        group_data_refs=[
            [CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)],
            [CanonicalKVCacheRef(0, PAGE)],
        ],
    )
    return kv, [a, b]


def test_store_then_load_moves_exactly_the_pages() -> None:
    kv, (a, b) = caches()
    w = KVOffloadWorker(kv, num_cpu_blocks=4, blocks_per_chunk=2, backend="torch")
    # store GPU blocks 1,2 (group 0) into chunk 2 and 3,4 (group 1) into chunk 3 (one key per group)
    src = GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[2, 2], block_indices=[0, 0])
    assert w.submit_store(7, src, CPULoadStoreSpec([2, 3]))
    (r,) = w.get_finished()
    assert r.job_id == 7 and r.success and r.transfer_size == (2 * 2 * PAGE + 2 * PAGE)
    before_a, before_b = a.clone(), b.clone()
    # load it back into blocks 5,6 (group 0) and 7,0 (group 1, which aliases tensor a)
    dst = GPULoadStoreSpec([5, 6, 7, 0], group_sizes=[2, 2], block_indices=[0, 0])
    assert w.submit_load(8, CPULoadStoreSpec([2, 3]), dst)
    (r,) = w.get_finished()
    assert r.success
    exp_a, exp_b = before_a.clone(), before_b.clone()
    exp_a[5, :PAGE], exp_b[5] = before_a[1, :PAGE], before_b[1]
    exp_a[6, :PAGE], exp_b[6] = before_a[2, :PAGE], before_b[2]
    exp_a[7, :PAGE], exp_a[0, :PAGE] = before_a[3, :PAGE], before_a[4, :PAGE]
    assert torch.equal(b, exp_b)
    assert torch.equal(a[:, :PAGE], exp_a[:, :PAGE])
    assert torch.equal(a[:, PAGE:], before_a[:, PAGE:])  # page padding never written


def test_failed_store_makes_its_chunks_unloadable_and_is_reported() -> None:
    kv, _ = caches()
    w = KVOffloadWorker(kv, num_cpu_blocks=4, blocks_per_chunk=1, backend="torch")
    w.report_load_errors = True
    inner = w.transfer_worker.paths

    class Failing:  # the transfer worker's data path, with stores that fail
        def pack(self, *args: object) -> None:
            raise RuntimeError("injected")

        def unpack(self, *args: object) -> None:
            inner.unpack(*args)

        def run(self, job: object, to_host: bool) -> object:
            if to_host:
                raise RuntimeError("injected")
            return inner.run(job, to_host)

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

    w.transfer_worker.paths = Failing()  # type: ignore[assignment]
    spec = GPULoadStoreSpec([1, 2], group_sizes=[1, 1], block_indices=[0, 0])
    w.submit_store(1, spec, CPULoadStoreSpec([0, 1]))
    (r,) = w.get_finished()
    assert r.success  # vLLM asserts success: the failure travels another way
    assert w.take_failed_stores() == {1} and w.take_failed_stores() == set()
    assert not w.valid[:2].any()
    w.submit_load(2, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([5, 6], group_sizes=[1, 1], block_indices=[0, 0]))
    (r,) = w.get_finished()
    assert r.success and w.take_load_errors() == {5, 6} and w.counts["failed_loads"] == 1
    assert w.take_failed_loads() == {2} and w.take_failed_loads() == set()
    # without a collector (plain OffloadingConnector) the failed load is reported as failed
    w.report_load_errors = False
    w.submit_load(3, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([5, 6], group_sizes=[1, 1], block_indices=[0, 0]))
    (r,) = w.get_finished()
    assert not r.success


def test_worker_metadata_aggregates_failed_stores() -> None:
    m1 = KVOffloadWorkerMetadata(completed_jobs={1: 1, 2: 1}, failed_store_jobs={2})
    m2 = KVOffloadWorkerMetadata(completed_jobs={1: 1, 3: 1}, failed_store_jobs={3}, failed_load_jobs={1})
    agg = m1.aggregate(m2)
    assert isinstance(agg, KVOffloadWorkerMetadata)
    assert agg.completed_jobs == {1: 2, 2: 1, 3: 1} and agg.failed_store_jobs == {2, 3}
    assert agg.failed_load_jobs == {1}


def test_sole_writer_must_be_a_bool() -> None:
    kv, _ = caches()
    with pytest.raises(InvalidTypeError, match="sole_writer"):
        KVOffloadWorker(kv, num_cpu_blocks=4, blocks_per_chunk=1, backend="torch", sole_writer=1)  # type: ignore[arg-type]


def test_a_slot_outside_the_row_opens_no_region() -> None:
    """A worker slot the row does not have is refused before the region's file is created."""
    engine_id = f"kvoffload-test-{uuid.uuid4().hex[:12]}"
    one_copy = region_geometry(16 * 4096, 256, 1, copies=1)
    assert (one_copy.num_chunks, one_copy.row_bytes, one_copy.copies) == (16, 4096, 1)
    for slot in (1, -1):
        with pytest.raises(InvalidArgumentError, match="slot must be in"):
            WorkerRegion(engine_id, one_copy, slot)
    assert not os.path.exists(f"/dev/shm/vllm_offload_{engine_id}.mmap")


def test_chunks_beyond_the_pool_fail_the_job_not_the_engine() -> None:
    """A manager sized apart from the pool hands out a chunk past it: that store and that load are
    reported failed (the load's GPU blocks for recompute), the pool and the other chunks untouched."""
    kv, (a, b) = caches()
    w = KVOffloadWorker(kv, num_cpu_blocks=4, blocks_per_chunk=1, backend="torch")
    w.report_load_errors = True
    before = w.transfer_worker.host_pool.records().copy()
    src = GPULoadStoreSpec([1, 2], group_sizes=[1, 1], block_indices=[0, 0])
    assert w.submit_store(1, src, CPULoadStoreSpec([3, 4]))
    assert w.submit_load(
        2, CPULoadStoreSpec([4, 5]), GPULoadStoreSpec([5, 6], group_sizes=[1, 1], block_indices=[0, 0])
    )
    # (vLLM asserts success: the failures travel in the worker metadata and the invalid-block channel)
    assert {(r.job_id, r.success) for r in w.get_finished()} == {(1, True), (2, True)}
    assert w.take_failed_stores() == {1} and w.take_load_errors() == {5, 6}
    assert (w.transfer_worker.host_pool.records() == before).all()
    assert not w.valid.any()  # no store succeeded: no chunk is loadable
