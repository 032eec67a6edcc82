"""Fixtures of the vLLM integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.testing.redis_server import RedisServer
from tests.integrations.vllm_env import require_redis
from tests.redis_support import server_of_its_own


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (tests that kill it or corrupt its values)."""
    yield from server_of_its_own(tmp_path / "redis", require_redis)


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request: pytest.FixtureRequest) -> bool:
    """vLLM's ``async_scheduling`` off, then on (``Engine(async_scheduling=...)`` of the harness)."""
    return bool(request.param)
