"""The counters an operator watches, one case each: every test makes exactly one kind of event
happen and checks that its counter moved and no other did (RESP2 and RESP3 where the protocol
matters: an absent value is ``$-1`` in one, ``_`` in the other)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.crc import key_slot

from kvoffload.core.lookup_code import LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.testing.redis_server import RedisCluster3, RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RecordCodec, RedisTier, TierNamespace, TierStats
from tests.tiers.conftest import NS, make_records, require_redis
from tests.tiers.proxy import TurnCountingProxy

RB = 8192
COUNTERS = (
    "absent",
    "rejected_values",
    "rejected_namespace",
    "rejected_integrity",
    "corrupt",
    "deleted_values",
    "redirected",
    "timed_out",
    "dropped_writes",
    "errors",
)
KEY = b"k" * 32


def assert_only(st: TierStats, **want: int) -> None:
    """Each counter of :data:`COUNTERS` is ``want[name]`` (0 when not named)."""
    got = {f: getattr(st, f) for f in COUNTERS}
    assert got == {f: want.get(f, 0) for f in COUNTERS}


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def _stored_then(redis_url: str, protocol: int, tamper: bytes | None, integrity_key: bytes | None = None) -> TierStats:
    """Store KEY, replace its value with ``tamper`` (``None``: delete it), load it; the reader's stats."""
    recs = make_records(2, RB, seed=31)
    with RedisTier(recs, NS, redis_url, protocol=protocol, integrity_key=integrity_key) as t:
        assert run_job(t, "store", 1, [KEY], [0]) == (True,)
        r = redis.Redis.from_url(redis_url)
        if tamper is None:
            r.delete(t.store_key(KEY))
        else:
            r.set(t.store_key(KEY), tamper)
        before = recs.copy()
        assert run_job(t, "load", 2, [KEY], [1]) == (False,)
        # a load lands in its slot and is checked there: a rejected value leaves the failed slot's
        # bytes unspecified (contract §8), an absent one writes nothing; no other slot changes
        if tamper is None:
            np.testing.assert_array_equal(recs[1], before[1])
        np.testing.assert_array_equal(recs[0], before[0])
        return t.stats()


def test_resp_version_in_use(redis_url: str, redis_server: RedisServer, protocol: int) -> None:
    recs = make_records(2, RB, seed=30)
    with RedisTier(recs, NS, redis_url, protocol=protocol, name="resp-probe") as t:
        assert run_job(t, "store", 1, [KEY], [0]) == (True,)
        assert run_job(t, "load", 2, [KEY], [1]) == (True,)
        assert settle(t, make_keys(2, b"none")).tolist() == [LOOKUP_MISS, LOOKUP_MISS]
        ours = [c for c in redis_server.cli("client", "list").splitlines() if "cmd=client" not in c]  # not redis-cli
        assert ours and all(f" resp={protocol}" in c + " " for c in ours)
        assert_only(t.stats())
    np.testing.assert_array_equal(recs[1], recs[0])


def test_absent_counts_absent_and_deletes_nothing(redis_url: str, protocol: int) -> None:
    assert_only(_stored_then(redis_url, protocol, None), absent=1)


def test_other_namespace_counts_rejected_namespace(redis_url: str, protocol: int) -> None:
    other = TierNamespace("other/model", "bfloat16", "bfloat16", "flash_attn", (2, 16, 4, 64), 16)
    value = RecordCodec(other.fingerprint(), RB).encode(KEY, make_records(1, RB, seed=32)[0])
    st = _stored_then(redis_url, protocol, value)
    assert_only(st, rejected_values=1, rejected_namespace=1, deleted_values=1)


def test_random_bytes_count_corrupt(redis_url: str, protocol: int) -> None:
    value = make_records(1, RecordCodec(NS.fingerprint(), RB).value_bytes(KEY), seed=33)[0].tobytes()
    st = _stored_then(redis_url, protocol, value)
    assert_only(st, rejected_values=1, corrupt=1, deleted_values=1)


def test_wrong_mac_counts_rejected_integrity_and_is_kept(redis_url: str, protocol: int) -> None:
    value = RecordCodec(NS.fingerprint(), RB, b"w" * 32).encode(KEY, make_records(1, RB, seed=34)[0])
    st = _stored_then(redis_url, protocol, value, integrity_key=b"s" * 32)
    assert_only(st, rejected_values=1, rejected_integrity=1)
    assert redis.Redis.from_url(redis_url).get(f"kvo:{NS.fingerprint().hex()}:".encode() + KEY) == value


def test_timeout_counts_timed_out(redis_url: str, redis_server: RedisServer) -> None:
    proxy = TurnCountingProxy(redis_server.port)
    try:
        recs = make_records(4, RB, seed=35)
        keys = make_keys(2)
        with RedisTier(recs, NS, proxy.url, socket_timeout=1.0, backoff_initial=0.05, backoff_max=0.1) as t:
            assert run_job(t, "store", 1, keys, [0, 1]) == (True, True)
            proxy.stall()
            assert run_job(t, "load", 2, keys, [2, 3]) == (False, False)
            proxy.resume()
            assert_only(t.stats(), timed_out=2)
            assert t.stats().read_failures == 2
    finally:
        proxy.close()


