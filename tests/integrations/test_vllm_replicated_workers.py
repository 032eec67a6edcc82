"""Several ranks' workers on one shared region, byte for byte (vLLM's connector worker drives them).

Each rank is vLLM's own worker-role connector (``KVOffloadConnector``, vLLM's connector worker
and its store-writer election) with kvoffload's worker behind it and its own CPU KV cache of
random bytes: different on every rank, so a store by a rank that should not store would show in
what the others load. A store job and then a load job, given to every rank as vLLM's scheduler
gives them: each rank's cache afterwards is compared with a reference made by plain torch
indexing of the caches as they were before (the loaded blocks replaced, nothing else changed).
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402

from tests.integrations.test_vllm_e2e import _Backend  # noqa: E402
from tests.integrations.test_vllm_replicated import ROW, extra, fs_tier, region_file  # noqa: E402
from tests.integrations.tp_engine import LAYER, at_rank, kv_cache_config, vllm_config  # noqa: E402

NUM_BLOCKS = 16
SRC, CHUNKS, DST = [1, 2, 3], [5, 6, 7], [9, 10, 11]  # GPU blocks stored, CPU chunks, GPU blocks loaded
JOBS = {1, 2}  # the store job, the load job


class Ranks:
    """``tp`` worker-role connectors of one engine, each with its own random CPU KV cache."""

    def __init__(self, tp: int, mla: bool, tiers: list[dict[str, Any]]) -> None:
        vc = vllm_config(extra(16, secondary_tiers=tiers), tp, mla, NUM_BLOCKS)
        kcc = kv_cache_config(tp, mla, NUM_BLOCKS)
        page = kcc.kv_cache_groups[0].kv_cache_spec.page_size_bytes
        self.tp = tp
        self.connectors: list[Any] = []
        self.caches: list[torch.Tensor] = []
        for r in range(tp):
            g = torch.Generator().manual_seed(100 + r)
            kv = torch.randint(-128, 128, (NUM_BLOCKS, page), dtype=torch.int8, generator=g)
            c = KVConnectorFactory.create_connector(at_rank(vc, r), KVConnectorRole.WORKER, kcc)
            self.connectors.append(c)
            c.register_kv_caches({LAYER: kv})
            self.caches.append(kv)
        self.aggregator = KVOutputAggregator(expected_finished_count=tp)

    def worker(self, r: int) -> Any:
        return self.connectors[r].connector_worker.worker

    def step(self, load_jobs: dict[int, TransferJob], store_jobs: dict[int, TransferJob]) -> Any:
        """One engine step on every rank (jobs as vLLM's scheduler hands them); the aggregated metadata."""
        meta = OffloadingConnectorMetadata(load_jobs=load_jobs, store_jobs=store_jobs)
        outs: list[ModelRunnerOutput | None] = []
        for c in self.connectors:
            c.handle_preemptions(meta)
            c.bind_connector_metadata(meta)
            c.start_load_kv(None)  # deferred stores of the last step, then this step's loads
            c.wait_for_save()  # this step's stores: queued by the writer, acknowledged by the others
            c.connector_worker.worker.wait(JOBS)  # whichever of them runs on this rank
            c.get_finished(set())
            meta_out = c.build_connector_worker_meta()
            c.clear_connector_metadata()
            outs.append(
                ModelRunnerOutput(
                    req_ids=[],
                    req_id_to_index={},
                    kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=meta_out),
                )
            )
        out = self.aggregator.aggregate(outs, 0)
        return out.kv_connector_output.kv_connector_worker_meta

    def store_then_load(self) -> list[Any]:
        """Store job 1 (SRC -> CHUNKS), an empty step (the writer submits it), load job 2 (CHUNKS -> DST)."""
        store = TransferJob("r", GPULoadStoreSpec(SRC, group_sizes=[3], block_indices=[0]), CPULoadStoreSpec(CHUNKS))
        load = TransferJob("r", CPULoadStoreSpec(CHUNKS), GPULoadStoreSpec(DST, group_sizes=[3], block_indices=[0]))
        return [self.step({}, {1: store}), self.step({}, {}), self.step({2: load}, {})]

    def close(self) -> None:
        for c in self.connectors:
            c.connector_worker.worker.shutdown()


