"""TieredManager over a real CPUOffloadingManager and a real Redis tier: fall-through lookups,
promotion, write-through with pinned slots, failed / refused promotions, one round trip per step,
no slot leak."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.engine.tiered import TieredManager
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import RedisTier
from tests.keys import CTX
from tests.tiers.conftest import ASYNC, NS, make_records
from tests.tiers.proxy import TurnCountingProxy

RB = 4096 + 24


def _store(m: TieredManager, keys: list[bytes], records: np.ndarray, src: np.ndarray) -> None:
    """A GPU -> CPU store through the manager: slots allocated, bytes written, store completed."""
    out = m.prepare_store(keys, CTX)
    assert out is not None and out.keys_to_store == keys
    for k, s in zip(keys, out.store_spec.block_ids.tolist(), strict=True):
        records[s] = src[keys.index(k)]
    m.complete_store(keys, CTX)


def _settle(m: TieredManager, keys: list[bytes], steps: int = 200) -> np.ndarray:
    """Engine steps (lookup + end_step) until no key is pending; the codes."""
    for _ in range(steps):
        codes = m.lookup_batch(keys, CTX)
        m.end_step()
        if not (codes == LOOKUP_PENDING).any():
            return codes
        for t in m.tiers:
            t.drain(timeout=5)
    raise AssertionError("keys still pending")


def _no_leak(m: TieredManager) -> None:
    assert m.drain(timeout=30)
    st = m.primary.get_stats()
    assert (st.num_pending, st.num_pinned, m.num_reserved(), m.num_write_pinned()) == (0, 0, 0, 0)


def test_write_through_then_promotion_in_another_manager(redis_url: str) -> None:
    keys = make_keys(6, b"wt")
    src = make_records(6, RB, seed=1)
    rec_a = np.zeros((8, RB), np.uint8)
    a = TieredManager(CPUOffloadingManager(8), [RedisTier(rec_a, NS, redis_url)])
    _store(a, keys, rec_a, src)
    # the stored blocks stay pinned until the write is reported
    assert a.primary.get_stats().num_pinned == 6 and a.num_write_pinned() == 6
    _no_leak(a)
    assert a.usage()[0].blocks_written == 6
    a.close()

    rec_b = np.zeros((8, RB), np.uint8)
    b = TieredManager(CPUOffloadingManager(8), [RedisTier(rec_b, NS, redis_url)], max_promoted_blocks=8, **ASYNC)
    codes = b.lookup_batch(keys, CTX)  # host pool misses, tier not probed yet: defer
    assert (codes == LOOKUP_PENDING).all()
    assert (_settle(b, keys) == LOOKUP_HIT).all()
    spec = b.prepare_load(keys, CTX)
    np.testing.assert_array_equal(rec_b[spec.block_ids], src)
    b.complete_load(keys, CTX)
    assert b.usage()[0].blocks_promoted == 6 and b.promoted == set(keys)
    # promoted keys are not written back
    _no_leak(b)
    assert b.usage()[0].blocks_written == 0
    b.close()


def test_lookup_answered_within_the_call(redis_url: str) -> None:
    """With the defaults a lookup probes its unknown keys at once and reads the tier hits that fit
    the step's ``sync_load_budget_bytes`` within the call: no deferral; larger ones are promoted
    asynchronously; the budget is per step."""
    keys = make_keys(6, b"now")
    src = make_records(6, RB, seed=7)
    with RedisTier(src, NS, redis_url) as w:
        assert all(run_job(w, "store", 1, keys[:5], list(range(5))))  # keys[5] is nowhere
    rec = np.zeros((8, RB), np.uint8)
    tier = RedisTier(rec, NS, redis_url, probe_wait=1.0)  # generous: a loaded machine answers in time
    m = TieredManager(CPUOffloadingManager(8), [tier], sync_load_budget_bytes=3 * RB)
    assert m.probe_in_lookup
    a, b = ReqContext("a"), ReqContext("b")
    # 3 hits fit the budget: read here, answered HIT; the key missing everywhere answers MISS
    codes = m.lookup_batch([*keys[:3], keys[5]], a)
    assert codes.tolist() == [LOOKUP_HIT] * 3 + [LOOKUP_MISS]
    assert tier.stats().lookup_round_trips == 1 and m.num_reserved() == 0
    spec = m.prepare_load(keys[:3], a)
    np.testing.assert_array_equal(rec[spec.block_ids], src[:3])
    m.complete_load(keys[:3], a)
    # the budget of this step is spent: two more hits are promoted asynchronously
    assert (m.lookup_batch(keys[3:5], b) == LOOKUP_PENDING).all() and m.num_reserved() == 2
    codes = _settle(m, keys[3:5])
    assert (codes == LOOKUP_HIT).all()
    np.testing.assert_array_equal(rec[m.prepare_load(keys[3:5], b).block_ids], src[3:5])
    m.complete_load(keys[3:5], b)
    assert m.usage()[0].blocks_promoted == 5
    _no_leak(m)
    m.close()


@pytest.mark.parametrize("where", ["probe_wait=0", "probe_in_lookup=False"])
def test_lookup_without_answers_in_the_call_defers(redis_url: str, where: str) -> None:
    """A tier with ``probe_wait=0`` (vLLM's adapter), or ``probe_in_lookup=False``: a lookup never
    waits on the store; its unknown keys go with the step's probe and the request is deferred."""
    keys = make_keys(2, b"nw")
    src = make_records(2, RB, seed=8)
    with RedisTier(src, NS, redis_url) as w:
        assert all(run_job(w, "store", 1, keys, [0, 1]))
    rec = np.zeros((4, RB), np.uint8)
    wait = 0.0 if where == "probe_wait=0" else 1.0
    tier = RedisTier(rec, NS, redis_url, probe_wait=wait)
    m = TieredManager(CPUOffloadingManager(4), [tier], probe_in_lookup=where != "probe_in_lookup=False")
    assert (m.lookup_batch(keys, CTX) == LOOKUP_PENDING).all()
    assert tier.stats().lookup_round_trips == 0
    assert (_settle(m, keys) == LOOKUP_HIT).all()
    _no_leak(m)
    m.close()


def test_sync_load_of_a_deleted_value_is_a_miss(redis_url: str) -> None:
    keys = make_keys(3, b"sd")
    src = make_records(3, RB, seed=9)
    with RedisTier(src, NS, redis_url) as w:
        assert all(run_job(w, "store", 1, keys, [0, 1, 2]))
    rec = np.zeros((4, RB), np.uint8)
    tier = RedisTier(rec, NS, redis_url, probe_wait=1.0)
    m = TieredManager(CPUOffloadingManager(4), [tier], max_promoted_blocks=4)
    assert (tier.probe_now(keys) == LOOKUP_HIT).all()  # verdicts known...
    redis.Redis.from_url(redis_url).delete(tier.store_key(keys[1]))  # ...then another client deletes one
    assert m.lookup_batch(keys, CTX).tolist() == [LOOKUP_HIT, LOOKUP_MISS, LOOKUP_HIT]
    u = m.usage()[0]
    assert (u.blocks_promoted, u.promotions_failed) == (2, 1)
    assert m.primary.peek([keys[1]]).tolist() == [LOOKUP_MISS]  # its slot freed
    np.testing.assert_array_equal(rec[m.prepare_load([keys[0], keys[2]], CTX).block_ids], src[[0, 2]])
    m.complete_load([keys[0], keys[2]], CTX)
    _no_leak(m)
    m.close()


def test_sync_load_budget_is_checked(redis_url: str) -> None:
    with RedisTier(np.zeros((2, RB), np.uint8), NS, redis_url) as t:
        with pytest.raises(ValueError, match="sync_load_budget_bytes"):
            TieredManager(CPUOffloadingManager(2), [t], sync_load_budget_bytes=-1)
        with pytest.raises(InvalidTypeError, match="probe_in_lookup"):
            TieredManager(CPUOffloadingManager(2), [t], probe_in_lookup=1)  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="on_promotion"):
            TieredManager(CPUOffloadingManager(2), [t], on_promotion=3)  # type: ignore[arg-type]


