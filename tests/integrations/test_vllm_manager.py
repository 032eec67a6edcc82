"""kvoffload's vLLM manager against vLLM's contract and against vLLM's own CPUOffloadingManager."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import random  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    Medium,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager  # noqa: E402

from kvoffload.errors import InvalidArgumentError  # noqa: E402
from kvoffload.integrations.vllm import KVOffloadManager, KVOffloadSpec  # noqa: E402
from kvoffload.integrations.vllm.manager import HAS_METADATA_ONLY, key_position_getter  # noqa: E402
from kvoffload.integrations.vllm.policy import VLLM_RANKS_REQUESTS  # noqa: E402

#: vLLM 0.33's managers report the labels of its ``kv_offload_config_info`` metric
HAS_CONFIG_INFO = hasattr(VLLMManager, "config_info")


def k(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def test_contract_types() -> None:
    m = KVOffloadManager(4)
    assert isinstance(m, OffloadingManager)
    c = ReqContext(req_id="a")
    m.on_new_request(c)
    out = m.prepare_store([k(1), k(2), k(1)], c)  # vLLM tolerates repeats
    assert isinstance(out, PrepareStoreOutput) and isinstance(out.store_spec, CPULoadStoreSpec)
    assert out.keys_to_store == [k(1), k(2)] and out.store_spec.block_ids.tolist() == [0, 1]
    assert m.lookup(k(1), c) is LookupResult.HIT_PENDING
    m.complete_store([k(1), k(2)], c)
    assert m.lookup(k(1), c) is LookupResult.HIT and m.lookup(k(3), c) is LookupResult.MISS
    spec = m.prepare_load([k(2)], c)
    assert isinstance(spec, CPULoadStoreSpec) and spec.block_ids.tolist() == [1]
    m.complete_load([k(2)], c)
    m.on_request_finished(c)
    # vLLM 0.33 additions work on 0.32 too
    with m.lock:
        pass
    m.on_reset_flushed()
    assert m.config_info() == [{}]
    assert m.has_pending_work() is False


def test_stats_in_vllms_shape() -> None:
    m = KVOffloadManager(4, store_threshold=2)
    c = ReqContext(req_id="a")
    m.prepare_store([k(1), k(2)], c)  # first offer: filtered
    m.prepare_store([k(1), k(2)], c)  # second: stored (pending)
    m.prepare_load([], c)
    data = m.get_stats().data["data"]
    assert data[CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC][()] == 0.5
    assert data[CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC][()] == 0.5
    assert data[CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC][()] == 0.0
    assert data[CPUOffloadingMetrics.STORES_SKIPPED][()] == 2
    assert data[CPUOffloadingMetrics.CPU_ALLOCATION_SIZE][()] == [
        2
    ]  # the stored call (the filtered one allocated nothing)


@pytest.mark.parametrize("threshold", [0, 2])
def test_every_stat_has_a_metric_definition(threshold: int) -> None:
    """vLLM's Prometheus exporter looks each stat up in the spec's metric definitions."""
    from vllm.v1.kv_offload.base import (
        OffloadingCounterMetadata,
        OffloadingGaugeMetadata,
        OffloadingHistogramMetadata,
    )

    defs = KVOffloadSpec.build_metric_definitions({"store_threshold": threshold})
    m = KVOffloadManager(4, store_threshold=threshold)
    m.prepare_store([k(1)], ReqContext(req_id="a"))
    m.prepare_store([k(1)], ReqContext(req_id="a"))
    data = m.get_stats().data
    kinds = {"gauge": OffloadingGaugeMetadata, "counter": OffloadingCounterMetadata}
    kinds["histogram"] = OffloadingHistogramMetadata
    assert data["data"]
    for name in data["data"]:
        assert isinstance(defs[name], kinds[data["types"][name]]), name


def test_events_and_failed_store() -> None:
    m = KVOffloadManager(2, enable_events=True)
    c = ReqContext(req_id="a")
    m.prepare_store([k(1), k(2)], c)
    m.complete_store([k(1), k(2)], c)
    m.prepare_store([k(3)], c)
    m.complete_store([k(3)], c, success=False)
    evs = list(m.take_events())
    assert [(e.keys, e.removed) for e in evs[:2]] == [([k(1), k(2)], False), ([k(1)], True)]
    assert all(e.medium == Medium.CPU for e in evs)
    if HAS_METADATA_ONLY:  # vLLM 0.33: a failed store announces its metadata removal
        assert evs[2].keys == [k(3)] and evs[2].removed and evs[2].metadata_only
    else:
        assert len(evs) == 2
    assert m.lookup(k(3), c) is LookupResult.MISS and list(m.take_events()) == []


def _spec_config(extra: dict, kv_bytes: int = 1024, world: int = 1, blocks_per_chunk: int = 2) -> SimpleNamespace:
    return SimpleNamespace(
        extra_config=extra,
        enable_kv_cache_events=False,
        groups=(SimpleNamespace(tokens_per_block=16, sliding_window_size_in_chunks=None),),
        cache=SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=SimpleNamespace(world_size=world, rank=0),
        model=SimpleNamespace(max_model_len=4096),
        worker_kv_bytes_per_block=kv_bytes,
        replicated_layout=False,
    )


@pytest.mark.skipif(not HAS_CONFIG_INFO, reason="vLLM < 0.33 has no config_info labels")
@pytest.mark.parametrize("world", [1, 4])
def test_config_info_carries_vllms_capacity_labels(world: int) -> None:
    """vLLM 0.33's dashboards read its CPU tier's capacity labels: kvoffload's spec reports the
    same values as vLLM's own CPU spec for the same pool (page-sized chunks: no padding either way)."""
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    cfg = _spec_config({"cpu_bytes_to_use": 40 * 4096 * world}, kv_bytes=2048, world=world)
    ours = KVOffloadSpec(cfg).get_manager().config_info()[0]
    theirs = CPUOffloadingSpec(cfg).get_manager().config_info()[0]
    assert {k: ours[k] for k in theirs} == theirs
    assert ours["cpu_num_chunks"] == 40 and ours["backend"] == "kvoffload"
    assert tuple(ours) == KVOffloadSpec.config_info_keys({})


