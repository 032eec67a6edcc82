"""Removal events of a Redis Cluster tier against a real cluster on loopback: every key of the tier
a master evicts (small ``maxmemory``, ``allkeys-lru``) or sees deleted is reported once by
``take_removed``, and nothing else is: not the deletions its replicas repeat, not a reshard's
``MIGRATE``; a replica promoted by a failover is watched from then on, and a node whose
notifications are off is reported in the stats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS
from kvoffload.testing.redis_server import RedisCluster3, RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RedisTier
from tests.tiers.conftest import (
    CLUSTER_TIMEOUT,
    NS,
    graceful_failover,
    make_records,
    removed_until,
    require_redis,
    served_slots,
    within,
)

RB = 256 << 10


def _notify(cl: RedisCluster3, setting: str = "Egex") -> None:
    for n in cl.alive():
        n.cli("config", "set", "notify-keyspace-events", setting)


def _addrs(cl: RedisCluster3) -> set[tuple[str, int]]:
    return {("127.0.0.1", p) for p in cl.masters()}


def _key_on(t: RedisTier, node: RedisServer, tag: bytes) -> bytes:
    """A key whose store key ``node`` serves."""
    served = served_slots(node)
    return next(k for k in make_keys(10000, tag) if any(key_slot(t.store_key(k)) in r for r in served))


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[RedisCluster3]:
    require_redis()
    cl = RedisCluster3(tmp_path / "cluster", maxmemory="6mb").start()
    try:
        _notify(cl)
        yield cl
    finally:
        cl.stop()


def test_every_key_a_master_evicts_yields_one_event_and_nothing_else(small_cluster: RedisCluster3) -> None:
    cl = small_cluster
    n = 96  # 24 MiB of values into 3 x 6 MiB: every master evicts
    recs = make_records(n, RB, seed=11)
    keys = make_keys(n, b"ev")
    with RedisTier(recs, NS, cl.url, io_threads=1, batch_keys=1, removal_events=True) as t:
        assert t._watcher is not None and t._watcher.wait_subscribed(CLUSTER_TIMEOUT)
        assert t._watcher.watching() == _addrs(cl)
        assert all(run_job(t, "store", 1, keys, list(range(n))))
        present: set[bytes] = set()
        evicted = []
        pattern = t.store_key(b"") + b"*"
        for node in cl.alive():  # per node one atomic snapshot: its keys and its eviction count
            snap = redis.Redis(port=node.port).pipeline(transaction=True)
            held, info = snap.keys(pattern).info("stats").execute()
            present |= {k[len(t.store_key(b"")) :] for k in held}
            evicted.append(int(info["evicted_keys"]))
        assert all(e > 0 for e in evicted) and 0 < len(present) < n
        removed = removed_until(t, n - len(present))
        assert len(removed) == len(set(removed)) == sum(evicted)  # one event per eviction
        assert set(removed) == set(keys) - present  # exactly the evicted keys
        assert t.stats().removals == len(removed) and t.stats().removal_events_off == 0
        # another client deletes one: one event, and the tier's cached hit becomes a miss
        keep = sorted(present)[0]
        assert settle(t, [keep])[0] == LOOKUP_HIT
        redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port).delete(t.store_key(keep))
        assert removed_until(t, 1) == [keep]
        assert t.lookup([keep])[0] == LOOKUP_MISS


def test_failover_reshard_and_replicas_follow_the_slot_map(cluster6: RedisCluster3) -> None:
    cl = cluster6
    _notify(cl)
    recs = make_records(8, 4096, seed=12)
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    with RedisTier(recs, NS, cl.url, removal_events=True) as t:
        w = t._watcher
        assert w is not None and w.wait_subscribed(CLUSTER_TIMEOUT)
        assert w.watching() == _addrs(cl)  # the masters, not their replicas
        (port, node_id), (dst_port, dst_id) = list(cl.masters().items())[:2]
        old, new = cl.node(port), cl.replica_of(node_id)
        keys = [_key_on(t, old, tag) for tag in (b"a", b"b", b"c")]
        assert run_job(t, "store", 1, keys, [0, 1, 2]) == (True, True, True)
        on_replica = redis.Redis(port=new.port)
        on_replica.execute_command("READONLY")
        assert within(lambda: on_replica.exists(t.store_key(keys[0])) == 1)  # replicated
        client.delete(t.store_key(keys[0]))  # the replica repeats the deletion: still one event
        assert removed_until(t, 1) == [keys[0]]
        # a graceful failover: the promoted replica is watched, the old master is not
        graceful_failover(cl, new.port, old.port)
        assert within(lambda: w.watching() == _addrs(cl))
        assert ("127.0.0.1", old.port) not in w.watching()
        client = redis.RedisCluster(host="127.0.0.1", port=new.port)
        assert client.delete(t.store_key(keys[1])) == 1
        assert removed_until(t, 1) == [keys[1]]
        # a slot moved to another master: MIGRATE deletes the key from its old node; not a removal
        dst = cl.node(dst_port)
        slot = key_slot(t.store_key(keys[2]))
        dst.cli("cluster", "setslot", str(slot), "importing", cl.masters()[new.port])
        new.cli("cluster", "setslot", str(slot), "migrating", dst_id)
        redis.Redis(port=new.port).execute_command("MIGRATE", "127.0.0.1", dst_port, t.store_key(keys[2]), 0, 5000)
        for node in (dst, new):
            node.cli("cluster", "setslot", str(slot), "node", dst_id)
        assert removed_until(t, 0, quiet=1.0) == []
        assert t.contains(keys[2:]) == [True]
        assert t.stats().removal_events_off == 0
    # a node with notifications off: the stats say so, nothing fails
    cl.node(dst_port).cli("config", "set", "notify-keyspace-events", "")
    with RedisTier(recs, NS, cl.url, removal_events=True) as t2:
        assert t2._watcher is not None and t2._watcher.wait_subscribed(CLUSTER_TIMEOUT)
        assert t2.stats().removal_events_off == 1
        assert run_job(t2, "load", 2, keys[2:], [3]) == (True,)