def test_promotion_stops_at_the_first_key_missing_everywhere(redis_url: str) -> None:
    keys = make_keys(5, b"pf")
    src = make_records(5, RB, seed=2)
    rec = np.zeros((8, RB), np.uint8)
    with RedisTier(rec, NS, redis_url) as w:
        w.submit_store(1, [keys[0], keys[1], keys[3]], [0, 1, 3])  # keys[2] is missing
        assert w.drain(10)
    rec[:5] = src
    rec_b = np.zeros((8, RB), np.uint8)
    m = TieredManager(CPUOffloadingManager(8), [RedisTier(rec_b, NS, redis_url)])
    codes = _settle(m, keys)
    assert codes.tolist() == [LOOKUP_HIT, LOOKUP_HIT, LOOKUP_MISS, LOOKUP_MISS, LOOKUP_MISS]
    assert m.usage()[0].blocks_promoted == 2  # keys[3] was a tier hit behind a miss: not promoted
    _no_leak(m)
    m.close()


def test_value_deleted_between_lookup_and_load_frees_its_slot(redis_url: str) -> None:
    keys = make_keys(4, b"del")
    rec = make_records(8, RB, seed=3)
    with RedisTier(rec, NS, redis_url) as w:
        w.submit_store(1, keys, [0, 1, 2, 3])
        assert w.drain(10)
    rec_b = np.zeros((8, RB), np.uint8)
    tier = RedisTier(rec_b, NS, redis_url)
    m = TieredManager(CPUOffloadingManager(8), [tier], **ASYNC)
    m.lookup_batch(keys, CTX)
    m.end_step()
    tier.drain(5)
    assert (m.lookup_batch(keys, CTX) == LOOKUP_PENDING).all()  # hits: reserved for promotion
    assert m.num_reserved() == 4 and m.primary.get_stats().num_pending == 4
    redis.Redis.from_url(redis_url).delete(tier.store_key(keys[2]))  # another client deletes one
    codes = _settle(m, keys)
    # keys[3] arrived (a request's prefix still ends at keys[2]); keys[2] is a miss now
    assert codes.tolist() == [LOOKUP_HIT, LOOKUP_HIT, LOOKUP_MISS, LOOKUP_HIT]
    u = m.usage()[0]
    assert (u.blocks_promoted, u.promotions_failed) == (3, 1)
    np.testing.assert_array_equal(rec_b[m.prepare_load([keys[3]], CTX).block_ids], rec[[3]])
    m.complete_load([keys[3]], CTX)
    assert m.primary.get_stats().num_used == 3  # the failed key's slot is free again
    _no_leak(m)
    m.close()


