"""RedisTier against a real redis-server: round trips, lookups, round-trip count, ACL, unix socket, eviction races."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import redis

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RedisTier
from tests.tiers.conftest import NS, make_records, require_redis
from tests.tiers.proxy import TurnCountingProxy

RB = 3 * 4096 + 17  # an odd record size: no accidental alignment


def test_store_lookup_load_roundtrip_bytes_exact(redis_url: str) -> None:
    src = make_records(8, RB, seed=1)
    keys = make_keys(5)
    with RedisTier(src, NS, redis_url) as a:
        assert (settle(a, keys) == LOOKUP_MISS).all()
        assert run_job(a, "store", 1, keys, [3, 0, 7, 1, 5]) == (True,) * 5
        st = a.stats()
        assert (st.blocks_written, st.bytes_written, st.writes_skipped) == (5, 5 * RB, 0)
        # the same keys again: SET NX leaves the values alone, reported ok, counted as skipped
        assert run_job(a, "store", 2, keys, [2, 2, 2, 2, 2]) == (True,) * 5
        assert a.stats().writes_skipped == 5
    dst = make_records(8, RB, seed=2)
    before = dst.copy()
    with RedisTier(dst, NS, redis_url) as b:
        assert (settle(b, keys + make_keys(2, b"absent")) == [1, 1, 1, 1, 1, 0, 0]).all()
        assert run_job(b, "load", 9, keys, [0, 1, 2, 3, 4]) == (True,) * 5
        np.testing.assert_array_equal(dst[[0, 1, 2, 3, 4]], src[[3, 0, 7, 1, 5]])
        np.testing.assert_array_equal(dst[5:], before[5:])  # slots outside the job untouched
        st = b.stats()
        assert (st.blocks_read, st.bytes_read, st.read_failures, st.rejected_values) == (5, 5 * RB, 0, 0)
        assert (st.lookups, st.hits) == (7, 5)


def test_lookup_retry_then_verdict_and_no_blocking(redis_url: str) -> None:
    recs = make_records(4, RB, seed=3)
    keys = make_keys(3)
    with RedisTier(recs, NS, redis_url, lookup_ttl_steps=2) as t:
        run_job(t, "store", 1, keys[:1], [0])
        t.get_finished()
        codes = t.lookup(keys[1:])  # never probed: queued, RETRY
        assert (codes == LOOKUP_RETRY).all()
        assert (t.lookup(keys[1:]) == LOOKUP_RETRY).all()  # still queued, not sent twice
        t.end_step()
        t.drain()
        assert (t.lookup(keys[1:]) == LOOKUP_MISS).all()
        assert t.stats().lookup_round_trips == 1
        # another client stores keys[1]: the cached miss holds until the verdict expires (2 steps)
        other = RedisTier(recs, NS, redis_url)
        run_job(other, "store", 5, keys[1:2], [1])
        other.close()
        t.end_step()
        t.end_step()
        assert settle(t, keys[1:2])[0] == LOOKUP_HIT


def test_one_round_trip_per_lookup_batch_whatever_its_size(redis_url: str, redis_server: RedisServer) -> None:
    proxy = TurnCountingProxy(redis_server.port)
    try:
        recs = make_records(2, RB, seed=4)
        with RedisTier(recs, NS, proxy.url) as t:
            settle(t, make_keys(1, b"warm"))  # connection set-up (CLIENT SETINFO...) happens here
            for n, tag in ((1, b"a"), (10, b"b"), (300, b"c")):
                before_turns, before_rt = proxy.turns, t.stats().lookup_round_trips
                codes = settle(t, make_keys(n, tag))
                assert (codes == LOOKUP_MISS).all()
                assert proxy.turns - before_turns == 1, n
                assert t.stats().lookup_round_trips - before_rt == 1
    finally:
        proxy.close()


def test_deleted_or_evicted_between_lookup_and_load_fails_that_key_only(redis_url: str) -> None:
    recs = make_records(6, RB, seed=5)
    keys = make_keys(3)
    with RedisTier(recs, NS, redis_url) as t:
        run_job(t, "store", 1, keys, [0, 1, 2])
        assert (settle(t, keys) == LOOKUP_HIT).all()
        redis.Redis.from_url(redis_url).delete(t.store_key(keys[1]))  # another client deletes it
        before = recs[4].copy()
        ok = run_job(t, "load", 2, keys, [3, 4, 5])
        assert ok == (True, False, True)
        np.testing.assert_array_equal(recs[[3, 5]], recs[[0, 2]])
        np.testing.assert_array_equal(recs[4], before)  # an absent value writes nothing
        assert t.stats().read_failures == 1
        assert t.lookup(keys[1:2])[0] == LOOKUP_MISS  # the failed load became a cached miss


def test_allkeys_lru_eviction_leaves_no_partial_value(tmp_path) -> None:
    require_redis()
    srv = RedisServer(tmp_path / "small", maxmemory="8mb").start()
    try:
        n, rb = 64, 256 << 10  # 16 MiB of values into 8 MiB
        recs = make_records(n, rb, seed=6)
        keys = make_keys(n)
        with RedisTier(recs, NS, srv.url, io_threads=1, batch_keys=2) as t:
            stored = run_job(t, "store", 1, keys, list(range(n)))
            dst = np.zeros_like(recs)
            t2 = RedisTier(dst, NS, srv.url)
            ok = run_job(t2, "load", 2, keys, list(range(n)))
            t2.close()
        assert sum(stored) > sum(ok) > 0  # the server evicted some whole values
        for i, good in enumerate(ok):
            if good:
                np.testing.assert_array_equal(dst[i], recs[i])
            else:
                assert not dst[i].any()
    finally:
        srv.stop()


def test_unix_socket_and_acl_user(redis_server: RedisServer) -> None:
    redis_server.cli("flushall")
    redis_server.cli("acl", "setuser", "kvuser", "on", ">s3cret-pw", "~kvo:*", "+@all")
    recs = make_records(2, RB, seed=7)
    key = make_keys(1)
    with RedisTier(recs, NS, f"redis://kvuser:s3cret-pw@127.0.0.1:{redis_server.port}") as t:
        assert run_job(t, "store", 1, key, [0]) == (True,)
    with RedisTier(recs, NS, f"unix://{redis_server.socket_path}") as u:
        assert settle(u, key)[0] == LOOKUP_HIT
        assert run_job(u, "load", 2, key, [1]) == (True,)
    np.testing.assert_array_equal(recs[1], recs[0])
    with RedisTier(recs, NS, redis_server.url, username="kvuser", password="wrong") as bad:
        assert settle(bad, key)[0] == LOOKUP_MISS  # authentication fails: an outage, never an exception
        assert bad.stats().lookups == 0


@pytest.mark.parametrize(
    "url, kw, needle",
    [
        ("http://127.0.0.1:6379", {}, "scheme"),
        ("redis://", {}, "no host"),
        ("redis://127.0.0.1:99999", {}, "port"),
        ("redis://127.0.0.1:6379?bogus=1", {}, "bogus"),
        ("redis://127.0.0.1:6379?socket_timeout=-1", {}, "socket_timeout"),
        ("redis://127.0.0.1:6379?cluster=maybe", {}, "cluster"),
        ("redis://h1:1,h2:2?cluster=false", {}, "contradicts"),
        ("unix://", {}, "unix"),
        ("redis://127.0.0.1:6379", {"key_prefix": "a:b"}, "key_prefix"),
        ("redis://127.0.0.1:6379?ssl_ca_certs=/x", {}, "rediss"),
        ("redis://127.0.0.1:6379", {"io_threads": 0}, "io_threads"),
        ("redis://127.0.0.1:6379", {"backoff_initial": 0}, "backoff_initial"),
        ("redis://127.0.0.1:6379?max_connections=3", {}, "max_connections"),
    ],
)
def test_bad_urls_and_options_raise_typed_errors_at_construction(url: str, kw: dict, needle: str) -> None:
    recs = make_records(2, 64, seed=8)
    with pytest.raises(ValueError, match=needle):
        RedisTier(recs, NS, url, **kw)


def test_bad_records_and_job_arguments_are_typed_errors(redis_url: str) -> None:
    with pytest.raises(TypeError, match="records"):
        RedisTier([[1, 2]], NS, redis_url)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="records"):
        RedisTier(np.zeros((4, 8), dtype=np.float32), NS, redis_url)
    recs = make_records(4, 64, seed=9)
    with RedisTier(recs, NS, redis_url) as t:
        with pytest.raises(ValueError, match="slots"):
            t.submit_store(1, make_keys(2), [0, 4])
        with pytest.raises(ValueError, match="one slot per key"):
            t.submit_load(1, make_keys(2), [0])
        with pytest.raises(TypeError, match=r"keys\[0\]"):
            t.lookup(["not-bytes"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="job_id"):
            t.submit_store(True, make_keys(1), [0])
        assert t.get_finished() == [] and t.stats().blocks_written == 0


def test_rediss_tls_roundtrip(tmp_path) -> None:
    require_redis()
    if shutil.which("openssl") is None:
        if os.environ.get("KVOFFLOAD_REQUIRE_REDIS") == "1":
            pytest.fail("KVOFFLOAD_REQUIRE_REDIS=1 but openssl (for the TLS server's certificate) is missing")
        pytest.skip("openssl is needed to make the test server's certificate")
    srv = RedisServer(tmp_path / "tls", tls=True).start()
    try:
        src = make_records(4, RB, seed=10)
        keys = make_keys(2)
        with RedisTier(src, NS, f"{srv.url}?ssl_ca_certs={srv.ca_file}") as t:
            assert run_job(t, "store", 1, keys, [0, 1]) == (True, True)
            assert (settle(t, keys) == LOOKUP_HIT).all()
            assert run_job(t, "load", 2, keys, [3, 2]) == (True, True)
        np.testing.assert_array_equal(src[[3, 2]], src[[0, 1]])
        with RedisTier(src, NS, srv.url, ssl_cert_reqs="required") as untrusted:  # no CA: the handshake fails
            assert settle(untrusted, keys)[0] == LOOKUP_MISS and untrusted.stats().lookups == 0
        assert srv.cli("dbsize").strip() == "2"
    finally:
        srv.stop()
