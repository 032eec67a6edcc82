"""``KVOffloadTier``: any registered kvoffload tier as a vLLM secondary tier, built by vLLM's own
``SecondaryTierFactory`` inside ``TieringOffloadingSpec(...).get_manager()`` -- Redis and disk by URL,
an out-of-tree toy tier by module path and by entry point; the older names as aliases."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import Locality  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

from kvoffload.integrations.vllm import KVOffloadDiskTier, KVOffloadRedisTier, KVOffloadTier  # noqa: E402
from kvoffload.testing.redis_server import RedisServer  # noqa: E402
from kvoffload.tiers import DiskTier, RedisTier  # noqa: E402
from tests.integrations import tier_roles as roles  # noqa: E402
from tests.integrations.tier_support import TIER_MODULE  # noqa: E402
from tests.tiers.toy_tier import ToyTier, install_entry_point  # noqa: E402


def generic(**kw: Any) -> dict[str, Any]:
    return {"type": "KVOffloadTier", "module_path": TIER_MODULE, "backoff_initial": 0.05, **kw}


def share(tier: dict[str, Any], seed: int) -> tuple[Any, Any]:
    """Engine A stores four keys through vLLM's cascade; engine B promotes them back (and misses a fifth)."""
    a, b = roles.tiering_manager(tier), roles.tiering_manager(tier)
    try:
        roles.store(a, roles.keys(4, seed=seed))
        found = roles.load(b, roles.keys(5, seed=seed))
        assert found["hit"] == [True] * 4 + [False] and found["equal"] == [True] * 4
        return a.secondary_tiers[0], b.secondary_tiers[0]
    finally:
        a.shutdown()
        b.shutdown()


def test_redis_and_disk_by_url(own_redis: RedisServer, tmp_path: Path) -> None:
    ta, _ = share(generic(url=own_redis.url), seed=1)
    assert type(ta) is KVOffloadTier and type(ta.tier) is RedisTier and ta.locality == Locality.REMOTE
    ta, _ = share(generic(url=f"disk:{tmp_path / 'kv'}?o_direct=0", max_bytes=1 << 30), seed=2)
    assert type(ta.tier) is DiskTier and ta.tier.max_bytes == 1 << 30 and ta.locality == Locality.LOCAL


def test_out_of_tree_tier_by_module_path_and_by_entry_point(tmp_path: Path) -> None:
    by_path = generic(url="toy://vllm-mp", tier_class="ToyTier", tier_module_path="tests.tiers.toy_tier")
    ta, tb = share(by_path, seed=3)
    assert type(ta.tier) is ToyTier and ta.tier.store is tb.tier.store
    install_entry_point(tmp_path / "site")
    ta, _ = share(generic(url="toy://vllm-ep", locality="LOCAL"), seed=4)
    assert type(ta.tier) is ToyTier and ta.locality == Locality.LOCAL