def test_no_room_in_the_host_pool_means_miss_not_deferral(redis_url: str) -> None:
    keys = make_keys(3, b"nr")
    rec = make_records(4, RB, seed=4)
    with RedisTier(rec, NS, redis_url) as w:
        w.submit_store(1, keys, [0, 1, 2])
        assert w.drain(10)
    primary = CPUOffloadingManager(2)
    other = make_keys(2, b"pinned")
    out = primary.prepare_store(other, CTX)
    assert out is not None
    primary.complete_store(other, CTX)
    primary.prepare_load(other, CTX)  # both slots pinned: nothing can be evicted
    m = TieredManager(primary, [RedisTier(np.zeros((2, RB), np.uint8), NS, redis_url)], max_promoted_blocks=3)
    assert (_settle(m, keys) == LOOKUP_MISS).all()
    assert m.usage()[0].promotions_refused == 3
    primary.complete_load(other, CTX)
    _no_leak(m)
    m.close()


def test_two_tiers_fall_through_in_order(redis_url: str, tmp_path) -> None:  # noqa: ANN001
    keys = make_keys(2, b"ft")
    src = make_records(2, RB, seed=5)
    from kvoffload.tiers import DiskTier

    with DiskTier(src.copy(), NS, tmp_path / "disk") as d:
        d.submit_store(1, keys[1:], [1])
        assert d.drain(10)
    rec = np.zeros((4, RB), np.uint8)
    with RedisTier(src.copy(), NS, redis_url) as r:
        r.submit_store(1, keys[:1], [0])
        assert r.drain(10)
    m = TieredManager(CPUOffloadingManager(4), [RedisTier(rec, NS, redis_url), DiskTier(rec, NS, tmp_path / "disk")])
    assert (_settle(m, keys) == LOOKUP_HIT).all()
    assert [u.blocks_promoted for u in m.usage()] == [1, 1]
    spec = m.prepare_load(keys, CTX)
    np.testing.assert_array_equal(rec[spec.block_ids], src)
    m.complete_load(keys, CTX)
    _no_leak(m)
    m.close()


