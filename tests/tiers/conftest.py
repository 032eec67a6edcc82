"""Fixtures of the tier tests: real ``redis-server`` processes, records, namespaces.

Without ``redis-server`` the Redis tests are skipped with the reason; ``KVOFFLOAD_REQUIRE_REDIS=1``
(set by ``.ci/run``) turns that skip into a failure, so CI never skips them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kvoffload.testing.redis_server import RedisCluster3, RedisServer
from kvoffload.tiers import Tier, TierNamespace
from tests.redis_support import require_redis as _require_redis
from tests.redis_support import server_of_its_own

NS = TierNamespace("test/model@1", "float16", "float16", "flash_attn", (2, 16, 4, 64), 16)
#: TieredManager options under which nothing is answered within a lookup: probes go with the step's
#: batch and promotions are asynchronous (the paths the tests of deferral exercise).
ASYNC = {"probe_in_lookup": False, "sync_load_budget_bytes": 0}


def require_redis() -> None:
    """Skip (or, with KVOFFLOAD_REQUIRE_REDIS=1, fail) when the Redis binaries are missing."""
    _require_redis("Redis tier tests")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One server shared by a module's tests (flushed before each test by ``redis_url``)."""
    yield from server_of_its_own(tmp_path_factory.mktemp("redis"), require_redis)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared server's URL, emptied first."""
    redis_server.cli("flushall")
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test alone (tests that kill or restart it)."""
    yield from server_of_its_own(tmp_path / "redis", require_redis)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster3]:
    """A 3-master Redis Cluster on loopback."""
    require_redis()
    cl = RedisCluster3(tmp_path_factory.mktemp("cluster")).start()
    yield cl
    cl.stop()


def make_records(num_slots: int, record_bytes: int, seed: int) -> np.ndarray:
    """Host records filled with bytes that are a function of (seed, slot)."""
    return np.random.default_rng(seed).integers(0, 256, (num_slots, record_bytes), dtype=np.uint8)


#: seconds a loaded machine's cluster may take to elect, gossip or sync
CLUSTER_TIMEOUT = 60.0


def within(cond: Callable[[], bool], timeout: float = CLUSTER_TIMEOUT) -> bool:
    """Whether ``cond()`` holds within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def replicas_ready(cl: RedisCluster3) -> bool:
    """Every replica in sync with its master, and every node's view lists the three replicas."""
    infos = [n.cli("info", "replication") for n in cl.nodes]
    if any("role:slave" in i and "master_link_status:up" not in i for i in infos):
        return False
    for n in cl.nodes:
        rows = [line.split() for line in n.cli("cluster", "nodes").splitlines()]
        masters = {f[0] for f in rows if len(f) > 3 and "master" in f[2]}
        if sum("slave" in f[2] and "fail" not in f[2] and f[3] in masters for f in rows if len(f) > 3) != 3:
            return False
    return True


@pytest.fixture
def cluster6(tmp_path: Path) -> Iterator[RedisCluster3]:
    """3 masters with one replica each, replicas in sync and known to every node."""
    require_redis()
    cl = RedisCluster3(tmp_path / "cluster", maxmemory="64mb", replicas=1).start()
    try:
        assert within(lambda: replicas_ready(cl)), "replicas did not sync"
        yield cl
    finally:
        cl.stop()


def served_slots(node: RedisServer) -> list[range]:
    """The slots ``node`` serves (stable ranges, not those migrating), as it sees itself."""
    mine = next(line for line in node.cli("cluster", "nodes").splitlines() if "myself" in line).split()[8:]
    return [range(int(r.split("-")[0]), int(r.split("-")[-1]) + 1) for r in mine if "[" not in r]


def graceful_failover(cl: RedisCluster3, replica: int, master: int, timeout: float = CLUSTER_TIMEOUT) -> None:
    """``CLUSTER FAILOVER`` on the node on port ``replica`` until it replaces the master on port
    ``master`` (the replica gives up a manual failover the old master does not complete within
    5 s on a loaded machine: an operator asks again), then until the cluster is ok."""

    def promoted() -> bool:
        return replica in cl.masters() and master not in cl.masters()

    deadline = time.monotonic() + timeout
    while True:
        if "role:slave" in cl.node(replica).cli("info", "replication"):
            cl.node(replica).cli("cluster", "failover")
        if within(promoted, 6.0):
            break
        assert time.monotonic() < deadline, "the failover did not complete"
    cl.wait_ok(timeout)


def removed_until(t: Tier, want: int, timeout: float = 10.0, quiet: float = 0.3) -> list[bytes]:
    """The keys ``t.take_removed()`` reports until ``want`` have come (or ``timeout`` seconds),
    then for ``quiet`` seconds more (nothing else may arrive)."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += t.take_removed()
        time.sleep(0.02)
    time.sleep(quiet)
    return out + t.take_removed()
