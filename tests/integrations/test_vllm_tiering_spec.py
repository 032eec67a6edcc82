"""``KVOffloadRedisTier`` / ``KVOffloadDiskTier`` inside vLLM's own ``TieringOffloadingSpec(...).get_manager()``.

vLLM's manager, promotion and cascade logic run unchanged; the test plays the worker's part (see
``tier_roles``) and a real ``redis-server`` holds the values.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import redis  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvoffload.errors import InvalidArgumentError  # noqa: E402
from kvoffload.integrations.vllm import KVOffloadRedisTier  # noqa: E402
from kvoffload.testing.redis_server import RedisServer  # noqa: E402
from tests.integrations import tier_roles as roles  # noqa: E402
from tests.integrations.tier_support import TIER_MODULE, redis_tier, run_role  # noqa: E402


def promote_in_subprocess(tier: dict[str, Any], n: int) -> dict[str, Any]:
    return run_role("tests.integrations.tier_roles", "promote", json.dumps(tier), str(n), timeout=240)[-1]  # type: ignore[no-any-return]


def redis_values(srv: RedisServer) -> list[bytes]:
    return list(redis.Redis(port=srv.port).scan_iter(match=b"kvo:*"))


def test_cascade_reaches_redis_and_a_second_process_promotes_it_back(own_redis: RedisServer) -> None:
    tier = redis_tier(own_redis.url)
    mgr = roles.tiering_manager(tier)
    try:
        assert isinstance(mgr.secondary_tiers[0], KVOffloadRedisTier)
        ks = roles.keys(6)
        roles.store(mgr, ks)
        assert len(redis_values(own_redis)) == 6  # every cascade reached Redis
        stats = mgr.secondary_tiers[0].tier.stats()
        assert stats.blocks_written == 6 and stats.write_failures == stats.dropped_writes == 0
    finally:
        mgr.shutdown()
    # a second engine (its own process, its own empty CPU pool) promotes them back
    found = promote_in_subprocess(tier, 8)
    assert found["hit"] == [True] * 6 + [False] * 2  # two keys nobody stored: misses
    assert found["equal"] == [True] * 6 and found["stats"] == 6


def test_other_model_never_meets_the_values(own_redis: RedisServer) -> None:
    tier = redis_tier(own_redis.url)
    a = roles.tiering_manager(tier)
    b = roles.tiering_manager(tier, model="test/other-model")
    try:
        roles.store(a, roles.keys(3))
        assert b.secondary_tiers[0].namespace != a.secondary_tiers[0].namespace
        assert roles.load(b, roles.keys(3))["hit"] == [False] * 3
    finally:
        a.shutdown()
        b.shutdown()


def test_partial_promotion_keeps_the_loaded_keys_and_misses_the_rest(own_redis: RedisServer) -> None:
    tier = redis_tier(own_redis.url)
    a, b = roles.tiering_manager(tier), roles.tiering_manager(tier)
    try:
        ks = roles.keys(4, seed=1)
        roles.store(a, ks)
        ctx = ReqContext("r")
        b.on_new_request(ctx)
        assert [b.lookup(k, ctx) for k in ks] == [LookupResult.RETRY] * 4
        roles.step(b)  # one probe batch
        deadline = time.monotonic() + 10
        while (res := [b.lookup(k, ctx) for k in ks]) != [LookupResult.HIT_PENDING] * 4:
            assert time.monotonic() < deadline, res
            time.sleep(0.01)
        # between the lookup (slots reserved) and the flush, one value disappears from Redis
        redis.Redis(port=own_redis.port).delete(b.secondary_tiers[0].tier.store_key(ks[2]))
        tier = b.secondary_tiers[0]
        seen: list[Any] = []
        poll = tier.get_finished_jobs

        def recording_poll() -> list[Any]:
            done = list(poll())
            seen.extend(done)
            return done

        tier.get_finished_jobs = recording_poll  # type: ignore[method-assign]
        roles.settle(b)  # submit_load of all four; vLLM's manager polls the result
        tier.get_finished_jobs = poll  # type: ignore[method-assign]
        assert len(seen) == 1 and not seen[0].success
        assert set(seen[0].successful_keys) == {ks[0], ks[1], ks[3]}
        assert [b.lookup(k, ctx) for k in ks] == [
            LookupResult.HIT,
            LookupResult.HIT,
            LookupResult.MISS,
            LookupResult.HIT,
        ]
        spec = b.prepare_load([ks[0], ks[1], ks[3]], ctx)
        rows = roles.rows(b)
        for k, c in zip([ks[0], ks[1], ks[3]], spec.chunk_ids, strict=True):
            assert (rows[int(c)] == roles.payload(k)).all()
        del rows
        b.complete_load([ks[0], ks[1], ks[3]], ctx)
        b.on_request_finished(ctx)
    finally:
        a.shutdown()
        b.shutdown()


def test_corrupted_value_is_a_failed_promotion_then_a_miss(own_redis: RedisServer) -> None:
    tier = redis_tier(own_redis.url)
    a, b = roles.tiering_manager(tier), roles.tiering_manager(tier)
    try:
        ks = roles.keys(3, seed=2)
        roles.store(a, ks)
        r = redis.Redis(port=own_redis.port)
        bad = a.secondary_tiers[0].tier.store_key(ks[1])
        r.setrange(bad, r.strlen(bad) - 10, b"\xff" * 4)  # flip payload bytes; header intact
        found = roles.load(b, ks)
        assert found["hit"] == [True, False, True] and found["equal"] == [True, True]
        stats = b.secondary_tiers[0].tier.stats()
        assert stats.rejected_values == 1 and stats.blocks_read == 2
        assert not r.exists(bad)  # the rejected value was deleted
        values = b.get_stats().data["data"]  # vLLM's stats payload: name -> {labels: value}
        assert sum(values["vllm:kv_offload_kvoffload_tier_rejected_values"].values()) == 1
        assert values["vllm:kv_offload_tiering_read_bytes"] == {("1:KVOffloadRedisTier",): 2 * roles.ROW}
        again = b.get_stats()  # counters are reported once
        assert again is None or "vllm:kv_offload_kvoffload_tier_rejected_values" not in again.data["data"]
    finally:
        a.shutdown()
        b.shutdown()


def test_integrity_key_rotation_through_the_vllm_config(own_redis: RedisServer) -> None:
    old, new = "old-secret-0123456789", "new-secret-0123456789"
    before = roles.tiering_manager(redis_tier(own_redis.url, integrity_key=old))
    rotated = roles.tiering_manager(redis_tier(own_redis.url, integrity_key=[new, old]))
    after = roles.tiering_manager(redis_tier(own_redis.url, integrity_key=new))
    try:
        old_keys, new_keys = roles.keys(2, seed=20), roles.keys(2, seed=21)
        roles.store(before, old_keys)
        roles.store(rotated, new_keys)  # signed with the new key
        assert roles.load(rotated, old_keys)["equal"] == [True, True]  # the old key still accepted
        assert roles.load(after, new_keys)["equal"] == [True, True]
        assert roles.load(after, old_keys)["hit"] == [False, False]  # the retired key refused...
        st = after.secondary_tiers[0].tier.stats()
        assert (st.rejected_integrity, st.deleted_values) == (2, 0)
        assert len(redis_values(own_redis)) == 4  # ...and left to age out, not deleted
    finally:
        for m in (before, rotated, after):
            m.shutdown()


def test_redis_killed_mid_run_then_back(own_redis: RedisServer) -> None:
    tier = redis_tier(own_redis.url, socket_timeout=1.0, connect_timeout=1.0)
    mgr = roles.tiering_manager(tier)
    try:
        roles.store(mgr, roles.keys(3, seed=3))
        own_redis.kill()
        # stores keep working in the CPU tier; their cascades fail and are counted, nothing blocks
        roles.store(mgr, roles.keys(3, seed=4))
        st = mgr.secondary_tiers[0].tier.stats()
        assert st.blocks_written == 3 and (st.write_failures + st.dropped_writes) == 3
        # primary hits still load; keys only Redis could have had are misses
        assert roles.load(mgr, roles.keys(3, seed=4))["equal"] == [True] * 3
        assert roles.load(mgr, roles.keys(2, seed=5))["hit"] == [False, False]
        own_redis.start()  # empty again (no persistence)
        time.sleep(0.3)  # past the back-off
        roles.store(mgr, roles.keys(2, seed=6))
        assert len(redis_values(own_redis)) == 2
    finally:
        mgr.shutdown()


def test_bad_tier_options_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        roles.tiering_manager(redis_tier("redis://127.0.0.1:1", colour="blue"))
    with pytest.raises(TypeError, match="'url'"):
        roles.tiering_manager({"type": "KVOffloadRedisTier", "module_path": TIER_MODULE})
    with pytest.raises(TypeError, match="'root_dir'"):
        roles.tiering_manager({"type": "KVOffloadDiskTier", "module_path": TIER_MODULE})
    with pytest.raises(ValueError, match="locality"):
        roles.tiering_manager(redis_tier("redis://127.0.0.1:1", locality="moon"))


def test_disk_tier_shared_directory(tmp_path: Path) -> None:
    tier = {"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(tmp_path / "kv")}
    a, b = roles.tiering_manager(tier), roles.tiering_manager(tier)
    try:
        roles.store(a, roles.keys(4, seed=7))
        found = roles.load(b, roles.keys(5, seed=7))
        assert found["hit"] == [True] * 4 + [False] and found["equal"] == [True] * 4
    finally:
        a.shutdown()
        b.shutdown()


def test_metric_definitions_cover_the_stats() -> None:
    extra = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [redis_tier("redis://127.0.0.1:1")]}
    defs = TieringOffloadingSpec.build_metric_definitions(extra)
    for name in ("vllm:kv_offload_kvoffload_tier_rejected_values", "vllm:kv_offload_kvoffload_tier_errors"):
        assert defs[name].labelnames == ("tier",)


def test_stored_blocks_are_announced_as_kv_events(tmp_path: Path) -> None:
    from vllm.v1.kv_offload.base import Medium

    tier = {"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(tmp_path / "kv")}
    extra = {"cpu_bytes_to_use": 16 * roles.ROW, "secondary_tiers": [{**tier, "enable_kv_events": True}]}
    config = dataclasses.replace(roles.offloading_config(extra), enable_kv_cache_events=True)
    mgr = TieringOffloadingSpec(config).get_manager()
    try:
        ks = roles.keys(3, seed=8)
        roles.store(mgr, ks)
        events = [ev for ev in mgr.take_events() if ev.medium is Medium.STORAGE]
        assert [sorted(ev.keys) for ev in events] == [sorted(ks)] and not events[0].removed
        assert list(mgr.secondary_tiers[0].take_events()) == []  # taken once
    finally:
        mgr.shutdown()


def test_reset_cache_drains_the_tier_jobs(tmp_path: Path) -> None:
    tier = {"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(tmp_path / "kv")}
    mgr = roles.tiering_manager(tier)
    try:
        ks = roles.keys(5, seed=9)
        ctx = ReqContext("w")
        mgr.on_new_request(ctx)
        out = mgr.prepare_store(ks, ctx)
        rows = roles.rows(mgr)
        for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
            rows[int(c)] = roles.payload(k)
        del rows
        mgr.complete_store(out.keys_to_store, ctx)  # cascades submitted, not waited for
        mgr.on_request_finished(ctx)
        mgr.reset_cache()  # vLLM drains every tier before it frees the primary slots
        assert not mgr.has_pending_work()
        assert mgr.secondary_tiers[0].tier.contains(ks) == [True] * 5
    finally:
        mgr.shutdown()


def test_tier_metrics_exist_from_the_first_report_and_serving_says_whether_the_store_answers(
    own_redis: RedisServer,
) -> None:
    """Every kvoffload tier counter is in the first stats report, at zero before any traffic, so a
    dashboard tells "no traffic" from "not configured"; the serving gauge is 1 on a store that
    answers and 0 on one the tier could not reach (and backs off)."""
    from kvoffload.integrations.vllm.tiers import TIER_METRICS, TIER_SERVING

    up = roles.tiering_manager(redis_tier(own_redis.url))
    down = roles.tiering_manager(redis_tier("redis://127.0.0.1:1"))
    try:
        first = up.secondary_tiers[0].get_stats().data["data"]
        for name in TIER_METRICS:
            assert list(first[name].values()) == [0], name
        assert list(first[TIER_SERVING].values()) == [1]
        assert set(up.secondary_tiers[0].get_stats().data["data"]) == {TIER_SERVING}  # counters once, then on change
        roles.store(down, roles.keys(2, seed=11))
        down.secondary_tiers[0].tier.drain()
        assert list(down.secondary_tiers[0].get_stats().data["data"][TIER_SERVING].values()) == [0]
    finally:
        up.shutdown()
        down.shutdown()


@pytest.mark.parametrize(
    "url, says",
    [
        ("redis://127.0.0.1:{port}/99", r"database.*DB index is out of range"),
        ("redis://no-such-host.invalid:6379/0", r"does not resolve"),
        ("rediss://127.0.0.1:{port}/0?connect_timeout=1", r"speaks plain TCP: use a redis:// URL"),
        ("redis://nobody:wrong-pw@127.0.0.1:{port}/0", r"credentials refused"),
    ],
)
def test_a_misconfigured_tier_stops_the_start_naming_it(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture, url: str, says: str
) -> None:
    """A configuration error will not heal by retrying: an error when vLLM builds the tier, naming
    the tier (without secrets) and the server's reply, and nothing left behind (no cleanup
    traceback of the shared region)."""
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidArgumentError, match=says) as info:
        roles.tiering_manager(redis_tier(url.format(port=own_redis.port)))
    assert "wrong-pw" not in str(info.value) and "secondary tier" in str(info.value)
    assert not [r for r in caplog.records if "mmap" in r.getMessage() or r.exc_info]


def test_a_store_that_does_not_answer_at_start(caplog: pytest.LogCaptureFixture) -> None:
    """By default the tier starts degraded (one warning) and serves once the store answers;
    on_unavailable="fail" refuses to start; any other value is an error."""
    down = redis_tier("redis://127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING):
        m = roles.tiering_manager(down)
    try:
        said = [r.getMessage() for r in caplog.records if "does not answer at start" in r.getMessage()]
        assert len(said) == 1 and "starting degraded" in said[0]
    finally:
        m.shutdown()
    with pytest.raises(InvalidArgumentError, match="does not answer at start; on_unavailable is 'fail'"):
        roles.tiering_manager({**down, "on_unavailable": "fail"})
    with pytest.raises(InvalidArgumentError, match="on_unavailable must be one of"):
        roles.tiering_manager({**down, "on_unavailable": "sometimes"})
    assert not [r for r in caplog.records if "mmap" in r.getMessage()]
