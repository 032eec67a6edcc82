"""Tier.check_store, the check at start, against real servers: a configuration error is a typed
error naming the tier (its URL without secrets) with the server's own reply; a store that does not
answer is TierUnavailable; a good configuration answers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.testing.redis_server import RedisServer
from kvoffload.tiers.health import TierUnavailable
from kvoffload.tiers.registry import resolve_tier
from tests.redis_support import server_of_its_own
from tests.tiers.conftest import NS, require_redis

RECORDS = np.zeros((4, 64), dtype=np.uint8)


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server with an ACL user ``kvo`` and its password."""
    require_redis()
    acl = ("--user", "kvo", "on", ">s3cret-pw", "~*", "&*", "+@all")
    srv = RedisServer(tmp_path_factory.mktemp("locked"), extra=acl).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def plain_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from server_of_its_own(tmp_path_factory.mktemp("plain"), require_redis)


def _check(url: str) -> None:
    cls, kwargs = resolve_tier(url)
    tier = cls(RECORDS, NS, **kwargs)
    try:
        tier.check_store()
    finally:
        tier.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_good_configuration_answers(plain_redis: RedisServer, locked_redis: RedisServer, tmp_path: Path) -> None:
    _check(plain_redis.url)
    _check(f"redis://kvo:s3cret-pw@127.0.0.1:{locked_redis.port}/0")
    _check(f"unix://{plain_redis.socket_path}") if Path(plain_redis.socket_path).exists() else None
    _check(f"disk:{tmp_path / 'kv'}?o_direct=0")


@pytest.mark.parametrize(
    "make_url, says",
    [
        (
            lambda s: f"redis://kvo:wrong-pw@127.0.0.1:{s.port}/0",
            r"credentials refused; the server said: .*(WRONGPASS|invalid)",
        ),
        (lambda s: f"redis://nobody:wrong-pw@127.0.0.1:{s.port}/0", r"credentials refused"),
    ],
)
def test_credentials_refused(locked_redis: RedisServer, make_url, says: str) -> None:  # type: ignore[no-untyped-def]
    url = make_url(locked_redis)
    with pytest.raises(InvalidArgumentError, match=says) as info:
        _check(url)
    assert "wrong-pw" not in str(info.value) and f"127.0.0.1:{locked_redis.port}" in str(info.value)


def test_a_database_that_does_not_exist(plain_redis: RedisServer) -> None:
    with pytest.raises(InvalidArgumentError, match=r"database.*the server said: .*DB index is out of range"):
        _check(f"redis://127.0.0.1:{plain_redis.port}/99")


def test_a_host_name_that_does_not_resolve() -> None:
    with pytest.raises(InvalidArgumentError, match="does not resolve"):
        _check("redis://no-such-host.invalid:6379/0")


def test_tls_against_a_plain_server_and_the_reverse(plain_redis: RedisServer, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"speaks plain TCP: use a redis:// URL"):
        _check(f"rediss://127.0.0.1:{plain_redis.port}/0?connect_timeout=1")
    require_redis()
    tls = RedisServer(tmp_path / "tls", tls=True).start()
    try:
        with pytest.raises(InvalidArgumentError, match=r"speaks TLS: use a rediss:// URL"):
            _check(f"redis://127.0.0.1:{tls.port}/0?connect_timeout=1")
    finally:
        tls.stop()


def test_a_server_that_does_not_answer_may_come_back() -> None:
    with pytest.raises(TierUnavailable, match="ConnectionError"):
        _check(f"redis://127.0.0.1:{_closed_port()}/0")


def test_a_directory_that_cannot_hold_the_tier(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        _check(f"disk:{blocker}")
