"""The one check the Redis-backed tests make before starting a real ``redis-server``, and the
fixture body that starts one."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvoffload.testing.redis_server import RedisServer, redis_binaries_problem

__all__ = ["require_redis", "server_of_its_own"]


def require_redis(what: str, strict_env: tuple[str, ...] = ("KVOFFLOAD_REQUIRE_REDIS",)) -> None:
    """Skip ``what`` without Debian's ``redis-server`` / ``redis-cli``; fail instead when one of
    ``strict_env`` is ``1`` (``.ci/run`` sets ``KVOFFLOAD_REQUIRE_REDIS=1``, so CI never skips)."""
    problem = redis_binaries_problem()
    if problem is None:
        return
    strict = [v for v in strict_env if os.environ.get(v) == "1"]
    if strict:
        pytest.fail(f"{what} need redis-server ({strict[0]}=1): {problem}")
    pytest.skip(f"{what} need Debian's redis-server: {problem}")


def server_of_its_own(directory: Path, require: Callable[[], None]) -> Iterator[RedisServer]:
    """A fixture body: ``require()`` (one of the checks built on :func:`require_redis`), then a
    ``redis-server`` on 127.0.0.1 and a free port with its files in ``directory``, yielded and
    stopped after the test(s)."""
    require()
    srv = RedisServer(directory).start()
    yield srv
    srv.stop()
