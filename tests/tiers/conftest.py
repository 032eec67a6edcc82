"""Fixtures of the tier tests: real ``redis-server`` processes, records, namespaces.

Without ``redis-server`` the Redis tests are skipped with the reason; ``KVOFFLOAD_REQUIRE_REDIS=1``
(set by ``.ci/run``) turns that skip into a failure, so CI never skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvoffload.testing.redis_server import RedisCluster3, RedisServer
from kvoffload.tiers import TierNamespace
from tests.redis_support import require_redis as _require_redis
from tests.redis_support import server_of_its_own

NS = TierNamespace("test/model@1", "float16", "float16", "flash_attn", (2, 16, 4, 64), 16)


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
