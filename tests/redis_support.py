"""The one check the Redis-backed tests make before starting a real ``redis-server``."""

from __future__ import annotations

import os

import pytest

from kvoffload.testing.redis_server import redis_binaries_problem

__all__ = ["require_redis"]


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
