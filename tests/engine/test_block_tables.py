"""The engine kit's sliding-window block-table example (docs/engine-kit.md), run as written there."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kvoffload import (
    CPUOffloadingManager,
    GroupOffloadConfig,
    KVCacheTable,
    OffloadingScheduler,
    OffloadingSchedulerConfig,
    ScheduledRequest,
    TransferWorker,
)


def test_sliding_window_group_table_with_placeholders() -> None:
    torch.manual_seed(0)
    kv = [[torch.randn(2, 32, 16, 2, 8).half()] for _ in range(2)]  # two groups, one layer each
    worker = TransferWorker(KVCacheTable.from_tensors(kv, "flash_attn"), 16, [2, 2])
    groups = [GroupOffloadConfig(0, 16, 32), GroupOffloadConfig(1, 16, 32, sliding_window_size_in_blocks=1)]
    sched = OffloadingScheduler(OffloadingSchedulerConfig(groups), CPUOffloadingManager(16))
    hashes = [bytes([i]) * 16 for i in range(1, 8)]  # 7 x 16 = 112 tokens

    def request(rid: str) -> SimpleNamespace:
        return SimpleNamespace(
            request_id=rid, block_hashes=hashes, num_tokens=112, num_prompt_tokens=112, kv_transfer_params=None
        )

    def step(new: list[ScheduledRequest]) -> list:
        out = sched.build_step(new, [], [])
        for job in out.load_jobs + out.store_jobs:
            assert worker.transfer_async(job.job_id, job.spec)
        sched.complete_jobs(worker.get_finished())
        return out.load_jobs

    a = request("A")
    assert sched.get_num_new_matched_tokens(a, 0) == (0, False)
    table_a = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7]]
    step([ScheduledRequest(a, 0, 112, table_a)])
    sched.request_finished(a, table_a)

    before = [t[0].clone() for t in kv]
    b = request("B")
    n, is_async = sched.get_num_new_matched_tokens(b, 0)
    assert (n, is_async) == (96, True)
    table_b = [[11, 12, 13, 14, 15, 16, 17], [0, 0, 0, 0, 21, 22, 23]]
    sched.update_state_after_alloc(b, table_b, n)
    (load,) = step([])  # B waits for its load job (it computes once that completed)
    gpu = load.spec[1]
    assert gpu.block_ids.tolist() == [11, 12, 13, 14, 15, 16, 21, 22]
    assert gpu.block_indices.tolist() == [0, 4]
    assert torch.equal(kv[0][0][:, 11:17], kv[0][0][:, 1:7])
    assert torch.equal(kv[1][0][:, 21:23], kv[1][0][:, 5:7])
    # nothing else changed: the placeholder block 0 and every block outside the load
    for g, written in ((0, range(11, 17)), (1, range(21, 23))):
        untouched = [i for i in range(32) if i not in written]
        assert torch.equal(kv[g][0][:, untouched], before[g][:, untouched])
    assert step([ScheduledRequest(b, n, 112 - n, table_b)]) == []  # then computes its last 16 tokens