def test_spec_reads_vllms_keys() -> None:
    s = KVOffloadSpec(
        _spec_config(
            {"cpu_bytes_to_use": 10 * 4096 + 5, "eviction_policy": "arc", "store_threshold": 2, "max_tracker_size": 7}
        )
    )
    assert s.num_chunks == 10 and s.eviction_policy == "arc"  # a chunk of 2048 KV bytes takes a 4096-byte page
    m = s.get_manager()
    assert m is s.get_manager() and m.core.cache_policy == "arc" and m.core.reuse.max_tracker_size == 7
    s2 = KVOffloadSpec(_spec_config({"cpu_bytes_to_use": 8192, "cache_policy_module_path": "my.mod"}, world=2))
    assert s2.num_chunks == 2 and (s2.eviction_policy, s2.cache_policy_module_path) == ("lru", "my.mod")
    # a registered name comes first, as in vLLM (kvoffload's lru: request_lru inside vLLM 0.33)
    assert s2.get_manager().core.cache_policy == ("request_lru" if VLLM_RANKS_REQUESTS else "lru")
    assert "num_chunks" in KVOffloadSpec.config_info_keys({})
    with pytest.raises(InvalidArgumentError):
        KVOffloadSpec(_spec_config({}))
    with pytest.raises(InvalidArgumentError):
        KVOffloadSpec(_spec_config({"cpu_bytes_to_use": 100}))


#: vLLM's own built-in policy classes, named as a vLLM user names an out-of-tree policy
VLLM_CLASSES = {
    "lru": ("LRUCachePolicy", "vllm.v1.kv_offload.cpu.policies.lru"),
    "arc": ("ARCCachePolicy", "vllm.v1.kv_offload.cpu.policies.arc"),
}


def _policy_args(policy: str, via: str) -> dict[str, str]:
    """kvoffload's own policy, or vLLM's class through the adapter (module path, or a name
    registered with vLLM's CachePolicyFactory)."""
    if via == "kvoffload":
        return {"cache_policy": policy}
    cls_name, module = VLLM_CLASSES[policy]
    if via == "module-path":
        return {"cache_policy": cls_name, "cache_policy_module_path": module}
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    name = f"kvoffload-test-{policy}"
    if name not in CachePolicyFactory._registry:
        CachePolicyFactory.register_cache_policy(name, module, cls_name)
    return {"cache_policy": name}


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("threshold", [0, 2])
@pytest.mark.parametrize("via", ["kvoffload", "module-path", "vllm-factory"])
def test_same_decisions_as_vllms_manager(policy: str, threshold: int, via: str) -> None:
    """A random request trace through vLLM's call sequence: same lookups, slots and evictions --
    with kvoffload's own policy, and with vLLM's own policy class run through the adapter."""
    rng = random.Random(7)
    ours = KVOffloadManager(12, **_policy_args(policy, via), store_threshold=threshold, max_tracker_size=50)
    if via != "kvoffload":
        assert ours.core.cache_policy.startswith("vllm/vllm.v1.kv_offload.cpu.policies.")
    theirs = VLLMManager(12, cache_policy=policy, store_threshold=threshold, max_tracker_size=50)
    prompts = [[k(p * 100 + i) for i in range(rng.randint(2, 6))] for p in range(10)]
    for step in range(150):
        keys = list(rng.choice(prompts))
        cs = [ReqContext(req_id=f"r{step}") for _ in range(2)]
        for m, c in zip((ours, theirs), cs, strict=True):
            m.on_new_request(c)
        hits = []
        for key in keys:
            a, b = ours.lookup(key, cs[0]), theirs.lookup(key, cs[1])
            assert a == b, (step, key)
            if a is not LookupResult.HIT:
                break
            hits.append(key)
        if hits:
            sa, sb = ours.prepare_load(hits, cs[0]), theirs.prepare_load(hits, cs[1])
            assert sa.block_ids.tolist() == sb.block_ids.tolist()
        rest = keys[len(hits) :]
        oa, ob = ours.prepare_store(rest, cs[0]), theirs.prepare_store(rest, cs[1])
        assert (oa is None) == (ob is None), step
        if oa is not None:
            assert oa.keys_to_store == ob.keys_to_store
            assert oa.store_spec.block_ids.tolist() == ob.store_spec.block_ids.tolist()
            assert sorted(oa.evicted_keys) == sorted(ob.evicted_keys), step
        for m, c, o in ((ours, cs[0], oa), (theirs, cs[1], ob)):
            if hits:
                m.complete_load(hits, c)
            if o is not None and o.keys_to_store:
                m.complete_store(o.keys_to_store, c)
            m.on_request_finished(c)


