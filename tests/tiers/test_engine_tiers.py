"""Tiers through the reference engine: two replica processes sharing a Redis tier and a 3-node Redis
Cluster (`kvoffload demo --tier`), Redis SIGKILLed mid-run and restarted, values deleted between
lookup and load -- every loaded block verified against the KV the engine computes, no slot leak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.drive import drive
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.workload import ChatWorkload
from kvoffload.engine.tiered_options import TieredOptions
from kvoffload.errors import InvalidTypeError
from kvoffload.testing.redis_server import RedisCluster3, RedisServer

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["--conversations", "8", "--gpu-blocks", "96", "--cpu-blocks", "48", "--no-progress"]


def _replica(url: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(
        [sys.executable, "-m", "kvoffload", "demo", "--tier", url, "--json", str(out), *DEMO],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(out.read_text())


def _share(url: str, tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    one = _replica(url, tmp / "one.json")
    two = _replica(url, tmp / "two.json")
    s1, s2, t1, t2 = one["stats"], two["stats"], one["tiers"][0], two["tiers"][0]
    assert t1["blocks_written"] > 0 and t1["writes_failed"] == t1["writes_dropped"] == 0
    # replica 2 loads replica 1's prefixes from the tier and sends them on to the GPU, all verified
    assert t2["blocks_loaded"] > 0 and t2["promotions_failed"] == 0
    assert s2["tier_blocks_loaded"] > 0 and s2["verified_blocks"] > 0
    assert s1["verification_failures"] == s2["verification_failures"] == 0
    assert s2["prefill_loaded_tokens"] > s1["prefill_loaded_tokens"]
    assert s2["prefill_computed_tokens"] < s1["prefill_computed_tokens"]
    assert t2["tokens_loaded"] == t2["blocks_loaded"] * two["geometry"]["offloaded_block_tokens"]
    return one, two


def test_two_replica_processes_share_a_redis_tier(redis_url: str, tmp_path: Path) -> None:
    one, two = _share(redis_url, tmp_path)
    assert "@" not in json.dumps(two["settings"])  # tier names, never credentials


def test_two_replica_processes_share_a_redis_cluster(redis_cluster: RedisCluster3, tmp_path: Path) -> None:
    for n in redis_cluster.nodes:
        n.cli("flushall")
    one, two = _share(redis_cluster.url, tmp_path)
    sizes = [int(n.cli("dbsize")) for n in redis_cluster.nodes]
    # every value either replica created is on its shard (the engine's blocks_written also counts
    # stores of keys already there, SET NX refused: the tier's own counters tell the two apart)
    created = [r["tiers"][0]["tier_stats"] for r in (one, two)]
    for r, st in zip((one, two), created, strict=True):
        assert r["tiers"][0]["blocks_written"] == st["blocks_written"] + st["writes_skipped"]
    assert sum(sizes) == sum(st["blocks_written"] for st in created) and min(sizes) > 0


CFG = EngineConfig(
    groups=(GroupConfig(16, 2, None, 2),),
    num_gpu_blocks=96,
    num_cpu_blocks=48,
    max_num_seqs=8,
    max_num_batched_tokens=256,
)


def _engine(url: str) -> Engine:
    return Engine(CFG, tiers=[url], tier_options={"backoff_initial": 0.05, "backoff_max": 0.2, "socket_timeout": 0.5})


def _no_leak(e: Engine) -> None:
    assert e.tiered is not None and e.tiered.drain(timeout=30)
    st = e.tiered.primary.get_stats()
    assert (st.num_pending, st.num_pinned, e.tiered.num_reserved(), e.tiered.num_write_pinned()) == (0, 0, 0, 0)


def _run(e: Engine, seed: int, n: int = 6) -> None:
    turns = list(ChatWorkload(conversations=n, turns=2, seed=seed))
    for t in turns:
        object.__setattr__(t, "request_id", f"{seed}-{t.request_id}")
    drive(e, turns, 6)


def test_redis_killed_mid_run_and_restarted(own_redis: RedisServer) -> None:
    first = _engine(own_redis.url)
    _run(first, seed=1)
    first.shutdown()
    assert first.tiered.usage()[0].blocks_written > 0  # type: ignore[union-attr]
    e = _engine(own_redis.url)
    tier = e.tiered.tiers[0]  # type: ignore[union-attr]
    submit, load_now = tier.submit_load, tier.load_now

    def kill() -> None:
        """Redis dies (SIGKILL) after the lookups said hit, as the first promotion starts (on the
        tier's threads or within the lookup)."""
        own_redis.kill()
        tier.submit_load, tier.load_now = submit, load_now  # type: ignore[method-assign]

    def kill_then_load(job_id: int, keys: list[bytes], slots: list[int]) -> None:
        kill()
        submit(job_id, keys, slots)

    def kill_then_load_now(keys: list[bytes], slots: list[int]) -> list[bool]:
        kill()
        return load_now(keys, slots)

    tier.submit_load, tier.load_now = kill_then_load, kill_then_load_now  # type: ignore[method-assign]
    try:
        _run(e, seed=1)  # the engine keeps running: the loads fail, lookups miss, writes drop; it recomputes
        u = e.tiered.usage()[0]  # type: ignore[union-attr]
        assert u.promotions_failed > 0 and u.blocks_promoted == 0 and u.writes_failed > 0
        assert e.stats.requests_finished == 12 and e.stats.tier_blocks_loaded == 0
        ts = tier.stats()
        assert ts.dropped_writes + ts.write_failures == u.writes_failed
        _no_leak(e)
        own_redis.start()  # empty, same port: used again without restarting the engine
        time.sleep(0.3)  # past the back-off window
        before = u.blocks_written
        _run(e, seed=3)
        _no_leak(e)
        assert e.tiered.usage()[0].blocks_written > before  # type: ignore[union-attr]
        assert int(own_redis.cli("dbsize")) > 0
        assert e.stats.verification_failures == 0 and e.stats.failed_loads == 0
    finally:
        e.shutdown()


def test_values_deleted_between_lookup_and_load_recompute(redis_url: str) -> None:
    first = _engine(redis_url)
    _run(first, seed=4)
    first.shutdown()
    e = _engine(redis_url)
    tier = e.tiered.tiers[0]  # type: ignore[union-attr]
    client = redis.Redis.from_url(redis_url)
    submit, load_now = tier.submit_load, tier.load_now
    deleted: list[bytes] = []

    def delete(keys: list[bytes]) -> None:
        """Another client deletes every value after the lookup said hit, before the load (on the
        tier's threads or within the lookup)."""
        client.delete(*[tier.store_key(k) for k in keys])  # type: ignore[attr-defined]
        deleted.extend(keys)

    def delete_then_load(job_id: int, keys: list[bytes], slots: list[int]) -> None:
        delete(keys)
        submit(job_id, keys, slots)

    def delete_then_load_now(keys: list[bytes], slots: list[int]) -> list[bool]:
        delete(keys)
        return load_now(keys, slots)

    tier.submit_load, tier.load_now = delete_then_load, delete_then_load_now  # type: ignore[method-assign]
    try:
        _run(e, seed=4)  # same workload: every tier hit is gone at load time
        u = e.tiered.usage()[0]  # type: ignore[union-attr]
        assert deleted and u.promotions_failed == len(deleted) and u.blocks_promoted == 0
        assert e.stats.tier_blocks_loaded == 0 and e.stats.verification_failures == 0
        assert e.stats.requests_finished == 12  # recomputed, never hung
        _no_leak(e)
    finally:
        e.shutdown()
        client.close()


def test_engine_passes_tiered_options(redis_url: str) -> None:
    """``Engine(tiered_options=...)`` builds its tiered manager with them: every promotion is read
    on the tier's threads (budget 0), and ``on_promotion`` sees, per request, exactly the blocks
    promoted (the tier's own count); a wrong type is refused before anything opens."""
    first = _engine(redis_url)
    _run(first, seed=5)
    first.shutdown()
    seen: dict[str, int] = {}

    def on_promotion(req_id: str, n: int) -> None:
        seen[req_id] = seen.get(req_id, 0) + n

    opts = TieredOptions(sync_load_budget_bytes=0, max_promoted_blocks=7, on_promotion=on_promotion)
    e = Engine(CFG, tiers=[redis_url], tiered_options=opts)
    tier = e.tiered.tiers[0]  # type: ignore[union-attr]
    assert (e.tiered.sync_load_budget_bytes, e.tiered.max_promoted_blocks) == (0, 7)  # type: ignore[union-attr]
    assert e.tiered.probe_in_lookup and e.tiered.max_write_blocks == CFG.num_cpu_blocks // 2  # type: ignore[union-attr]
    load_now = tier.load_now

    def refuse(keys: list[bytes], slots: list[int]) -> list[bool]:
        raise AssertionError("no load within the lookup with a budget of 0")

    tier.load_now = refuse  # type: ignore[method-assign]
    try:
        _run(e, seed=5)
        _no_leak(e)
        u = e.tiered.usage()[0]  # type: ignore[union-attr]
        assert u.blocks_promoted > 0 and sum(seen.values()) == u.blocks_promoted + u.promotions_failed
        assert set(seen) <= {f"5-{t.request_id}" for t in ChatWorkload(conversations=6, turns=2, seed=5)}
        assert e.stats.verification_failures == 0
    finally:
        tier.load_now = load_now  # type: ignore[method-assign]
        e.shutdown()
    with pytest.raises(InvalidTypeError, match="tiered_options"):
        Engine(CFG, tiers=[redis_url], tiered_options={"sync_load_budget_bytes": 0})  # type: ignore[arg-type]
