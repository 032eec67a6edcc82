"""How a tier's step probe is answered, against a real ``redis-server``: on the engine thread
within ``probe_wait`` (a standalone server), by the lookup thread when the reply is late, and not
waited for at all once the tier's probes find nothing (``defer_hit_rate``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.testing.redis_server import RedisServer
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RedisTier
from tests.tiers.conftest import NS, make_records


def _count_thread_probes(t: RedisTier) -> list[int]:
    """Count the probes the lookup thread makes (``_probe``), wrapping the tier's own method."""
    calls = [0]
    probe: Callable[[list[bytes]], list[bool]] = t._probe

    def counted(keys: list[bytes]) -> list[bool]:
        calls[0] += 1
        return probe(keys)

    t._probe = counted  # type: ignore[method-assign]
    return calls


def test_probe_read_on_the_engine_thread_then_a_late_reply(redis_server: RedisServer, redis_url: str) -> None:
    recs = make_records(4, 4096, seed=31)
    keys = make_keys(2, b"in")
    with RedisTier(recs, NS, redis_url) as other:  # another engine's value: unknown to the tiers below
        assert run_job(other, "store", 1, keys[:1], [0]) == (True,)
    with RedisTier(recs, NS, redis_url, probe_wait=1.0, socket_timeout=10) as t:
        calls = _count_thread_probes(t)
        settle(t, make_keys(1, b"warm"))  # the lookup thread opened the connection as the tier started
        assert calls[0] == 0
        trips = t.stats().lookup_round_trips
        assert (t.lookup(keys) == LOOKUP_RETRY).all()
        t.end_step()  # sent and read here
        assert t.lookup(keys).tolist() == [LOOKUP_HIT, LOOKUP_MISS]
        assert calls[0] == 0 and t.stats().lookup_round_trips == trips + 1
    with RedisTier(recs, NS, redis_url, probe_wait=0.001, socket_timeout=10) as t:
        calls = _count_thread_probes(t)
        settle(t, make_keys(1, b"warm2"))
        late = [keys[0], make_keys(1, b"late")[0]]
        redis_server.cli("client", "pause", "1000", "ALL")  # the server answers nothing for 1 s
        assert (t.lookup(late) == LOOKUP_RETRY).all()
        t.end_step()  # sent; no reply within probe_wait: the lookup thread reads it
        assert (t.lookup(late) == LOOKUP_RETRY).all()
        assert settle(t, late).tolist() == [LOOKUP_HIT, LOOKUP_MISS]
        again = make_keys(1, b"again")
        assert settle(t, again).tolist() == [LOOKUP_MISS]  # the connection serves the next probes
        assert calls[0] == 0 and t.stats().errors == 0  # the late reply read, not probed again


def test_a_tier_that_finds_nothing_defers_no_request(redis_url: str) -> None:
    recs = make_records(4, 4096, seed=32)
    found = make_keys(40, b"found")
    with RedisTier(recs, NS, redis_url, defer_hit_rate=0.05) as t:
        assert t.hit_rate == 1.0 and (t.lookup(make_keys(1, b"cold")) == LOOKUP_RETRY).all()  # a new tier is asked
        assert (settle(t, make_keys(64, b"cold")) == LOOKUP_MISS).all()
        assert t.hit_rate < 0.05
        assert (t.lookup(found) == LOOKUP_MISS).all()  # no request waits on these probes...
        with RedisTier(recs, NS, redis_url) as other:  # ...another engine stores them meanwhile
            assert all(run_job(other, "store", 1, found, [i % 4 for i in range(40)]))
        t.end_step()
        assert t.drain(timeout=30)
        assert (t.lookup(found) == LOOKUP_HIT).all()  # ...yet they were probed
        assert t.hit_rate > 0.5
        assert (t.lookup(make_keys(1, b"next")) == LOOKUP_RETRY).all()  # probes find keys: deferring resumes
        np.testing.assert_array_equal(recs, make_records(4, 4096, seed=32))
    with RedisTier(recs, NS, redis_url, defer_hit_rate=0) as always:
        settle(always, make_keys(64, b"cold"))
        assert (always.lookup(make_keys(1, b"still")) == LOOKUP_RETRY).all()


@pytest.mark.parametrize(
    ("value", "error"),
    [(-0.1, InvalidArgumentError), (1.5, InvalidArgumentError), ("x", InvalidTypeError), (True, InvalidTypeError)],
)
def test_defer_hit_rate_checked(redis_url: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="defer_hit_rate"):
        RedisTier(make_records(1, 4096, seed=33), NS, redis_url, defer_hit_rate=value)  # type: ignore[arg-type]


def test_a_key_awaited_keeps_the_step_waiting_until_probed() -> None:
    """``end_step`` waits while a key answered RETRY is unprobed, not only in the step it was asked
    (a deferred request is not looked up again until its key resolves), and never for keys that
    answered a miss at once."""
    from kvoffload.tiers.verdicts import Verdicts

    v = Verdicts(ttl_steps=8, defer_hit_rate=0.05)
    a, b = make_keys(2, b"aw")
    assert v.answer([a], down=False).tolist() == [LOOKUP_RETRY] and v.deferred
    assert v.take_batch() == [a]
    assert v.deferred  # the next step: its probe is still out
    v.probed([a], [False])
    assert not v.deferred
    v.hit_rate = 0.0  # probes find nothing: unknown keys miss at once, no one waits
    assert v.answer([b], down=False).tolist() == [LOOKUP_MISS] and not v.deferred
    assert v.take_batch() == [b]  # yet it is probed