def test_aliases_keep_older_configurations(own_redis: RedisServer, tmp_path: Path) -> None:
    assert issubclass(KVOffloadRedisTier, KVOffloadTier) and issubclass(KVOffloadDiskTier, KVOffloadTier)
    for name in ("KVOffloadTier", "KVOffloadRedisTier", "KVOffloadDiskTier"):
        cls = SecondaryTierFactory.get_tier_class({"type": name, "module_path": TIER_MODULE})
        assert issubclass(cls, KVOffloadTier)
    ta, _ = share({"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(tmp_path)}, seed=5)
    assert type(ta) is KVOffloadDiskTier and type(ta.tier) is DiskTier
    with pytest.raises(TypeError, match="'url' .redis://"):  # the Redis alias takes Redis URLs only
        roles.tiering_manager({"type": "KVOffloadRedisTier", "module_path": TIER_MODULE, "url": f"disk:{tmp_path}"})


@pytest.mark.parametrize(
    "tier, err, match",
    [
        (generic(), TypeError, "'url' .* or 'tier_class' and 'tier_module_path' is required"),
        (generic(url="s3://bucket"), ValueError, "unknown scheme 's3'"),
        (generic(url="redis://127.0.0.1:1", colour="blue"), ValueError, r"unknown option\(s\) \['colour'\]"),
        (generic(url="disk:/tmp/x", cluster=True), ValueError, r"unknown option\(s\) \['cluster'\] for DiskTier"),
        (generic(url="toy://x", tier_class="ToyTier"), ValueError, "go together"),
        (generic(url="redis://127.0.0.1:1", locality="moon"), ValueError, "locality"),
    ],
)
def test_bad_configurations_are_typed_errors_naming_the_tier(tier: dict[str, Any], err: type, match: str) -> None:
    with pytest.raises(err, match=match) as info:
        roles.tiering_manager(tier)
    assert "secondary tier 'KVOffloadTier'" in str(info.value)


def test_blocks_the_store_removes_are_kv_events(own_redis: RedisServer) -> None:
    """With ``enable_kv_events``, a key another client deletes from Redis comes out of vLLM's
    ``take_events`` as a removal (``removed=True``) of that key, once."""
    import dataclasses
    import time

    import redis
    from vllm.v1.kv_offload.base import Medium
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    own_redis.cli("config", "set", "notify-keyspace-events", "Egex")
    extra = {"cpu_bytes_to_use": 16 * roles.ROW, "secondary_tiers": [generic(url=own_redis.url, enable_kv_events=True)]}
    config = dataclasses.replace(roles.offloading_config(extra), enable_kv_cache_events=True)
    mgr = TieringOffloadingSpec(config).get_manager()
    try:
        tier = mgr.secondary_tiers[0]
        assert tier.tier._watcher.wait_subscribed(10)
        ks = roles.keys(3, seed=11)
        roles.store(mgr, ks)
        list(mgr.take_events())  # the stores' events
        redis.Redis(port=own_redis.port).delete(tier.tier.store_key(ks[1]))
        removed: list[Any] = []
        deadline = time.monotonic() + 10
        while not removed and time.monotonic() < deadline:
            removed = [ev for ev in mgr.take_events() if ev.medium is Medium.STORAGE and ev.removed]
            time.sleep(0.05)
        assert [list(ev.keys) for ev in removed] == [[ks[1]]]
        assert tier.tier.stats().removal_events_off == 0
    finally:
        mgr.shutdown()


def test_disk_budget_evictions_are_kv_events(tmp_path: Path) -> None:
    """With ``enable_kv_events``, a file the disk tier's ``max_bytes`` budget evicts comes out of
    vLLM's ``take_events`` as a removal of its key, once."""
    import dataclasses
    import time

    from vllm.v1.kv_offload.base import Medium
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    url = f"disk:{tmp_path / 'kv'}?o_direct=0&max_bytes={2 * roles.ROW + 1024}"  # two values fit
    extra = {"cpu_bytes_to_use": 16 * roles.ROW, "secondary_tiers": [generic(url=url, enable_kv_events=True)]}
    config = dataclasses.replace(roles.offloading_config(extra), enable_kv_cache_events=True)
    mgr = TieringOffloadingSpec(config).get_manager()
    try:
        tier = mgr.secondary_tiers[0]
        assert tier.tier.removal_events
        ks = roles.keys(3, seed=12)
        removed: list[Any] = []
        for k in ks:
            roles.store(mgr, [k])
            removed += [ev for ev in mgr.take_events() if ev.medium is Medium.STORAGE and ev.removed]
        deadline = time.monotonic() + 10
        while not removed and time.monotonic() < deadline:
            removed = [ev for ev in mgr.take_events() if ev.medium is Medium.STORAGE and ev.removed]
            time.sleep(0.05)
        assert [list(ev.keys) for ev in removed] == [[ks[0]]]
        assert tier.tier.stats().evictions == 1
    finally:
        mgr.shutdown()
