"""Removal events of the Redis tier against a real ``redis-server``: every key of the tier the server
evicts (small ``maxmemory``, ``allkeys-lru``), expires or sees deleted by another client, and every
value a load rejects, is reported once by ``take_removed``, and nothing else is; with notifications
off the stats say so."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import redis

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS
from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RedisTier
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.redis.events import notifications_missing
from tests.tiers.conftest import NS, make_records, removed_until, require_redis

RB = 256 << 10
MAC_A = b"integrity-key-A-0123456789"
MAC_B = b"integrity-key-B-0123456789"


def test_every_evicted_key_yields_one_event_and_nothing_else(tmp_path: Path) -> None:
    require_redis()
    srv = RedisServer(tmp_path / "small", maxmemory="6mb", extra=("--notify-keyspace-events", "Egex")).start()
    try:
        n = 48  # 12 MiB of values into 6 MiB: the server evicts
        recs = make_records(n, RB, seed=1)
        keys = make_keys(n)
        with RedisTier(recs, NS, srv.url, io_threads=1, batch_keys=1, removal_events=True) as t:
            assert t._watcher is not None and t._watcher.wait_subscribed(10)
            # another client's keys, outside the tier's prefix: their evictions are not the tier's
            redis.Redis(port=srv.port).set(b"someone-else", b"x" * 1000)
            assert all(run_job(t, "store", 1, keys, list(range(n))))
            client = redis.Redis(port=srv.port)
            snap = client.pipeline(transaction=True)  # one atomic snapshot: no eviction inside it
            for k in keys:
                snap.exists(t.store_key(k))
            *there, info = snap.info("stats").execute()
            evicted = int(info["evicted_keys"])
            present = {k for k, x in zip(keys, there, strict=True) if x}
            assert evicted > 0 and 0 < len(present) < n
            removed = removed_until(t, n - len(present))
            assert len(removed) == len(set(removed))  # one event per key
            assert set(removed) == set(keys) - present  # exactly the evicted keys of this tier
            assert t.stats().removals == len(removed) and t.stats().removal_events_off == 0
            # another client deletes one: one event; the tier's cached hit becomes a miss
            keep = sorted(present)[0]
            assert settle(t, [keep])[0] == LOOKUP_HIT
            client.delete(t.store_key(keep))
            assert removed_until(t, 1) == [keep]
            assert t.lookup([keep])[0] == LOOKUP_MISS
            # an expiry: one event
            other = sorted(present)[1]
            client.pexpire(t.store_key(other), 1)
            assert removed_until(t, 1) == [other]
    finally:
        srv.stop()


def test_notifications_off_are_reported_never_fatal(redis_server: RedisServer, redis_url: str) -> None:
    redis_server.cli("config", "set", "notify-keyspace-events", "")
    recs = make_records(2, 4096, seed=2)
    with RedisTier(recs, NS, redis_url, removal_events=True) as t:
        assert t._watcher is not None and t._watcher.wait_subscribed(10)
        assert run_job(t, "store", 1, make_keys(1), [0]) == (True,)
        redis.Redis.from_url(redis_url).delete(t.store_key(make_keys(1)[0]))
        time.sleep(0.3)
        assert t.take_removed() == []
        st = t.stats()
        assert st.removal_events_off == 1 and st.removals == 0
        np.testing.assert_array_equal(recs[0], make_records(2, 4096, seed=2)[0])


def test_notification_flags() -> None:
    assert notifications_missing("Egex") == ""
    assert notifications_missing("KEA") == ""
    assert notifications_missing("") == "Eexg"
    assert notifications_missing("Ex") == "eg"


def test_removals_are_the_tiered_managers_events(tmp_path: Path) -> None:
    """kvoffload's own event stream: a key another client deletes comes out of the tiered manager's
    ``take_events`` once, as a removal on the tier's medium."""
    from kvoffload.cache.manager import CPUOffloadingManager
    from kvoffload.engine.tiered import TieredManager

    require_redis()
    srv = RedisServer(tmp_path / "ev", extra=("--notify-keyspace-events", "Egex")).start()
    try:
        recs = make_records(4, 4096, seed=3)
        tier = RedisTier(recs, NS, srv.url, removal_events=True)
        m = TieredManager(CPUOffloadingManager(4), [tier])
        try:
            assert tier._watcher is not None and tier._watcher.wait_subscribed(10)
            keys = make_keys(2)
            assert run_job(tier, "store", 1, keys, [0, 1]) == (True, True)
            redis.Redis(port=srv.port).delete(tier.store_key(keys[0]))
            events: list = []
            deadline = time.monotonic() + 10
            while not events and time.monotonic() < deadline:
                events = [e for e in m.take_events() if e.removed]
                time.sleep(0.02)
            assert [(e.keys, e.medium) for e in events] == [([keys[0]], tier.name)]
            assert [e for e in m.take_events() if e.removed] == []
        finally:
            m.close()
    finally:
        srv.stop()


