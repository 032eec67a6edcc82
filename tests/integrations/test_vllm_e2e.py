"""End to end: vLLM's real Scheduler and OffloadingConnector (both roles) with kvoffload behind them.

Every engine step checks every computed position of every running request against the value the
fake model wrote for that (token, position) (see ``vllm_harness``). Every test runs with vLLM's
``async_scheduling`` off and on (the ``async_scheduling`` fixture: vLLM's ``AsyncScheduler``, steps
overlapped as vLLM's engine core overlaps them; see ``test_vllm_async_order`` for why not through a
vLLM ``LLM`` on this CPU build).
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import mmap  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.integrations.vllm_harness import BLOCK_SIZE, PAGE, Engine, KVMismatch, Shape  # noqa: E402


def row_bytes(factor: int = 1, page: int = PAGE) -> int:
    """Host bytes one chunk of ``factor`` GPU blocks of ``page`` bytes costs: rounded up to the OS
    page, as vLLM's CPU spec sizes a chunk."""
    return -(-page * factor // mmap.PAGESIZE) * mmap.PAGESIZE


def extra(chunks: int = 64, factor: int = 1, **kw: Any) -> dict[str, Any]:
    cfg = {
        "spec_name": "KVOffloadSpec",
        "spec_module_path": "kvoffload.integrations.vllm",
        "cpu_bytes_to_use": chunks * row_bytes(factor),
        "kernel_backend": "torch",
    }
    if factor != 1:
        cfg["block_size"] = BLOCK_SIZE * factor
    cfg.update(kw)
    return cfg


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 997 + 1 for i in range(n)]


class _Backend:
    """Wraps the transfer worker's data path (its checked ``pack``/``unpack`` and the ``run`` of a
    job the worker mapped): ``fail_pack``/``fail_unpack`` make that many stores/loads raise,
    ``noop_unpack`` makes loads move nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fail_pack = 0
        self.fail_unpack = 0
        self.noop_unpack = False

    def _moves(self, store: bool) -> bool:
        """Raise an injected failure, or say whether the copy is to run."""
        if store and self.fail_pack:
            self.fail_pack -= 1
            raise RuntimeError("injected store failure")
        if not store and self.fail_unpack:
            self.fail_unpack -= 1
            raise RuntimeError("injected load failure")
        return store or not self.noop_unpack

    def run(self, job: Any, to_host: bool) -> Any:
        return self.inner.run(job, to_host) if self._moves(to_host) else "direct"

    def pack(self, *args: Any) -> None:
        if self._moves(True):
            self.inner.pack(*args)

    def unpack(self, *args: Any) -> None:
        if self._moves(False):
            self.inner.unpack(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def wrap_backend(e: Engine) -> _Backend:
    tw = e.worker.transfer_worker
    tw.paths = _Backend(tw.paths)
    return tw.paths


def run_twice(e: Engine, prompts: dict[str, list[int]], max_tokens: int = 3) -> dict[str, list[int]]:
    """Run ``prompts``, wipe the GPU tier, run them again (as ``<id>-again``); return first outputs."""
    for rid, p in prompts.items():
        e.add(rid, p, max_tokens)
    e.run()
    first = {rid: e.outputs[rid] for rid in prompts}
    e.reset_gpu()
    for rid, p in prompts.items():
        e.add(rid + "-again", p, max_tokens)
    e.run()
    for rid in prompts:
        assert e.outputs[rid + "-again"] == first[rid]
    return first


@pytest.mark.parametrize("factor", [1, 2])
@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "headstart", "kvoffload.cache.policies.lru:LRUPolicy"])
def test_offload_then_reload(policy: str, factor: int, async_scheduling: bool) -> None:
    e = Engine(extra(factor=factor, eviction_policy=policy), async_scheduling=async_scheduling)
    run_twice(e, {"a": prompt(1, 29)})
    full_chunks = 29 // (BLOCK_SIZE * factor)
    assert e.worker.counts["stores"] >= 1
    assert e.worker.counts["loads"] == 1  # the whole hit prefix in one job
    assert e.worker.counts["failed_stores"] == e.worker.counts["failed_loads"] == 0
    assert len(e.manager.core) == full_chunks
    assert e.manager.core.num_tracked_requests == 0


def test_plain_offloading_connector(async_scheduling: bool) -> None:
    """Only spec_name / spec_module_path changed in vLLM's own OffloadingConnector config."""
    e = Engine(extra(), async_scheduling=async_scheduling, connector="OffloadingConnector")
    run_twice(e, {"a": prompt(2, 21)})
    assert e.worker.counts["loads"] == 1