def test_key_positions_read_as_vllms_context_answers() -> None:
    """The request-end position lookup gives the context's own answers (a subclass's too)."""
    c = ReqContext(req_id="a")
    c.set_offload_key_position(k(1), 32)
    get = key_position_getter(c)
    assert get is not None and [get(k(1)), get(k(2))] == [32, None]

    class Shifted(ReqContext):
        def get_offload_key_position(self, key: bytes) -> int | None:
            return 7

    c2 = Shifted(req_id="b")
    c2.set_offload_key_position(k(1), 32)
    get2 = key_position_getter(c2)
    assert get2 is not None and get2(k(1)) == 7


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_out_of_order_stores_age_by_position_as_in_vllm(policy: str) -> None:
    """Keys stored tail first (positions say head first): the same evictions as vLLM's manager."""
    ours, theirs = KVOffloadManager(8, cache_policy=policy), VLLMManager(8, cache_policy=policy)
    for m in (ours, theirs):
        for r, (first, second) in enumerate((([3, 4], [1, 2]), ([7, 8], [5, 6]))):
            c = ReqContext(req_id=f"r{r}")
            m.on_new_request(c)
            for i in first + second:
                c.set_offload_key_position(k(i), 16 * (i - 4 * r))
            for part in (first, second):
                out = m.prepare_store([k(i) for i in part], c)
                assert out is not None
                m.complete_store(out.keys_to_store, c)
            m.on_request_finished(c)
    evicted = []
    for m in (ours, theirs):
        c = ReqContext(req_id="new")
        m.on_new_request(c)
        out = m.prepare_store([k(20), k(21)], c)
        assert out is not None
        evicted.append(list(out.evicted_keys))
    assert evicted[0] == evicted[1] and sorted(evicted[0]) == [k(3), k(4)]


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("n", [3, 40])
def test_sets_and_repeats_as_vllm_passes_them(policy: str, n: int) -> None:
    """complete_store / complete_load with the ``set`` vLLM passes (a few keys and more than the
    manager's small-call limit), prepare_load with a repeated key: the same answers, slots and
    evictions as vLLM's manager, and every pin released exactly once."""
    ours, theirs = KVOffloadManager(2 * n, cache_policy=policy), VLLMManager(2 * n, cache_policy=policy)
    keys = [k(i) for i in range(3 * n)]
    for step, batch in enumerate((keys[:n], keys[n : 2 * n], keys[2 * n :], keys[:n])):
        cs = [ReqContext(req_id=f"r{step}") for _ in range(2)]
        outs = [m.prepare_store(batch, c) for m, c in zip((ours, theirs), cs, strict=True)]
        assert outs[0] is not None and outs[1] is not None
        assert outs[0].keys_to_store == outs[1].keys_to_store
        assert outs[0].store_spec.block_ids.tolist() == outs[1].store_spec.block_ids.tolist()
        assert sorted(outs[0].evicted_keys) == sorted(outs[1].evicted_keys)
        for m, c, o in zip((ours, theirs), cs, outs, strict=True):
            m.complete_store(set(o.keys_to_store), c)
        ready = [key for key in batch if theirs.lookup(key, cs[1]) is LookupResult.HIT]
        assert ready == [key for key in batch if ours.lookup(key, cs[0]) is LookupResult.HIT]
        assert ours.prepare_load(ready + ready[:1], cs[0]).block_ids.tolist() == (
            theirs.prepare_load(ready, cs[1]).block_ids.tolist()
        )  # the repeat taken once
        assert int(ours.core.table.ref[ours.core.table.ref > 0].sum()) == len(ready)
        for m, c in zip((ours, theirs), cs, strict=True):
            m.complete_load(set(ready), c)
            m.on_request_finished(c)
        assert ours.core.table.num_pinned == 0 and int((ours.core.table.ref > 0).sum()) == 0
    assert sorted(key for key in keys if ours.lookup(key, cs[0]) is LookupResult.HIT) == sorted(
        key for key in keys if theirs.lookup(key, cs[1]) is LookupResult.HIT
    )