def _corrupt(client: redis.Redis, rk: bytes) -> None:
    """Flip the last payload byte of the value at ``rk`` (another client's ``SET``: no ``del`` event)."""
    v = bytearray(client.get(rk))
    v[-1] ^= 0xFF
    client.set(rk, bytes(v))


def test_each_rejected_value_yields_one_event(tmp_path: Path) -> None:
    """A value a load rejects is one removal: a deleted one through the ``del`` notification of the
    tier's own delete, one kept (integrity: valid for other readers) by the tier; loads that succeed
    or miss yield nothing."""
    require_redis()
    srv = RedisServer(tmp_path / "rej", extra=("--notify-keyspace-events", "Egex")).start()
    try:
        recs = make_records(8, 4096, seed=5)
        keys = make_keys(5)
        other_ns = TierNamespace("other/model", "bfloat16", "bfloat16", "flash_attn", (2, 16, 4, 64), 16)
        client = redis.Redis(port=srv.port)
        with RedisTier(recs, other_ns, srv.url) as o:
            assert run_job(o, "store", 1, keys[:1], [0]) == (True,)
            foreign = client.get(o.store_key(keys[0]))
        with RedisTier(recs, NS, srv.url, integrity_key=MAC_A) as signer:
            assert run_job(signer, "store", 1, keys[3:4], [3]) == (True,)
        with RedisTier(recs, NS, srv.url, integrity_key=MAC_B, removal_events=True) as t:
            assert t._watcher is not None and t._watcher.wait_subscribed(10)
            assert run_job(t, "store", 1, keys[1:3], [1, 2]) == (True, True)
            client.set(t.store_key(keys[0]), foreign)  # another namespace's value under this key
            _corrupt(client, t.store_key(keys[1]))  # under a MAC: an integrity rejection, kept
            got = run_job(t, "load", 2, keys + [b"absent"], [4, 5, 6, 7, 4, 5])
            assert got == (False, False, True, False, False, False)
            removed = removed_until(t, 3)
            assert sorted(removed) == sorted([keys[0], keys[1], keys[3]])  # keys[2] loaded, absent missed
            st = t.stats()
            assert st.rejected_values == 3 and st.removals == 3 and st.deleted_values == 1  # keys[0]
            assert client.exists(t.store_key(keys[3]))  # kept for readers holding MAC_A
            assert run_job(t, "load", 3, keys[3:4], [7]) == (False,)
            assert removed_until(t, 1) == [keys[3]]  # one per rejection
    finally:
        srv.stop()


def test_rejected_value_is_one_event_with_notifications_off(tmp_path: Path) -> None:
    """No ``del`` notification will come: the tier reports the value it deleted itself."""
    require_redis()
    srv = RedisServer(tmp_path / "off").start()
    try:
        recs = make_records(4, 4096, seed=6)
        keys = make_keys(2)
        client = redis.Redis(port=srv.port)
        with RedisTier(recs, NS, srv.url, removal_events=True) as t:
            assert t._watcher is not None and t._watcher.wait_subscribed(10)
            assert run_job(t, "store", 1, keys, [0, 1]) == (True, True)
            _corrupt(client, t.store_key(keys[0]))
            assert t.stats().removal_events_off == 1
            assert run_job(t, "load", 2, keys, [2, 3]) == (False, True)
            assert removed_until(t, 1) == [keys[0]]
            assert t.stats().deleted_values == 1
    finally:
        srv.stop()


def test_rejections_are_no_events_unless_asked(redis_url: str) -> None:
    recs = make_records(4, 4096, seed=7)
    keys = make_keys(1, b"noev")
    client = redis.Redis.from_url(redis_url)
    with RedisTier(recs, NS, redis_url) as t:
        assert run_job(t, "store", 1, keys, [0]) == (True,)
        _corrupt(client, t.store_key(keys[0]))
        assert run_job(t, "load", 2, keys, [1]) == (False,)
        assert t.stats().rejected_values == 1
        assert t.take_removed() == [] and t.stats().removals == 0
