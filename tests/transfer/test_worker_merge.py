"""TransferWorker(merge=True) byte-exact through Triton's interpreter: a step's jobs in one
launch move exactly what the same jobs one by one would, later jobs win where two name the same
destination, and a load after a store of the same slot reads what the store wrote."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.worker import TransferWorker
from tests.transfer.test_worker import Cache, GroupSpec, _backend_or_skip, _contig, as_bytes, groups_three

pytestmark = pytest.mark.interpreter

NB = (9, 7, 5)
NUM_SLOTS = 10


def _one_group() -> list[GroupSpec]:
    return [GroupSpec("flash_attn", (_contig(torch.float16, (2, 9, 2, 2, 4)),), (0, 0))]


def _record(cache: Cache, g: int, block: int) -> torch.Tensor:
    return torch.cat([as_bytes(p) for p in cache.pages(g, block)])


def _worker(cache: Cache, merge: bool) -> TransferWorker:
    w = TransferWorker(cache.table(), NUM_SLOTS, backend=_backend_or_skip("triton", "cpu"), merge=merge)
    assert w.kernel is not None and w.kernel.entry == "interpreter"
    return w


@pytest.mark.parametrize("groups", ["one", "three"])
def test_merged_stores_and_loads_match_the_reference(groups: str) -> None:
    specs = _one_group() if groups == "one" else groups_three(NB, "flashinfer")
    ng = len(specs)
    src, dst = Cache(specs, 1), Cache(specs, 2)
    w_src, w_dst = _worker(src, merge=True), _worker(dst, merge=True)
    rng = np.random.default_rng(3)
    slots = rng.permutation(NUM_SLOTS)
    jobs, k = [], 0
    for _ in range(3):  # three jobs, one block per group each, distinct slots
        ids = [int(rng.integers(0, NB[g] if groups == "three" else 9)) for g in range(ng)]
        jobs.append((ids, slots[k : k + ng].tolist()))
        k += ng
    pool_before = w_src.host_pool.buffer.clone()
    for j, (ids, s) in enumerate(jobs):
        assert w_src.transfer_async(j, (GPULoadStoreSpec(ids, [1] * ng), CPULoadStoreSpec(s)))
    assert torch.equal(w_src.host_pool.buffer, pool_before), "merged jobs ran before the poll"
    results = w_src.get_finished()
    assert sorted((r.job_id, r.success) for r in results) == [(j, True) for j in range(3)]
    expected = pool_before.clone()
    slot_bytes = w_src.host_pool.slot_bytes
    for ids, s in jobs:
        for g in range(ng):
            rec = _record(src, g, ids[g])
            expected[s[g] * slot_bytes : s[g] * slot_bytes + rec.numel()] = rec
    assert torch.equal(w_src.host_pool.buffer, expected)

    # the same slots loaded back, merged, into other blocks of another cache
    w_dst.host_pool.buffer.copy_(w_src.host_pool.buffer)
    targets = [[(ids[g] + 1) % (NB[g] if groups == "three" else 9) for g in range(ng)] for ids, _ in jobs]
    for j, ((_, s), t) in enumerate(zip(jobs, targets, strict=True)):
        assert w_dst.transfer_async(10 + j, (CPULoadStoreSpec(s), GPULoadStoreSpec(t, [1] * ng)))
    assert len(w_dst.get_finished()) == 3
    for (ids, _), t in zip(jobs, targets, strict=True):
        for g in range(ng):
            assert torch.equal(_record(dst, g, t[g]), _record(src, g, ids[g]))
    w_src.shutdown()
    w_dst.shutdown()


def test_later_job_wins_and_a_load_reads_the_store_before_it() -> None:
    src = Cache(_one_group(), 4)
    w = _worker(src, merge=True)
    w.transfer_async(1, (GPULoadStoreSpec([2, 3]), CPULoadStoreSpec([4, 5])))
    w.transfer_async(2, (GPULoadStoreSpec([6]), CPULoadStoreSpec([5])))  # slot 5 again: block 6 must win
    w.transfer_async(3, (CPULoadStoreSpec([5]), GPULoadStoreSpec([0])))  # then slot 5 -> block 0
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2, 3]
    slot_bytes, rb = w.host_pool.slot_bytes, src.record_bytes(0)
    assert torch.equal(w.host_pool.buffer[5 * slot_bytes : 5 * slot_bytes + rb], _record(src, 0, 6))
    assert torch.equal(w.host_pool.buffer[4 * slot_bytes : 4 * slot_bytes + rb], _record(src, 0, 2))
    assert torch.equal(_record(src, 0, 0), _record(src, 0, 6))
    w.shutdown()


def test_merge_off_and_on_move_the_same_bytes() -> None:
    caches = [Cache(_one_group(), 5), Cache(_one_group(), 5)]
    workers = [_worker(caches[0], merge=False), _worker(caches[1], merge=True)]
    rng = np.random.default_rng(0)
    steps = [[(rng.permutation(9)[:2].tolist(), rng.permutation(NUM_SLOTS)[:2].tolist()) for _ in range(3)]]
    for w in workers:
        jid = 0
        for step in steps:
            for ids, s in step:
                w.transfer_async(jid, (GPULoadStoreSpec(ids), CPULoadStoreSpec(s)))
                jid += 1
            assert len(w.get_finished()) == len(step)
    assert torch.equal(workers[0].host_pool.buffer, workers[1].host_pool.buffer)
    for w in workers:
        w.shutdown()
