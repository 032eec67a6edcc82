"""A standalone Redis under what a shared cache meets: ``maxmemory`` + ``allkeys-lru`` with two
writers, a restart that empties it, a foreign writer (random bytes, values swapped between keys,
truncated, forged without a key, forged with a wrong key), and an integrity key rotated.

Each checks what was loaded byte for byte, what kvoffload counted and what it deleted (its
counter and the server's own ``EVAL`` statistics: kvoffload deletes with ``EVAL`` only).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import redis

from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import RecordCodec, RedisTier
from tests.tiers.conftest import NS, make_records, require_redis
from tests.tiers.redis.test_redis_counters import COUNTERS, assert_only
from tests.tiers.scenario_report import report

RB = 64 << 10
FAST = {"socket_timeout": 0.5, "connect_timeout": 0.5, "backoff_initial": 0.05, "backoff_max": 0.2}
OLD, NEW = b"old-secret-0123456789", b"new-secret-0123456789"


def _evals(srv: RedisServer) -> int:
    line = next((x for x in srv.cli("info", "commandstats").splitlines() if x.startswith("cmdstat_eval:")), "")
    return int(line.split("calls=")[1].split(",")[0]) if line else 0


def _report(name: str, t: RedisTier, **extra: int) -> None:
    st = t.stats()
    fields = ("blocks_written", "writes_skipped", "blocks_read", *COUNTERS)
    report(name, {**{f: getattr(st, f) for f in fields}, **extra})


def test_lru_evictions_under_two_writers_are_absent_never_corrupt(tmp_path: Path) -> None:
    require_redis()
    srv = RedisServer(tmp_path / "lru", maxmemory="8mb").start()
    try:
        n = 64  # 2 writers x 64 values of 64 KiB: 8 MiB into 8 MiB with the server's own overhead
        recs = [make_records(n, RB, seed=40 + w) for w in range(2)]
        keys = [make_keys(n, b"w%d" % w) for w in range(2)]
        writers = [RedisTier(recs[w], NS, srv.url, batch_keys=2, **FAST) for w in range(2)]
        done: list[tuple[bool, ...]] = [(), ()]

        def write(w: int) -> None:
            done[w] = run_job(writers[w], "store", 1, keys[w], list(range(n)))

        threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for t in writers:
            t.close()
        assert all(all(ok) for ok in done)
        stored = sum(t.stats().blocks_written for t in writers)
        evicted = int(srv.cli("info", "stats").split("evicted_keys:")[1].split()[0])
        held = int(srv.cli("dbsize"))
        assert evicted > 0 and held + evicted == 2 * n
        dst = np.zeros((2 * n, RB), dtype=np.uint8)
        with RedisTier(dst, NS, srv.url, **FAST) as reader:
            ok = run_job(reader, "load", 2, keys[0] + keys[1], list(range(2 * n)))
            assert_only(reader.stats(), absent=2 * n - sum(ok))
            # the GET replies sit in the server's output buffers, which count against maxmemory:
            # the read itself may make the server evict a few more keys. Every key the server
            # still holds after the read was loaded; every key not loaded is gone, by eviction.
            snap = redis.Redis.from_url(srv.url).pipeline(transaction=True)  # one atomic snapshot
            for k in keys[0] + keys[1]:
                snap.exists(reader.store_key(k))
            *exists, held_now, info = snap.dbsize().info("stats").execute()
            evicted_now = int(info["evicted_keys"])
            assert all(good for good, there in zip(ok, exists, strict=True) if there)
            assert held_now == sum(exists) and held_now + evicted_now == 2 * n and held_now <= sum(ok) <= held
            _report(
                "maxmemory allkeys-lru, two writers",
                reader,
                stored_by_writers=stored,
                evicted_by_server=evicted,
                evicted_while_read=evicted_now - evicted,
            )
        for i, good in enumerate(ok):
            want = recs[i // n][i % n]
            if good:
                np.testing.assert_array_equal(dst[i], want)
            else:
                assert not dst[i].any()
        assert _evals(srv) == 0
    finally:
        srv.stop()


def test_server_restarted_empty_loads_absent_then_stores_land(own_redis: RedisServer) -> None:
    recs = make_records(16, RB, seed=42)
    keys = make_keys(8)
    with RedisTier(recs, NS, own_redis.url, **FAST) as t:
        assert run_job(t, "store", 1, keys, list(range(8))) == (True,) * 8
        own_redis.kill()
        own_redis.start()  # same port, nothing persisted; the pooled connections are stale
        assert run_job(t, "load", 2, keys, list(range(8, 16))) == (False,) * 8
        assert_only(t.stats(), absent=8)
        assert run_job(t, "store", 3, keys, list(range(8))) == (True,) * 8  # lands again
        assert run_job(t, "load", 4, keys, list(range(8, 16))) == (True,) * 8
        np.testing.assert_array_equal(recs[8:], recs[:8])
        _report("server restarted empty", t)


def _foreign(case: str, codec: RecordCodec, keys: list[bytes], recs: np.ndarray) -> bytes:
    """What a foreign client writes under ``keys[0]``."""
    good = codec.encode(keys[0], recs[0])
    if case == "random":
        return np.random.default_rng(43).integers(0, 256, len(good), dtype=np.uint8).tobytes()
    if case == "swapped":
        return codec.encode(keys[1], recs[1])  # a valid value of another key
    if case == "truncated":
        return good[: len(good) // 2]
    forged = recs[0].copy()
    forged[:16] ^= 0xFF  # KV the engines never computed
    key = None if case == "forged without a key" else b"a-guessed-secret-0123"
    return RecordCodec(NS.fingerprint(), RB, key).encode(keys[0], forged)


@pytest.mark.parametrize(
    "case, want",
    [
        ("random", {"corrupt": 1, "deleted_values": 1}),
        ("swapped", {"corrupt": 1, "deleted_values": 1}),
        ("truncated", {"corrupt": 1, "deleted_values": 1}),
        ("forged without a key", {"rejected_integrity": 1}),
        ("forged with a wrong key", {"rejected_integrity": 1}),
    ],
)
def test_foreign_writer_nothing_wrong_loaded(redis_url: str, redis_server: RedisServer, case: str, want: dict) -> None:
    recs = make_records(4, RB, seed=44)
    keys = make_keys(2)
    evals = _evals(redis_server)
    with RedisTier(recs, NS, redis_url, integrity_key=OLD) as t:
        value = _foreign(case, RecordCodec(NS.fingerprint(), RB), keys, recs)
        redis.Redis.from_url(redis_url).set(t.store_key(keys[0]), value)
        before = recs.copy()
        assert run_job(t, "load", 1, keys[:1], [2]) == (False,)
        # the value lands in slot 2 and is refused there: its bytes are unspecified (contract §8)
        np.testing.assert_array_equal(recs[[0, 1, 3]], before[[0, 1, 3]])
        assert_only(t.stats(), rejected_values=1, **want)
        kept = redis.Redis.from_url(redis_url).get(t.store_key(keys[0]))
        assert kept == (None if want.get("deleted_values") else value)
        assert _evals(redis_server) - evals == want.get("deleted_values", 0)
        _report(f"foreign writer: {case} (keyed reader)", t)
    if case == "forged without a key":  # what a tier without a key allows: the forged KV is loaded
        with RedisTier(recs, NS, redis_url) as unkeyed:
            assert run_job(unkeyed, "load", 2, keys[:1], [3]) == (True,)
            assert not np.array_equal(recs[3], recs[0])


def test_key_rotation_old_values_load_while_the_new_key_signs(redis_url: str, redis_server: RedisServer) -> None:
    evals = _evals(redis_server)
    recs = make_records(16, RB, seed=45)
    old_keys, new_keys = make_keys(4, b"o"), make_keys(4, b"n")
    with RedisTier(recs, NS, redis_url, integrity_key=OLD) as before:
        assert run_job(before, "store", 1, old_keys, [0, 1, 2, 3]) == (True,) * 4
    # step 1 of a rotation: every engine accepts both keys, the new one signs
    with RedisTier(recs, NS, f"{redis_url}?integrity_key={NEW.decode()}&integrity_key={OLD.decode()}") as rotated:
        assert run_job(rotated, "load", 2, old_keys, [8, 9, 10, 11]) == (True,) * 4
        assert run_job(rotated, "store", 3, new_keys, [4, 5, 6, 7]) == (True,) * 4
        assert run_job(rotated, "load", 4, new_keys, [12, 13, 14, 15]) == (True,) * 4
        assert_only(rotated.stats())
        _report("key rotation: reader accepting new + old keys", rotated)
    np.testing.assert_array_equal(recs[8:], recs[:8])
    # an engine not yet rotated refuses the new values; one past the rotation refuses the old ones;
    # neither deletes: the values age out of the store
    for accepted, refused in (([OLD], new_keys), ([NEW], old_keys)):
        with RedisTier(recs, NS, redis_url, integrity_key=accepted) as t:
            assert run_job(t, "load", 5, refused, [8, 9, 10, 11]) == (False,) * 4
            assert_only(t.stats(), rejected_values=4, rejected_integrity=4)
    assert int(redis_server.cli("dbsize")) == 8 and _evals(redis_server) == evals
    np.testing.assert_array_equal(recs[8:], recs[:8])  # refused values wrote nothing