def test_write_pins_are_bounded_and_drops_counted(redis_url: str) -> None:
    keys = make_keys(6, b"cap")
    rec = np.zeros((8, RB), np.uint8)
    m = TieredManager(CPUOffloadingManager(8), [RedisTier(rec, NS, redis_url)], max_write_blocks=4)
    _store(m, keys[:4], rec, make_records(4, RB, seed=6))
    _store(m, keys[4:], rec, make_records(2, RB, seed=7))  # would pin 6 > 4: dropped
    assert m.usage()[0].writes_dropped == 2 and m.num_write_pinned() == 4
    _no_leak(m)
    m.close()


def test_one_probe_round_trip_per_step_whatever_the_number_of_keys(redis_server: RedisServer) -> None:
    redis_server.cli("flushall")
    proxy = TurnCountingProxy(redis_server.port)
    try:
        rec = np.zeros((4, RB), np.uint8)
        tier = RedisTier(rec, NS, proxy.url)
        m = TieredManager(CPUOffloadingManager(4), [tier], **ASYNC)
        _settle(m, make_keys(1, b"warm"))  # connection set-up
        for n_req, n_keys in ((1, 1), (4, 8), (16, 64)):
            turns, trips = proxy.turns, tier.stats().lookup_round_trips
            for r in range(n_req):  # one engine step: several requests' lookups
                m.lookup_batch(make_keys(n_keys, f"s{n_req}r{r}".encode()), ReqContext(f"r{r}"))
            m.end_step()
            assert tier.drain(10)
            assert (proxy.turns - turns, tier.stats().lookup_round_trips - trips) == (1, 1), (n_req, n_keys)
        m.close()
    finally:
        proxy.close()


def test_bad_arguments_are_typed_errors(redis_url: str) -> None:
    rec = np.zeros((2, RB), np.uint8)
    with pytest.raises(InvalidArgumentError, match="at least one tier"):
        TieredManager(CPUOffloadingManager(2), [])
    with pytest.raises(InvalidTypeError, match=r"tiers\[0\]"):
        TieredManager(CPUOffloadingManager(2), ["redis://x"])  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError, match="primary must be a CPUOffloadingManager"):
        TieredManager(object(), [])  # type: ignore[arg-type]
    t = RedisTier(rec, NS, redis_url)
    with pytest.raises(InvalidArgumentError, match="twice"):
        TieredManager(CPUOffloadingManager(2), [t, t])
    with pytest.raises(InvalidArgumentError, match="max_write_blocks"):
        TieredManager(CPUOffloadingManager(2), [t], max_write_blocks=0)
    t.close()


def test_the_readme_acl_is_enough(redis_server: RedisServer) -> None:
    """The least-privilege ACL user of docs/tiers.md can probe, write, read and delete (rejected values)."""
    redis_server.cli("flushall")
    redis_server.cli(
        "acl", "setuser", "kvoffload", "reset", "on", ">readme-pw", "~kvo:*", "-@all",
        "+get", "+set", "+exists", "+eval", "+strlen", "+getrange", "+del", "+ping", "+hello",
    )  # fmt: skip
    assert "kvoffload" in redis_server.cli("acl", "users")
    url = f"redis://kvoffload:readme-pw@127.0.0.1:{redis_server.port}"
    keys = make_keys(3, b"acl")
    src = make_records(3, RB, seed=9)
    rec = np.zeros((4, RB), np.uint8)
    a = TieredManager(CPUOffloadingManager(4), [RedisTier(rec, NS, url)])
    _store(a, keys, rec, src)
    _no_leak(a)
    assert a.usage()[0].blocks_written == 3 and a.tiers[0].stats().errors == 0
    a.close()
    rec_b = np.zeros((4, RB), np.uint8)
    b = TieredManager(CPUOffloadingManager(4), [RedisTier(rec_b, NS, url)], max_promoted_blocks=4)
    assert (_settle(b, keys) == LOOKUP_HIT).all()
    np.testing.assert_array_equal(rec_b[b.prepare_load(keys, CTX).block_ids], src)
    b.complete_load(keys, CTX)
    _no_leak(b)
    b.close()
    with RedisTier(rec_b, NS, url) as t:  # a corrupt value is deleted (compare-and-delete, a script)
        redis.Redis(port=redis_server.port).set(t.store_key(keys[0]), b"garbage")
        assert run_job(t, "load", 1, keys[:1], [0]) == (False,)
        st = t.stats()
        assert (st.corrupt, st.deleted_values, st.errors) == (1, 1, 0)
    redis_server.cli("acl", "deluser", "kvoffload")