def reference(before: list[torch.Tensor], source: list[int]) -> list[torch.Tensor]:
    """Each rank's cache as it must be: its own bytes, DST replaced by rank ``source[r]``'s SRC."""
    out = [b.clone() for b in before]
    for r, o in enumerate(out):
        o[DST] = before[source[r]][SRC]
    return out


@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "fs-tier"])
@pytest.mark.parametrize("tp", [2, 4])
def test_rank_0_stores_and_every_rank_loads_its_bytes(tp: int, tiers: bool, tmp_path: Path) -> None:
    ranks = Ranks(tp, mla=True, tiers=fs_tier(tmp_path) if tiers else [])
    try:
        before = [kv.clone() for kv in ranks.caches]
        assert all(ranks.connectors[r].connector_worker.spec.replicated_layout for r in range(tp))
        assert len({region_file(ranks.worker(r)) for r in range(tp)}) == 1
        assert ranks.worker(0).region.region.total_size_bytes == 16 * ROW  # one copy of 16 chunks
        metas = ranks.store_then_load()
        for r, (kv, want) in enumerate(zip(ranks.caches, reference(before, [0] * tp), strict=True)):
            assert torch.equal(kv, want), f"rank {r}"
        counts = [ranks.worker(r).counts for r in range(tp)]
        assert [c["stores"] for c in counts] == [1] + [0] * (tp - 1)
        assert [c["loads"] for c in counts] == [1] * tp
        # every rank acknowledges the store (the others without running it), none reports a failure
        assert sum(m.completed_jobs.get(1, 0) for m in metas) == tp
        assert sum(m.completed_jobs.get(2, 0) for m in metas) == tp
        assert not any(getattr(m, "failed_store_jobs", ()) or getattr(m, "failed_load_jobs", ()) for m in metas)
    finally:
        ranks.close()


@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "fs-tier"])
@pytest.mark.parametrize("tp", [2, 4])
def test_head_split_ranks_keep_separate_areas(tp: int, tiers: bool, tmp_path: Path) -> None:
    ranks = Ranks(tp, mla=False, tiers=fs_tier(tmp_path) if tiers else [])
    try:
        before = [kv.clone() for kv in ranks.caches]
        assert not any(ranks.connectors[r].connector_worker.spec.replicated_layout for r in range(tp))
        if tiers:
            assert len({region_file(ranks.worker(r)) for r in range(tp)}) == 1
            assert len({ranks.worker(r).region.offset for r in range(tp)}) == tp
        ranks.store_then_load()
        for r, (kv, want) in enumerate(zip(ranks.caches, reference(before, list(range(tp))), strict=True)):
            assert torch.equal(kv, want), f"rank {r}"
        assert [ranks.worker(r).counts["stores"] for r in range(tp)] == [1] * tp
    finally:
        ranks.close()


@pytest.mark.parametrize("tp", [2, 4])
def test_a_store_failed_on_rank_0_is_reported_once_for_all(tp: int) -> None:
    """Rank 0's store fails: the aggregated metadata names the job as failed (the scheduler drops
    its chunks for every rank); the other ranks acknowledge it and report nothing of their own;
    rank 0 refuses to load the chunks it knows are bad (it is their only writer)."""
    ranks = Ranks(tp, mla=True, tiers=[])
    try:
        ranks.worker(0).report_load_errors = True
        paths = _Backend(ranks.worker(0).transfer_worker.paths)
        ranks.worker(0).transfer_worker.paths = paths
        paths.fail_pack = 1
        metas = ranks.store_then_load()
        assert metas[1].failed_store_jobs == {1} and sum(m.completed_jobs.get(1, 0) for m in metas) == tp
        counts = [ranks.worker(r).counts for r in range(tp)]
        assert counts[0]["failed_stores"] == 1 and all(c["failed_stores"] == c["stores"] == 0 for c in counts[1:])
        assert counts[0]["failed_loads"] == 1 and metas[2].failed_load_jobs == {2}
        assert ranks.worker(0).take_load_errors() == set(DST)
    finally:
        ranks.close()