def test_unreachable_store_counts_dropped_writes(own_redis: RedisServer) -> None:
    recs = make_records(4, RB, seed=36)
    with RedisTier(recs, NS, own_redis.url, backoff_initial=30.0, backoff_max=30.0) as t:
        own_redis.stop()
        assert settle(t, make_keys(1, b"probe"))[0] == LOOKUP_MISS  # refused: the tier backs off
        t.submit_store(1, make_keys(3), [0, 1, 2])
        (res,) = t.get_finished()
        assert res.ok == (False,) * 3
        assert_only(t.stats(), dropped_writes=3)


def _cluster_slot_owner(cl: RedisCluster3, slot: int) -> tuple[RedisServer, str]:
    for n in cl.nodes:
        line = next(x for x in n.cli("cluster", "nodes").splitlines() if "myself" in x).split()
        for r in line[8:]:
            lo, _, hi = r.partition("-")
            if "[" not in r and int(lo) <= slot <= int(hi or lo):
                return n, line[0]
    raise AssertionError(f"no node serves slot {slot}")


def _move_slot(cl: RedisCluster3, slot: int, src: RedisServer, dst: RedisServer, dst_id: str, key: str) -> None:
    src_id = next(x for x in src.cli("cluster", "nodes").splitlines() if "myself" in x).split()[0]
    dst.cli("cluster", "setslot", str(slot), "importing", src_id)
    src.cli("cluster", "setslot", str(slot), "migrating", dst_id)
    src.cli("migrate", "127.0.0.1", str(dst.port), key, "0", "5000")
    for n in cl.nodes:
        n.cli("cluster", "setslot", str(slot), "node", dst_id)


def test_moved_counts_redirected_and_the_load_lands(redis_cluster: RedisCluster3) -> None:
    recs = make_records(2, RB, seed=37)
    with RedisTier(recs, NS, redis_cluster.url) as t:
        sk = t.store_key(KEY)
        slot = key_slot(sk)
        src, _ = _cluster_slot_owner(redis_cluster, slot)
        dst = next(n for n in redis_cluster.nodes if n is not src)
        dst_id = next(x for x in dst.cli("cluster", "nodes").splitlines() if "myself" in x).split()[0]
        src_id = next(x for x in src.cli("cluster", "nodes").splitlines() if "myself" in x).split()[0]
        src.cli("del", sk.decode())
        assert run_job(t, "store", 1, [KEY], [0]) == (True,)
        _move_slot(redis_cluster, slot, src, dst, dst_id, sk.decode())  # the tier's slot map is now stale
        try:
            assert run_job(t, "load", 2, [KEY], [1]) == (True,)
            np.testing.assert_array_equal(recs[1], recs[0])
            assert_only(t.stats(), redirected=1)
        finally:
            _move_slot(redis_cluster, slot, dst, src, src_id, sk.decode())
            src.cli("del", sk.decode())


@pytest.fixture
def cluster_partial(tmp_path: Path) -> Iterator[RedisCluster3]:
    """3 masters that keep serving their slots while another is down."""
    require_redis()
    cl = RedisCluster3(tmp_path / "partial").start()
    for n in cl.nodes:
        n.cli("config", "set", "cluster-require-full-coverage", "no")
    yield cl
    cl.stop()


def test_dead_master_drops_its_keys_only_other_shards_serve(cluster_partial: RedisCluster3) -> None:
    n = 30
    recs = make_records(2 * n, RB, seed=38)
    keys, fresh = make_keys(n, b"a"), make_keys(n, b"b")
    with RedisTier(recs, NS, cluster_partial.url, backoff_initial=30.0, backoff_max=30.0) as t:
        assert run_job(t, "store", 1, keys, list(range(n))) == (True,) * n
        dead = cluster_partial.nodes[0]
        dead_id = next(x for x in dead.cli("cluster", "nodes").splitlines() if "myself" in x).split()[0]
        owner = {k: _cluster_slot_owner(cluster_partial, key_slot(t.store_key(k)))[1] for k in keys + fresh}
        dead.kill()
        on_dead = [owner[k] == dead_id for k in keys]
        assert 0 < sum(on_dead) < n
        # lookups: the dead node's keys miss (its node fails, then backs off), the others hit
        assert t.contains(keys) == [not d for d in on_dead]
        assert (t.lookup(make_keys(2, b"new")) == LOOKUP_RETRY).all()  # the tier itself is not in back-off
        # stores: the dead node's writes drop (its back-off), the other shards store
        ok = run_job(t, "store", 2, fresh, list(range(n, 2 * n)))
        dropped = [owner[k] == dead_id for k in fresh]
        assert ok == tuple(not d for d in dropped)
        # loads of the live shards' keys land
        live = [k for k, d in zip(keys, on_dead, strict=True) if not d]
        assert run_job(t, "load", 3, live, list(range(n, n + len(live)))) == (True,) * len(live)
        st = t.stats()
        assert st.dropped_writes == sum(dropped) and st.blocks_written == n + n - sum(dropped)
        assert st.deleted_values == st.rejected_values == st.absent == st.redirected == 0


def test_the_check_at_start_pings_every_configured_cluster_node(redis_cluster: RedisCluster3) -> None:
    """Every node of the cluster URL answers the start-up check; a node that does not (a port with
    no server, listed beside them) makes the store "does not answer", not a configuration error."""
    from kvoffload.tiers.health import TierUnavailable

    recs = make_records(4, 64, seed=5)
    with RedisTier(recs, NS, redis_cluster.url) as t:
        t.check_store()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    with RedisTier(recs, NS, f"{redis_cluster.url},127.0.0.1:{port}") as t:
        with pytest.raises(TierUnavailable, match=f"node 127.0.0.1:{port}"):
            t.check_store()
