"""RedisTier faults: server SIGKILLed mid-run and restarted, a stalled server (back-pressure), bad values."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RecordCodec, RedisTier, TierNamespace
from tests.tiers.conftest import NS, make_records
from tests.tiers.proxy import TurnCountingProxy

RB = 64 << 10
FAST = {"socket_timeout": 0.5, "connect_timeout": 0.5, "backoff_initial": 0.05, "backoff_max": 0.2}


def _wait_recovered(t: RedisTier, probe_key: bytes, timeout: float = 10.0) -> None:
    """Step until the tier answers a lookup from the server again (a verdict, not an outage miss)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = t.stats().lookup_round_trips
        settle(t, [probe_key + bytes([int(time.monotonic() * 1000) % 251])])
        if t.stats().lookup_round_trips > before:
            return
        time.sleep(0.05)
    raise AssertionError("tier did not recover")


def test_sigkill_mid_run_then_restart_tier_used_again(own_redis: RedisServer) -> None:
    proxy = TurnCountingProxy(own_redis.port)
    try:
        src = make_records(16, RB, seed=11)
        keys = make_keys(8)
        with RedisTier(src, NS, proxy.url, **FAST) as t:
            assert run_job(t, "store", 1, keys, list(range(8))) == (True,) * 8
            assert (settle(t, keys) == LOOKUP_HIT).all()
            # a load in flight when the server dies: held at the proxy, then the server is killed
            proxy.stall()
            before = src[8:].copy()
            t.submit_load(2, keys, list(range(8, 16)))
            time.sleep(0.1)
            own_redis.kill()
            proxy.resume()
            assert t.drain(timeout=10)
            (res,) = t.get_finished()
            assert res.job_id == 2 and not res.success  # replies already on the wire may still land
            for i, ok in enumerate(res.ok):  # a loaded key holds its bytes, a failed key's slot is untouched
                np.testing.assert_array_equal(src[8 + i], src[i] if ok else before[i])
            failed_in_flight = res.ok.count(False)
            # while down: lookups of new keys miss at once, stores are dropped, loads fail
            fresh = make_keys(3, b"fresh")
            assert (t.lookup(fresh) == LOOKUP_MISS).all()
            t.submit_store(3, fresh, [0, 1, 2])
            (res,) = t.get_finished()  # dropped at submission: reported without waiting
            assert res.ok == (False,) * 3
            assert run_job(t, "load", 4, keys[:2], [8, 9]) == (False, False)
            st = t.stats()
            assert st.dropped_writes == 3 and st.read_failures == failed_in_flight + 2 and st.errors == 0
            own_redis.start()  # same port, empty (no persistence)
            _wait_recovered(t, b"probe")
            assert run_job(t, "store", 5, fresh, [0, 1, 2]) == (True,) * 3
            t.end_step()
            t.end_step()
            assert run_job(t, "load", 6, fresh, [8, 9, 10]) == (True,) * 3
            np.testing.assert_array_equal(src[8:11], src[0:3])
    finally:
        proxy.close()


def test_stalled_server_drops_writes_and_never_blocks_the_engine(redis_url: str, redis_server: RedisServer) -> None:
    proxy = TurnCountingProxy(redis_server.port)
    try:
        recs = make_records(8, RB, seed=12)
        with RedisTier(recs, NS, proxy.url, max_pending_write_bytes=2 * RB, **FAST) as t:
            settle(t, make_keys(1, b"warm"))
            proxy.stall()
            t.submit_store(1, make_keys(2, b"a"), [0, 1])  # accepted: fills the write queue
            t.submit_store(2, make_keys(2, b"b"), [2, 3])  # queue full: dropped at once
            done = t.get_finished()
            assert [(r.job_id, r.ok) for r in done] == [(2, (False, False))]
            assert (t.lookup(make_keys(4, b"c")) == LOOKUP_RETRY).all()  # answered at once, probe pending
            t.end_step()
            assert t.drain(timeout=10)  # job 1 times out at the stalled server
            (r1,) = t.get_finished()
            assert r1.job_id == 1 and r1.ok == (False, False)
            assert (t.lookup(make_keys(4, b"c")) == LOOKUP_MISS).all()
            assert t.stats().dropped_writes == 2
            proxy.resume()
            _wait_recovered(t, b"probe")
            assert run_job(t, "store", 3, make_keys(2, b"b"), [2, 3]) == (True, True)
    finally:
        proxy.close()


def _values(codec: RecordCodec, key: bytes, rec: np.ndarray) -> dict[str, bytes]:
    good = codec.encode(key, rec)
    other_ns = TierNamespace("other/model", "bfloat16", "bfloat16", "flash_attn", (2, 16, 4, 64), 16)
    other = RecordCodec(other_ns.fingerprint(), rec.size).encode(key, rec)
    flipped = bytearray(good)
    flipped[-1] ^= 1
    return {
        "magic": b"XXXX" + good[4:],
        "truncated": good[:-100],
        "length": good + b"\0" * 16,
        "fingerprint": other,
        "key": codec.encode(key[:-1] + b"\x09", rec),
        "checksum": bytes(flipped),
        "tiny": b"KVOT",
    }


@pytest.mark.parametrize("case", ["magic", "truncated", "length", "fingerprint", "key", "checksum", "tiny"])
def test_bad_values_are_counted_misses_deleted_never_loaded(redis_url: str, case: str) -> None:
    recs = make_records(4, 4096, seed=13)
    (key,) = make_keys(1)
    with RedisTier(recs, NS, redis_url) as t:
        value = _values(t.codec, key, recs[0])[case]
        r = redis.Redis.from_url(redis_url)
        r.set(t.store_key(key), value)
        assert settle(t, [key])[0] == LOOKUP_HIT  # present; only the load can tell
        before = recs.copy()
        assert run_job(t, "load", 1, [key], [1]) == (False,)
        # the failed slot's bytes are unspecified (contract §8: the load lands there and is checked
        # there); every other slot is untouched
        np.testing.assert_array_equal(recs[[0, 2, 3]], before[[0, 2, 3]])
        assert t.stats().rejected_values == 1
        assert r.exists(t.store_key(key)) == 0  # deleted
        assert t.lookup([key])[0] == LOOKUP_MISS


def test_integrity_key_rejects_unsigned_and_foreign_macs(redis_url: str) -> None:
    recs = make_records(4, 4096, seed=14)
    k1, k2, k3 = make_keys(3)
    secret, other = b"s" * 32, b"o" * 32
    with RedisTier(recs, NS, redis_url) as plain, RedisTier(recs, NS, redis_url, integrity_key=other) as mallory:
        run_job(plain, "store", 1, [k1], [0])  # no MAC
        run_job(mallory, "store", 2, [k2], [0])  # MAC with the wrong secret
    with RedisTier(recs, NS, redis_url, integrity_key=secret) as signed:
        run_job(signed, "store", 3, [k3], [0])
        assert run_job(signed, "load", 4, [k1, k2, k3], [1, 2, 3]) == (False, False, True)
        assert signed.stats().rejected_values == 2
        np.testing.assert_array_equal(recs[3], recs[0])
    with RedisTier(recs, NS, redis_url) as reader_without_key:
        assert run_job(reader_without_key, "load", 5, [k3], [1]) == (False,)  # cannot verify: refused
        assert reader_without_key.contains([k3]) == [True]  # ...but left for the readers that can