@pytest.mark.parametrize("policy", ["arc", "headstart"])
def test_eviction_pressure_many_prompts(policy: str, async_scheduling: bool) -> None:
    e = Engine(extra(chunks=12, eviction_policy=policy), async_scheduling=async_scheduling)
    prompts = {f"p{i}": prompt(10 + i, 17 + i % 5) for i in range(10)}
    for rid, p in prompts.items():
        e.add(rid, p, 2)
    e.run()
    st = e.manager.core.get_stats()
    assert len(e.manager.core) <= 12
    e.reset_gpu()
    for rid, p in reversed(prompts.items()):  # most recently stored first: those must still be there
        e.add(rid + "-again", p, 2)
    e.run()
    for rid in prompts:
        assert e.outputs[rid + "-again"] == e.outputs[rid]
    assert st.num_pending == 0 and e.manager.core.table.num_pending == 0
    assert e.worker.counts["loads"] >= 1


def test_headstart_learns_seen_before_from_finished_requests(async_scheduling: bool) -> None:
    """vLLM never calls ``touch``: the request-scoped hooks must tell ``headstart`` which chunks a
    later request read (seen list) and which a request only stored (first-sight list)."""
    e = Engine(extra(chunks=12, eviction_policy="headstart"), async_scheduling=async_scheduling)
    shared = prompt(3, 3 * BLOCK_SIZE + 1)
    e.add("a", shared, 2)
    e.run()
    e.reset_gpu()
    e.add("b", shared, 2)  # loads a's chunks
    e.add("c", prompt(4, 2 * BLOCK_SIZE + 1), 2)  # stores its own
    e.run()
    assert e.outputs["b"] == e.outputs["a"]
    core = e.manager.core
    new, seen = core.policy.ordered_slots()
    assert (len(new), len(seen)) == (2, 3)
    assert e.worker.counts["loads"] == 1


def test_a_kv_workload_tag_reaches_headstart(async_scheduling: bool) -> None:
    """``kv_transfer_params["kv_workload"]`` of a vLLM request reaches the policy through kvoffload's
    scheduler and manager: headstart counts the tags its requests carried, and an untagged request
    adds none."""
    e = Engine(extra(chunks=12, eviction_policy="headstart"), async_scheduling=async_scheduling)
    shared = prompt(3, 3 * BLOCK_SIZE + 1)
    for rid, tag in (("a", "text/1"), ("b", None), ("c", "text/2")):
        e.add(rid, shared, 2, None if tag is None else {"kv_workload": tag})
        e.run()
        e.reset_gpu()
    assert e.outputs["c"] == e.outputs["b"] == e.outputs["a"]
    tags = e.manager.core.policy.tags
    assert tags.ids == {"text/1": 1, "text/2": 2}
    assert int(tags.reused[1:].sum()) >= 1  # c read blocks that a tagged request had placed


def test_kv_page_size_changes_no_scheduling(async_scheduling: bool) -> None:
    """A 1-byte, 1-head, 1-channel KV page (bench_vllm's) schedules, stores and loads exactly as the
    default page (8x the bytes per channel, 8x the channels) under eviction pressure with 2-block
    chunks: the same tokens, jobs, steps and chunks held; only the bytes moved shrink."""
    small = Shape(kv_heads=1, head_dim=1, kv_dtype=torch.float8_e4m3fn)
    assert (small.page, Shape().page) == (2 * BLOCK_SIZE, PAGE) and PAGE == 32 * small.page
    runs = []
    for shape in (Shape(), small):
        # the small page cannot hold kv_value: for both, the model writes nothing and nothing is checked
        e = Engine(  # 10 chunks of 2 blocks
            extra(10, 2, eviction_policy="arc"), async_scheduling=async_scheduling, shape=shape, check_kv=False
        )
        prompts = {f"p{i}": prompt(70 + i, 17 + i % 5) for i in range(10)}
        for rid, p in prompts.items():
            e.add(rid, p, 2)
        e.run()
        e.reset_gpu()
        for rid, p in reversed(prompts.items()):
            e.add(rid + "-again", p, 2)
        e.run()
        assert e.worker.transfer_worker.host_pool.nbytes == 20 * shape.page  # a private pool: no row padding
        runs.append((e.outputs, e.worker.counts, e.steps, len(e.manager.core)))
    assert runs[1] == runs[0]
    assert runs[0][1]["loads"] >= 1 and runs[0][1]["stores"] >= 10  # eviction pressure: chunks came back
    with pytest.raises(ValueError, match="check_kv"):
        Engine(extra(), async_scheduling=async_scheduling, shape=small)


