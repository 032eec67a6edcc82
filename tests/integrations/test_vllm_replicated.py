"""vLLM's replicated layout end to end: vLLM's Scheduler and one ``KVOffloadConnector`` per rank.

An MLA model at tensor-parallel 2 and 4 (:mod:`tests.integrations.tp_engine`; vLLM decides the
replicated layout itself): the pool holds one copy, rank 0 alone stores, every rank loads, and
every computed position of every rank is checked at every step. A head-split model at the same
sizes keeps one copy per rank. Failed transfers: a store that fails on rank 0 is dropped for every
rank; a load that fails on one rank is recomputed and its chunks are dropped.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import logging  # noqa: E402
import mmap  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from tests.integrations.test_vllm_e2e import _Backend  # noqa: E402
from tests.integrations.tp_engine import BLOCK_SIZE, TPEngine  # noqa: E402

ROW = mmap.PAGESIZE  # one chunk of either model, every copy, rounded up to the page


def extra(chunks: int = 64, **kw: Any) -> dict[str, Any]:
    return {
        "spec_name": "KVOffloadSpec",
        "spec_module_path": "kvoffload.integrations.vllm",
        "cpu_bytes_to_use": chunks * ROW,
        "kernel_backend": "torch",
        **kw,
    }


def fs_tier(root: Path) -> list[dict[str, Any]]:
    return [{"type": "fs", "root_dir": str(root), "n_read_threads": 1, "n_write_threads": 1}]


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 997 + 1 for i in range(n)]


PROMPTS = {"a": prompt(1, 29), "b": prompt(2, 17), "c": prompt(1, 16) + prompt(3, 9)}


def run_twice(e: TPEngine) -> None:
    """Run :data:`PROMPTS`, wipe every rank's GPU cache, run them again; same tokens both times."""
    for rid, p in PROMPTS.items():
        e.add(rid, p)
    e.run()
    e.reset_gpu()
    for rid, p in PROMPTS.items():
        e.add(rid + "-again", p)
    e.run()
    for rid in PROMPTS:
        assert e.outputs[rid + "-again"] == e.outputs[rid]


def region_file(worker: Any) -> tuple[int, int]:
    """(device, inode) of the shared-region file a worker maps."""
    st = os.fstat(worker.region.region.fd)
    return st.st_dev, st.st_ino


@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "fs-tier"])
@pytest.mark.parametrize("tp", [2, 4])
def test_mla_is_stored_once_by_rank_0_and_loaded_by_every_rank(tp: int, tiers: bool, tmp_path: Path) -> None:
    e = TPEngine(extra(secondary_tiers=fs_tier(tmp_path) if tiers else []), tp)
    try:
        assert [e.spec(r).replicated_layout for r in range(tp)] == [True] * tp  # as vLLM decided it
        assert e.spec(0).num_chunks == 64  # one copy: cpu_bytes_to_use is not divided by the ranks
        # one shared region, every rank on slot 0 of each row
        assert len({region_file(e.worker(r)) for r in range(tp)}) == 1
        assert [e.worker(r).region.offset for r in range(tp)] == [0] * tp
        run_twice(e)
        counts = [e.worker(r).counts for r in range(tp)]
        assert counts[0]["stores"] >= 3 and all(c["stores"] == 0 for c in counts[1:])  # rank 0 alone stores
        assert all(c["loads"] == counts[0]["loads"] >= 3 for c in counts)  # every rank loads
        assert all(c["failed_stores"] == c["failed_loads"] == 0 for c in counts)
    finally:
        e.close()


@pytest.mark.parametrize("tiers", [False, True], ids=["no-tiers", "fs-tier"])
@pytest.mark.parametrize("tp", [2, 4])
def test_head_split_model_keeps_one_copy_per_rank(tp: int, tiers: bool, tmp_path: Path) -> None:
    e = TPEngine(extra(secondary_tiers=fs_tier(tmp_path) if tiers else []), tp, mla=False)
    try:
        assert not any(e.spec(r).replicated_layout for r in range(tp))
        assert e.spec(0).num_chunks == 64  # a row holds every rank's slot (one page here)
        if tiers:  # one region, each rank in its own slot of each row
            assert len({region_file(e.worker(r)) for r in range(tp)}) == 1
            assert [e.worker(r).region.offset for r in range(tp)] == [
                r * e.spec(0).cpu_page_size_per_worker for r in range(tp)
            ]
        else:  # a private pool in each worker
            assert all(e.worker(r).region is None for r in range(tp))
        run_twice(e)  # the check compares each rank's own heads
        counts = [e.worker(r).counts for r in range(tp)]
        assert all(c["stores"] == counts[0]["stores"] >= 3 for c in counts)  # every rank stores its own KV
        assert all(c["loads"] == counts[0]["loads"] >= 3 for c in counts)
    finally:
        e.close()


def test_a_store_that_failed_on_rank_0_is_loaded_by_no_rank() -> None:
    """Rank 0's first store job fails: the scheduler drops its chunks, so no rank loads the bytes
    that never arrived (the other ranks cannot see the failure themselves); the blocks are
    recomputed, and every rank's KV stays right (checked at every step)."""
    e = TPEngine(extra(), 2)
    try:
        paths = _Backend(e.worker(0).transfer_worker.paths)
        e.worker(0).transfer_worker.paths = paths
        paths.fail_pack = 1
        e.add("a", PROMPTS["a"])
        e.run()
        assert e.worker(0).counts["failed_stores"] == 1 and e.worker(1).counts["failed_stores"] == 0
        stored = len(e.manager.core)
        assert stored == 0  # the failed job held every full chunk of the prompt
        e.reset_gpu()
        e.add("a-again", PROMPTS["a"])
        e.run()
        assert e.outputs["a-again"] == e.outputs["a"]
        assert e.worker(0).counts["loads"] == e.worker(1).counts["loads"] == 0  # nothing to load: recomputed
        assert len(e.manager.core) == len(PROMPTS["a"]) // BLOCK_SIZE  # stored afresh by the second run
    finally:
        e.close()


def test_a_load_that_failed_on_the_last_rank_is_recomputed_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """The last rank's load fails (rank 0's succeeds): vLLM recomputes the blocks, every rank's KV
    stays right, and the scheduler learns of the failure through the aggregated worker metadata
    (the first rank's, into which vLLM folds the others') and drops the chunks."""
    e = TPEngine(extra(), 2)
    try:
        paths = _Backend(e.worker(1).transfer_worker.paths)
        e.worker(1).transfer_worker.paths = paths
        e.add("a", PROMPTS["a"])
        e.run()
        e.reset_gpu()
        paths.fail_unpack = 1
        with caplog.at_level(logging.WARNING, logger="kvoffload.integrations.vllm.connector"):
            e.add("a-again", PROMPTS["a"])
            e.run()
        assert e.outputs["a-again"] == e.outputs["a"]
        assert e.worker(1).counts["failed_loads"] == 1 and e.worker(0).counts["failed_loads"] == 0
        dropped = [r.getMessage() for r in caplog.records if "load job" in r.getMessage()]
        assert len(dropped) == 1 and "chunk(s) dropped" in dropped[0]
    finally:
        e.close()
