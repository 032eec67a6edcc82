"""Conformance tests any kvoffload tier must pass (see :mod:`kvoffload.testing` for how to run them).

Parametrized by ``harness_name``: from ``--kvoffload-tier`` when :mod:`kvoffload.testing.plugin` is
loaded, else from ``KVOFFLOAD_TIER`` (comma-separated), else the built-in ``redis``,
``redis-cluster`` and ``disk`` harnesses (:mod:`kvoffload.testing.tier_harness`). The Redis
harnesses need Debian's ``redis-server``: skipped without it (failed with
``KVOFFLOAD_REQUIRE_REDIS=1``). The harness choice and the fixtures are
:mod:`kvoffload.testing.tier_suite`'s, imported here as this module's own.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.errors import InvalidArgumentError
from kvoffload.testing import tier_suite
from kvoffload.testing.tier_steps import make_keys
from kvoffload.testing.tier_suite import OTHER_NS, RB, Opener, records, run, settle
from kvoffload.tiers import Tier

# the suite's fixtures and parametrizing hook, as this module's own
harness, store = tier_suite.harness, tier_suite.store
pytest_generate_tests = tier_suite.pytest_generate_tests


# ---------------------------------------------------------------------------------------------- tests
def test_store_load_round_trip_bytes_exact(store: Opener) -> None:
    src, dst = records(8, 1), records(8, 2)
    before = dst.copy()
    ks = make_keys(5)
    a = store(src)
    assert run(a, "store", 1, ks, [3, 0, 7, 1, 5]) == (True,) * 5
    assert run(a, "store", 2, ks, [2, 2, 2, 2, 2]) == (True,) * 5  # present: left alone, ok
    b = store(dst)
    assert run(b, "load", 3, ks, [0, 1, 2, 3, 4]) == (True,) * 5
    np.testing.assert_array_equal(dst[:5], src[[3, 0, 7, 1, 5]])
    np.testing.assert_array_equal(dst[5:], before[5:])  # slots outside the job untouched
    st = b.stats()
    assert (st.blocks_read, st.bytes_read, st.read_failures) == (5, 5 * RB, 0)
    assert a.stats().blocks_written == 5 and a.stats().writes_skipped == 5


def test_lookup_verdicts_retry_then_hit_or_miss(store: Opener) -> None:
    src = records(4, 3)
    ks = make_keys(4)
    t = store(src, lookup_ttl_steps=2)
    run(t, "store", 1, ks[:2], [0, 1])
    assert (t.lookup(ks[:2]) == LOOKUP_HIT).all()  # a finished store is a known hit
    codes = t.lookup(ks[2:])
    assert (codes == LOOKUP_RETRY).all()  # unknown: queued for the step's probe
    assert (settle(t, ks) == [LOOKUP_HIT, LOOKUP_HIT, LOOKUP_MISS, LOOKUP_MISS]).all()
    other = store(records(4, 4))  # another engine stores ks[2]: seen once the miss expires
    run(other, "store", 2, ks[2:3], [0])
    t.end_step()
    t.end_step()
    assert (settle(t, ks[2:]) == [LOOKUP_HIT, LOOKUP_MISS]).all()


def test_probe_answered_within_the_step_it_was_sent(store: Opener) -> None:
    """``end_step`` waits up to ``probe_wait`` for the step's probe: the next step's lookups have the
    verdicts; a stalled store only delays them (``end_step`` returns, lookups answer RETRY)."""
    t = store(records(4, 22), probe_wait=1.0)
    run(t, "store", 1, make_keys(1), [0])
    other = make_keys(3, b"pw")
    assert (t.lookup(other) == LOOKUP_RETRY).all()
    t.end_step()
    assert (t.lookup(other) == LOOKUP_MISS).all()  # answered: no further step or drain needed
    if not store.harness.can_stall:
        return
    s = store(records(4, 23), probe_wait=0.05)
    settle(s, make_keys(1, b"warm"))
    store.harness.stall()
    late = make_keys(2, b"late")
    assert (s.lookup(late) == LOOKUP_RETRY).all()
    s.end_step()  # returns after probe_wait without the answer
    assert (s.lookup(late) == LOOKUP_RETRY).all()
    store.harness.resume()
    assert (settle(s, late) != LOOKUP_RETRY).all()


def test_probe_now_and_load_now_on_the_calling_thread(store: Opener) -> None:
    """``probe_now`` answers like ``lookup`` and may give verdicts within the call (a backend that
    can probe on the calling thread), never anything ``lookup`` would not; ``load_now`` moves bytes
    as a load job does, absent keys failing and slots outside it untouched."""
    src, dst = records(4, 24), records(4, 25)
    before = dst.copy()
    ks = make_keys(3, b"now")
    a = store(src)
    assert run(a, "store", 1, ks[:2], [2, 0]) == (True, True)
    b = store(dst, probe_wait=1.0)
    codes = b.probe_now(ks)
    assert set(codes.tolist()) <= {LOOKUP_RETRY, LOOKUP_HIT, LOOKUP_MISS}
    assert (settle(b, ks) == [LOOKUP_HIT, LOOKUP_HIT, LOOKUP_MISS]).all()
    known = b.probe_now(ks)  # verdicts known: no probe
    assert (known == [LOOKUP_HIT, LOOKUP_HIT, LOOKUP_MISS]).all()
    assert b.load_now(ks, [3, 1, 0]) == [True, True, False]
    np.testing.assert_array_equal(dst[[3, 1]], src[[2, 0]])
    np.testing.assert_array_equal(dst[2], before[2])  # outside the call
    assert b.stats().blocks_read == 2 and b.stats().read_failures == 1
    with pytest.raises(InvalidArgumentError):
        b.load_now(ks[:1], [4])  # no such slot


def test_one_round_trip_per_step_whatever_the_keys(store: Opener) -> None:
    t = store(records(2, 5))
    settle(t, make_keys(1, b"warm"))
    for n, tag in ((1, b"a"), (10, b"b"), (300, b"c")):
        before = t.stats().lookup_round_trips
        ks = make_keys(n, tag)
        for part in range(0, n, max(1, n // 3)):  # several lookup calls in one step
            t.lookup(ks[part : part + max(1, n // 3)])
        t.end_step()
        assert t.drain(timeout=30.0)
        assert (t.lookup(ks) == LOOKUP_MISS).all()
        assert t.stats().lookup_round_trips - before == 1, n
    before = t.stats().lookup_round_trips
    t.end_step()  # nothing queued: no probe
    assert t.drain(timeout=30.0) and t.stats().lookup_round_trips == before


def test_partial_success_per_key(store: Opener) -> None:
    src = records(6, 6)
    ks = make_keys(3)
    t = store(src)
    assert run(t, "store", 1, ks, [0, 1, 2]) == (True,) * 3
    store.harness.delete_raw(t, ks[1])  # deleted by another client / evicted by the store
    ok = run(t, "load", 2, ks, [3, 4, 5])
    assert ok == (True, False, True)
    np.testing.assert_array_equal(src[[3, 5]], src[[0, 2]])
    st = t.stats()
    assert (st.read_failures, st.absent, st.rejected_values) == (1, 1, 0)  # absent: not a rejection
    assert t.lookup(ks[1:2])[0] == LOOKUP_MISS  # the failed load is a known miss


def test_namespace_rejection(store: Opener) -> None:
    ks = make_keys(2)
    a = store(records(4, 7), OTHER_NS)
    run(a, "store", 1, ks, [0, 1])
    b = store(records(4, 8))
    assert (settle(b, ks) == LOOKUP_MISS).all()  # another namespace's values are not seen
    foreign = store.harness.read_raw(a, ks[0])
    assert foreign is not None
    store.harness.write_raw(b, ks[0], foreign)  # ...nor used when found under this namespace's name
    before = b.records.copy()
    assert run(b, "load", 2, ks[:1], [2]) == (False,)
    st = b.stats()
    assert (st.rejected_values, st.rejected_namespace, st.deleted_values) == (1, 1, 1)
    assert store.harness.read_raw(b, ks[0]) is None  # deleted: wrong for every reader
    np.testing.assert_array_equal(b.records[[0, 1, 3]], before[[0, 1, 3]])


@pytest.mark.parametrize("fault", ["flipped-byte", "truncated", "other-key", "no-mac"])
def test_integrity_rejection(store: Opener, fault: str) -> None:
    secret = b"conformance-secret-0123456789"
    src = records(4, 9)
    ks = make_keys(2)
    t = store(src, integrity_key=secret)
    run(t, "store", 1, ks, [0, 1])
    good = store.harness.read_raw(t, ks[0])
    assert good is not None
    if fault == "flipped-byte":
        bad = bytearray(good)
        bad[-7] ^= 0x10
        value = bytes(bad)
    elif fault == "truncated":
        value = good[: len(good) - 100]
    elif fault == "other-key":
        other = store.harness.read_raw(t, ks[1])
        assert other is not None
        value = other
    else:  # a value without a MAC, written by a tier without the key
        store.harness.delete_raw(t, ks[0])
        plain = store(records(4, 10))
        assert run(plain, "store", 2, ks[:1], [0]) == (True,)
        value = b""
    if value:
        store.harness.write_raw(t, ks[0], value)
    assert run(t, "load", 3, ks, [2, 3]) == (False, True)
    np.testing.assert_array_equal(src[3], src[1])
    st = t.stats()
    kind = "corrupt" if fault in ("truncated", "other-key") else "rejected_integrity"
    assert st.rejected_values == getattr(st, kind) == 1, st
    # a damaged value is deleted; one this reader's keys cannot verify may be good for another reader
    assert (store.harness.read_raw(t, ks[0]) is None) == (kind == "corrupt")


def test_integrity_key_rotation(store: Opener) -> None:
    """Readers holding the new and the old key accept values signed with either; a reader with the
    new key only refuses the old values (counted, not deleted)."""
    old_key, new_key = b"conformance-old-key-0123456789", b"conformance-new-key-0123456789"
    src = records(4, 18)
    ks = make_keys(2)
    old = store(src, integrity_key=old_key)
    run(old, "store", 1, ks[:1], [0])
    rotated = store(records(4, 19), integrity_key=[new_key, old_key])
    run(rotated, "store", 2, ks[1:], [1])  # signed with the new key
    dst = records(4, 20)
    both = store(dst, integrity_key=[new_key, old_key])
    assert run(both, "load", 3, ks, [0, 1]) == (True, True)
    np.testing.assert_array_equal(dst[0], src[0])
    only_new = store(records(4, 21), integrity_key=new_key)
    assert run(only_new, "load", 4, ks, [0, 1]) == (False, True)
    st = only_new.stats()
    assert (st.rejected_integrity, st.deleted_values) == (1, 0)
    assert store.harness.read_raw(only_new, ks[0]) is not None


def test_concurrent_writers_of_one_key(store: Opener) -> None:
    """Two engines store different bytes under one key at once: both report ok, and every later
    load gets exactly one writer's bytes, never a mix."""
    ks = make_keys(16)
    a_src, b_src = records(16, 11), records(16, 12)
    a, b = store(a_src, io_threads=4, batch_keys=1), store(b_src, io_threads=4, batch_keys=1)
    go = threading.Barrier(2)

    def submit(t: Tier, job: int) -> None:
        go.wait()
        t.submit_store(job, ks, list(range(16)))

    threads = [threading.Thread(target=submit, args=(t, j)) for t, j in ((a, 1), (b, 2))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in (a, b):
        assert t.drain(timeout=60.0)
        (res,) = t.get_finished()
        assert res.success
    dst = records(16, 13)
    c = store(dst)
    assert run(c, "load", 3, ks, list(range(16))) == (True,) * 16
    for i in range(16):
        assert np.array_equal(dst[i], a_src[i]) or np.array_equal(dst[i], b_src[i]), i
    written = a.stats().blocks_written + b.stats().blocks_written
    assert written >= 16 and a.stats().writes_skipped + b.stats().writes_skipped == 32 - written


def test_drain_and_close(store: Opener) -> None:
    src = records(8, 14)
    ks = make_keys(8)
    t = store(src)
    t.submit_store(1, ks[:4], [0, 1, 2, 3])
    t.submit_store(2, ks[4:], [4, 5, 6, 7])
    assert t.drain(timeout=60.0)
    assert sorted(r.job_id for r in t.get_finished()) == [1, 2]
    t.submit_load(3, ks, [7, 6, 5, 4, 3, 2, 1, 0])
    t.close()  # waits for the load
    t.close()  # idempotent
    (res,) = t.get_finished()
    assert res.job_id == 3 and res.success
    np.testing.assert_array_equal(src, records(8, 14)[::-1])
    with pytest.raises(InvalidArgumentError, match="closed"):
        t.submit_store(4, ks[:1], [0])


def test_back_pressure_drops_stores_beyond_the_write_budget(store: Opener) -> None:
    t = store(records(8, 15), max_pending_write_bytes=3 * RB)
    t.submit_store(1, make_keys(4, b"big"), [0, 1, 2, 3])  # more than the budget: dropped at once
    (res,) = t.get_finished()
    assert res.ok == (False,) * 4 and t.stats().dropped_writes == 4
    assert run(t, "store", 2, make_keys(3), [0, 1, 2]) == (True,) * 3  # within it: stored
    if not store.harness.can_stall:
        return
    store.harness.stall()
    t.submit_store(3, make_keys(2, b"a"), [3, 4])  # accepted: its bytes stay pending
    t.submit_store(4, make_keys(2, b"b"), [5, 6])  # the budget is full: dropped at once
    done = t.get_finished()
    assert [(r.job_id, r.ok) for r in done] == [(4, (False, False))]
    store.harness.resume()
    assert t.drain(timeout=60.0)


def test_store_goes_away_and_comes_back(store: Opener) -> None:
    h = store.harness
    if not h.can_go_away:
        pytest.skip(f"{type(h).__name__} cannot take its store away")
    src = records(16, 16)
    ks = make_keys(8)
    t = store(src, **h.fault_options)
    assert run(t, "store", 1, ks, list(range(8))) == (True,) * 8
    before = src.copy()
    h.go_away()
    try:
        ok = run(t, "load", 2, ks, list(range(8, 16)))
        assert not all(ok), "every key loaded from a store that went away"
        for i, good in enumerate(ok):  # a loaded key holds exactly its bytes
            if good:
                np.testing.assert_array_equal(src[8 + i], before[i])
        t.lookup(make_keys(4, b"gone"))  # never raises, never blocks
        t.end_step()
        t.submit_store(3, make_keys(2, b"while-gone"), [0, 1])
        assert t.drain(timeout=60.0)
        t.get_finished()
    finally:
        h.come_back()
    fresh = make_keys(3, b"fresh")
    deadline = time.monotonic() + 30.0
    while True:  # after the back-off, the tier is used again
        if run(t, "store", 10 + int(time.monotonic() * 1000) % 10**6, fresh, [0, 1, 2]) == (True,) * 3:
            break
        assert time.monotonic() < deadline, "the tier did not recover"
        time.sleep(0.1)
    assert run(t, "load", 5, fresh, [8, 9, 10]) == (True,) * 3
    np.testing.assert_array_equal(src[8:11], src[0:3])


def test_store_moves_while_in_use(store: Opener) -> None:
    """The store moves the values (a reshard): half way, then all the way. Every value is found
    and loads byte-exact through both, stores made meanwhile land, nothing is deleted."""
    h = store.harness
    if not h.can_move:
        pytest.skip(f"{type(h).__name__} cannot move its values")
    src = records(24, 18)
    ks = make_keys(6, b"move")
    t = store(src)
    assert run(t, "store", 1, ks, list(range(6))) == (True,) * 6
    new = {True: make_keys(3, b"mid-move"), False: make_keys(3, b"moved")}
    for job, half in enumerate((True, False)):
        h.move(t, ks, half)
        reader = store(records(24, 19))  # no verdicts cached: every key probed
        assert (settle(reader, ks) == LOOKUP_HIT).all()
        assert run(reader, "load", 10 + job, ks, list(range(6))) == (True,) * 6
        np.testing.assert_array_equal(reader.records[:6], src[:6])  # type: ignore[index]
        assert run(t, "store", 20 + job, new[half], [0, 1, 2]) == (True,) * 3
        assert run(reader, "load", 30 + job, new[half], [6, 7, 8]) == (True,) * 3
        np.testing.assert_array_equal(reader.records[6:9], src[:3])  # type: ignore[index]
        assert run(t, "load", 40 + job, ks, list(range(12, 18))) == (True,) * 6  # t knew the old places
        np.testing.assert_array_equal(src[12:18], src[:6])
        st = reader.stats()
        assert st.deleted_values == st.rejected_values == st.read_failures == 0
    st = t.stats()
    assert st.write_failures == st.dropped_writes == st.deleted_values == st.read_failures == 0


def test_records_outside_jobs_never_change(store: Opener) -> None:
    """A tier writes only the slots its loads name, and stores never write the records."""
    src = records(6, 17)
    before = src.copy()
    t = store(src)
    ks = make_keys(2)
    run(t, "store", 1, ks, [0, 1])
    settle(t, ks + make_keys(3, b"absent"))
    np.testing.assert_array_equal(src, before)
    run(t, "load", 2, ks + make_keys(1, b"absent"), [4, 5, 3])
    np.testing.assert_array_equal(src[[0, 1, 2]], before[[0, 1, 2]])
    np.testing.assert_array_equal(src[[4, 5]], before[[0, 1]])