def test_shared_prefix(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    shared = prompt(3, 16)
    prompts = {f"s{i}": shared + prompt(30 + i, 6 + i) for i in range(4)}
    run_twice(e, prompts)
    # the shared prefix is stored once: 4 chunks + each request's own full chunks
    own = sum((16 + 6 + i) // BLOCK_SIZE - 4 for i in range(4))
    assert len(e.manager.core) == 4 + own


def test_preemption(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling, num_gpu_blocks=14)
    prompts = {f"r{i}": prompt(50 + i, 14) for i in range(4)}
    preempted = 0
    for rid, p in prompts.items():
        e.add(rid, p, 12)
    for _ in range(300):
        if not e.scheduler.has_unfinished_requests():
            break
        out = e.step()
        preempted += len(getattr(out, "preempted_req_ids", None) or ())
    e.drain()
    assert preempted > 0
    for rid in prompts:
        assert len(e.outputs[rid]) == 12


def test_failed_store_then_reload_recomputes(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    be = wrap_backend(e)
    be.fail_pack = 100  # every store of the first run fails
    e.add("a", prompt(4, 25), 3)
    e.run()
    assert e.worker.counts["failed_stores"] >= 1 and e.worker.counts["stores"] == 0
    assert not e.worker.valid.any()
    be.fail_pack = 0
    e.reset_gpu()
    e.add("b", prompt(4, 25), 3)
    e.run()
    assert e.outputs["b"] == e.outputs["a"]
    # the failed stores were dropped by the manager: nothing was loadable, nothing was loaded
    assert e.worker.counts["loads"] == e.worker.counts["failed_loads"] == 0 and not e.invalid_reported
    assert e.manager.core.table.num_pending == 0
    # b stored its chunks afresh (no slot leaked: the pool holds exactly b's 6 chunks)
    assert len(e.manager.core) == 25 // BLOCK_SIZE and e.worker.valid.sum() == 25 // BLOCK_SIZE


def test_failed_load_recomputes(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    be = wrap_backend(e)
    e.add("a", prompt(5, 25), 3)
    e.run()
    e.reset_gpu()
    be.fail_unpack = 1
    e.add("b", prompt(5, 25), 3)
    e.run()
    assert e.outputs["b"] == e.outputs["a"]
    assert e.worker.counts["failed_loads"] == 1 and e.invalid_reported
    assert e.manager.core.table.num_pinned == 0
    # the chunks that failed to load were dropped; vLLM 0.32 does not store the prefix it had
    # planned to load (empty tier), 0.33 stores the recomputed blocks afresh (valid copies)
    n = 25 // BLOCK_SIZE
    assert len(e.manager.core) in (0, n) and e.worker.valid.sum() == len(e.manager.core)
    for rid in ("c", "d"):  # c (and d) recompute-and-store or load: the data stays right
        e.reset_gpu()
        e.add(rid, prompt(5, 25), 3)
        e.run()
        assert e.outputs[rid] == e.outputs["a"]
    assert len(e.manager.core) == n and e.worker.counts["loads"] >= 1 and e.worker.counts["failed_loads"] == 1


def test_persistent_load_failures_do_not_livelock(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    be = wrap_backend(e)
    e.add("a", prompt(15, 25), 3)
    e.run()
    be.fail_unpack = 1000  # every load fails from now on
    for i in range(3):
        e.reset_gpu()
        e.add(f"r{i}", prompt(15, 25), 3)
        e.run(max_steps=50)
        assert e.outputs[f"r{i}"] == e.outputs["a"]
    # every load fails and drops its chunks; the recomputes store them again (0.33 at once, 0.32 on
    # the next request), so 2 or 3 of the 3 rounds try a load -- none loops
    assert e.worker.counts["failed_loads"] in (2, 3) and e.worker.counts["loads"] == 0


def test_negative_control_load_that_moves_nothing_is_caught(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    be = wrap_backend(e)
    e.add("a", prompt(6, 25), 3)
    e.run()
    e.reset_gpu()
    be.noop_unpack = True
    e.add("b", prompt(6, 25), 3)
    with pytest.raises(KVMismatch):
        e.run()


@pytest.mark.parametrize("factor", [1, 2])
def test_hybrid_model_with_sliding_window_group(factor: int, async_scheduling: bool) -> None:
    """Two KV-cache groups sharing the block pool: full attention + an 8-token sliding window."""
    e = Engine(extra(chunks=128, factor=factor), async_scheduling=async_scheduling, sliding_window=8)
    run_twice(e, {"a": prompt(7, 37), "b": prompt(7, 21) + prompt(8, 10)})
    assert e.worker.counts["loads"] >= 1 and e.worker.counts["failed_loads"] == 0
    groups = {bytes(key[-4:]) for key in e.manager.core.table.index}
    assert groups == {b"\0\0\0\0", b"\0\0\0\1"}  # both groups were offloaded


def test_connector_reset_empties_the_cpu_tier(async_scheduling: bool) -> None:
    e = Engine(extra(), async_scheduling=async_scheduling)
    e.add("a", prompt(9, 25), 3)
    e.run()
    assert len(e.manager.core) > 0
    assert e.scheduler.reset_prefix_cache(reset_connector=True)
    e.drain()
    assert len(e.manager.core) == 0
    e.kv.zero_()
    e.add("b", prompt(9, 25), 3)
    e.run()
    assert e.outputs["b"] == e.outputs["a"] and e.worker.counts["loads"] == 0


def test_plain_connector_stops_rather_than_load_a_failed_store(async_scheduling: bool) -> None:
    """Without KVOffloadConnector nobody collects failed transfers: a load from chunks whose store
    failed is refused and reported as failed, and vLLM stops instead of running on wrong KV."""
    e = Engine(extra(), async_scheduling=async_scheduling, connector="OffloadingConnector")
    be = wrap_backend(e)
    be.fail_pack = 100
    e.add("a", prompt(11, 25), 3)
    e.run()
    be.fail_pack = 0
    e.reset_gpu()
    e.add("b", prompt(11, 25), 3)
    with pytest.raises(AssertionError) as info:
        e.run()
    assert not isinstance(info.value, KVMismatch)
    assert e.worker.counts["failed_loads"] == 1


def test_decode_blocks_offloaded_when_not_prompt_only(async_scheduling: bool) -> None:
    e = Engine(extra(offload_prompt_only=False), async_scheduling=async_scheduling)
    p = prompt(12, 25)
    e.add("a", p, 12)
    e.run()
    assert len(e.manager.core) == (25 + 12 - 1) // BLOCK_SIZE  # KV exists for all but the last token
    e.reset_gpu()
    e.add("turn2", p + e.outputs["a"] + prompt(13, 5), 3)  # the next turn extends the conversation
    e.run()
    assert e.worker.counts["loads"] == 1


def test_store_threshold_stores_on_the_second_offer(async_scheduling: bool) -> None:
    e = Engine(extra(store_threshold=2), async_scheduling=async_scheduling)
    e.add("a", prompt(14, 25), 2)
    e.run()
    assert len(e.manager.core) == 0  # first offer: counted, not stored
    e.reset_gpu()
    e.add("b", prompt(14, 25), 2)
    e.run()
    assert len(e.manager.core) == 25 // BLOCK_SIZE and e.worker.counts["loads"] == 0
    e.reset_gpu()
    e.add("c", prompt(14, 25), 2)
    e.run()
    assert e.worker.counts["loads"] == 1 and e.outputs["c"] == e.outputs["a"]
