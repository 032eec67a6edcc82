"""Two vLLM engines sharing a tier through ``KVOffloadSpec`` + ``secondary_tiers``.

The first engine runs in its own process (``engine_roles``); the second, in this one, starts with
an empty GPU cache and an empty CPU pool, so every block it loads was computed by the first one
and reached it tier -> CPU -> GPU. The harness verifies every computed position of every running
request at every step. Faults (Redis killed, a corrupt value, a promotion failing part-way) must
leave vLLM serving the right KV.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_redis, require_vllm

require_vllm()

import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import redis  # noqa: E402

from kvoffload.errors import InvalidArgumentError  # noqa: E402
from kvoffload.integrations.vllm import KVOffloadSpec  # noqa: E402
from kvoffload.testing.redis_server import RedisServer  # noqa: E402
from tests.integrations import tier_roles  # noqa: E402
from tests.integrations.engine_roles import PROMPTS, extra, prompt, run_prompts, run_until_done  # noqa: E402
from tests.integrations.tier_support import TIER_MODULE, redis_tier, run_role  # noqa: E402
from tests.integrations.vllm_harness import BLOCK_SIZE, Engine, KVMismatch  # noqa: E402

#: full chunks of PROMPTS (the shared 16-token prefix counted once)
SHARED_CHUNKS = 16 // BLOCK_SIZE + (29 - 16) // BLOCK_SIZE + (25 - 16) // BLOCK_SIZE + 23 // BLOCK_SIZE


class Shared:
    """The tiers of the two-engine tests and the first engine's results (one subprocess for all)."""

    def __init__(self, root: Path) -> None:
        require_redis()
        self.redis = RedisServer(root / "redis").start()
        self.tiers = {
            "redis": [redis_tier(self.redis.url)],
            "disk": [{"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(root / "disk")}],
            "vllm-fs": [{"type": "fs", "root_dir": str(root / "fs"), "n_read_threads": 2, "n_write_threads": 2}],
        }
        configs = [{"name": n, "tiers": t} for n, t in self.tiers.items()]
        lines = run_role("tests.integrations.engine_roles", "first", json.dumps(configs), timeout=300)
        self.first = {r["name"]: r for r in lines}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    s = Shared(tmp_path_factory.mktemp("shared-tiers"))
    yield s
    s.redis.stop()


def count_promotions(e: Engine) -> list[int]:
    """Instrument every tier of ``e``: the returned list grows by each promotion job's key count."""
    counts: list[int] = []
    for tier in e.manager.secondary_tiers:
        submit = tier.submit_load

        def counting(job: Any, submit: Any = submit) -> None:
            counts.append(len(job.keys))
            submit(job)

        tier.submit_load = counting
    return counts


@pytest.mark.parametrize("name", ["redis", "disk", "vllm-fs"])
def test_second_engine_loads_what_the_first_computed(shared: Shared, name: str, async_scheduling: bool) -> None:
    """The second engine runs with vLLM's ``async_scheduling`` off and on (promotions and loads
    complete a step later from its scheduler's view)."""
    assert set(shared.first[name]["outputs"]) == set(PROMPTS)
    t0 = time.perf_counter()
    e = Engine(extra(shared.tiers[name]), async_scheduling=async_scheduling)
    try:
        assert len(e.manager.core) == 0  # its own CPU pool starts empty (and its GPU cache)
        promoted = count_promotions(e)
        run_prompts(e, PROMPTS, suffix="-2")
        seconds = time.perf_counter() - t0
        for rid in PROMPTS:
            assert e.outputs[rid + "-2"] == shared.first[name]["outputs"][rid]
        # every full chunk came from the tier (none recomputed), then CPU -> GPU
        assert sum(promoted) == SHARED_CHUNKS
        assert e.worker.counts["loads"] >= 1 and e.worker.counts["failed_loads"] == 0
        tokens = sum(promoted) * BLOCK_SIZE
        print(
            f"\n[{name}] second engine loaded {tokens} tokens from the tier in {seconds:.2f} s "
            f"(first engine {shared.first[name]['seconds']:.2f} s)"
        )
    finally:
        e.close()


def first_engine(tiers: list[dict[str, Any]], prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    e = Engine(extra(tiers))
    try:
        run_prompts(e, prompts)
        return {rid: e.outputs[rid] for rid in prompts}
    finally:
        e.close()


def test_redis_killed_mid_run_keeps_serving(own_redis: RedisServer) -> None:
    tiers = [redis_tier(own_redis.url, socket_timeout=0.5, connect_timeout=0.5)]
    prompts = {f"k{i}": prompt(200 + i, 21) for i in range(4)}
    first = first_engine(tiers, prompts)
    e = Engine(extra(tiers))
    try:
        promoted = count_promotions(e)
        for rid in ("k0", "k1"):
            e.add(rid + "-2", prompts[rid], 3)
        for _ in range(3):
            e.step()
        own_redis.kill()  # mid-run: k0/k1 may be loading, k2/k3 not yet looked up
        for rid in ("k2", "k3"):
            e.add(rid + "-2", prompts[rid], 3)
        run_until_done(e)
        for rid in prompts:
            assert e.outputs[rid + "-2"] == first[rid]
        st = e.manager.secondary_tiers[0].tier.stats()
        assert st.errors + st.dropped_writes + st.read_failures >= 1  # the outage was seen
        assert sum(promoted) < 4 * (21 // BLOCK_SIZE)  # k2/k3 were recomputed, not loaded
    finally:
        e.close()


def test_corrupted_value_is_a_miss(own_redis: RedisServer) -> None:
    tiers = [redis_tier(own_redis.url)]
    p = {"c": prompt(300, 25)}
    first = first_engine(tiers, p)
    r = redis.Redis(port=own_redis.port)
    values = sorted(r.scan_iter(match=b"kvo:*"))
    assert len(values) == 25 // BLOCK_SIZE
    for v in values:  # every value corrupt: nothing may be loaded
        r.setrange(v, r.strlen(v) - 8, b"\x00\xff\x00\xff")
    e = Engine(extra(tiers))
    try:
        run_prompts(e, p, suffix="-2")
        assert e.outputs["c-2"] == first["c"]
        st = e.manager.secondary_tiers[0].tier.stats()
        assert st.rejected_values == len(values) and st.blocks_read == 0
        assert e.worker.counts["loads"] == 0  # recomputed
    finally:
        e.close()


def test_promotion_failing_part_way_recomputes_the_rest(own_redis: RedisServer) -> None:
    tiers = [redis_tier(own_redis.url)]
    p = {"f": prompt(400, 25)}  # 6 chunks
    first = first_engine(tiers, p)
    e = Engine(extra(tiers))
    r = redis.Redis(port=own_redis.port)
    try:
        tier = e.manager.secondary_tiers[0]
        submit = tier.submit_load
        lost: list[bytes] = []

        def losing(job: Any) -> None:  # the 4th value disappears just before the promotion runs
            keys = list(job.keys)
            lost.append(keys[3])
            r.delete(tier.tier.store_key(keys[3]))
            submit(job)

        tier.submit_load = losing
        run_prompts(e, p, suffix="-2")
        assert e.outputs["f-2"] == first["f"]
        assert len(lost) == 1
        st = tier.tier.stats()
        assert st.blocks_read == 5 and st.read_failures == 1  # chunks 0-2 (and 4-5) promoted
        assert e.worker.counts["loads"] == 1  # the 3 chunks before the hole; the rest recomputed
    finally:
        e.close()


@pytest.mark.parametrize(
    ("tiers", "match"),
    [
        ("not-a-list", "must be a list"),
        ([{"type": "no-such-tier"}], "Unknown secondary tier type"),
        ([{"colour": "blue"}], "must be a dict with a 'type'"),
        ([{"type": "NoSuchClass", "module_path": TIER_MODULE}], r"secondary_tiers'\]\[0\]"),
    ],
)
def test_bad_secondary_tiers_fail_at_start(tiers: Any, match: str) -> None:
    cfg = tier_roles.offloading_config(extra(tiers))
    with pytest.raises(InvalidArgumentError, match=match) as info:
        KVOffloadSpec(cfg)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError):
        KVOffloadSpec.build_metric_definitions(extra(tiers))


def test_store_threshold_with_tiers_is_an_error() -> None:
    cfg = tier_roles.offloading_config(extra([redis_tier("redis://127.0.0.1:1")], store_threshold=2))
    with pytest.raises(InvalidArgumentError, match="store_threshold"):
        KVOffloadSpec(cfg)


def test_negative_control_wrong_promoted_bytes_are_caught(own_redis: RedisServer) -> None:
    """A tier that hands back wrong bytes must fail the harness's per-step KV check."""
    tiers = [redis_tier(own_redis.url)]
    p = {"n": prompt(500, 21)}
    first_engine(tiers, p)
    e = Engine(extra(tiers))
    try:
        tier = e.manager.secondary_tiers[0]
        submit, poll = tier.submit_load, tier.get_finished_jobs
        chunks: dict[int, Any] = {}

        def remember(job: Any) -> None:
            chunks[job.job_id] = job.chunk_ids
            submit(job)

        def scramble() -> list[Any]:
            done = list(poll())
            rows = tier.tier.records
            for r in done:
                if r.job_id in chunks:
                    rows[chunks.pop(r.job_id)] ^= 0x5A
            return done

        tier.submit_load, tier.get_finished_jobs = remember, scramble
        with pytest.raises(KVMismatch):
            run_prompts(e, p, suffix="-2")
    finally:
        e.close()


def test_failed_gpu_to_cpu_store_is_dropped_not_cascaded(own_redis: RedisServer) -> None:
    from tests.integrations.test_vllm_e2e import wrap_backend

    tiers = [redis_tier(own_redis.url)]
    p = {"s": prompt(600, 25)}
    e = Engine(extra(tiers))
    try:
        be = wrap_backend(e)
        be.fail_pack = 100  # every GPU -> CPU store of this run fails
        run_prompts(e, p)
        assert e.worker.counts["failed_stores"] >= 1 and e.worker.counts["stores"] == 0
        assert len(e.manager.core) == 0  # dropped from the pool...
        r = redis.Redis(port=own_redis.port)
        assert list(r.scan_iter(match=b"kvo:*")) == []  # ...and never written to the tier
        assert e.manager.core.table.num_pending == 0 and not e.manager._req_state
        be.fail_pack = 0
        e.reset_gpu()
        run_prompts(e, p, suffix="-2")  # now stored and cascaded
        assert e.outputs["s-2"] == e.outputs["s"]
        assert len(list(r.scan_iter(match=b"kvo:*"))) == 25 // BLOCK_SIZE
    finally:
        e.close()
