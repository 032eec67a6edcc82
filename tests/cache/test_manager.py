"""CPUOffloadingManager: a worked LRU scenario and the state machine of docs/contract.md §2."""

from __future__ import annotations

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import CPULoadStoreSpec, OffloadingEvent
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from tests.keys import CTX, k, ks


def slots(spec: object) -> list[int]:
    assert isinstance(spec, CPULoadStoreSpec)
    assert spec.block_ids.dtype == np.int64
    return spec.block_ids.tolist()


def test_worked_lru_scenario() -> None:
    m = CPUOffloadingManager(4, cache_policy="lru", enable_events=True)

    out = m.prepare_store(ks(1, 2), CTX)
    assert out is not None
    assert out.keys_to_store == ks(1, 2)
    assert slots(out.store_spec) == [0, 1]
    assert out.evicted_keys == []
    assert m.lookup(k(1), CTX) is None
    assert m.lookup(k(2), CTX) is None
    assert list(m.take_events()) == []

    m.complete_store(ks(1, 2), CTX)
    assert list(m.take_events()) == [OffloadingEvent(keys=ks(1, 2), medium="CPU", removed=False)]
    assert m.lookup(k(1), CTX) is True
    assert m.lookup(k(2), CTX) is True
    assert m.lookup(k(3), CTX) is False

    out = m.prepare_store(ks(2, 3, 4, 5), CTX)
    assert out is not None
    assert out.keys_to_store == ks(3, 4, 5)
    assert slots(out.store_spec) == [2, 3, 0]
    assert out.evicted_keys == ks(1)
    assert list(m.take_events()) == [OffloadingEvent(keys=ks(1), medium="CPU", removed=True)]

    assert m.prepare_store(ks(1, 6), CTX) is None
    assert list(m.take_events()) == []

    m.complete_store(ks(2, 3, 4, 5), CTX)
    assert list(m.take_events()) == [OffloadingEvent(keys=ks(3, 4, 5), medium="CPU", removed=False)]

    assert slots(m.prepare_load(ks(2, 3), CTX)) == [1, 2]
    assert m.prepare_store(ks(6, 7, 8), CTX) is None
    m.complete_load(ks(2, 3), CTX)

    out = m.prepare_store(ks(6, 7, 8), CTX)
    assert out is not None
    assert out.keys_to_store == ks(6, 7, 8)
    assert slots(out.store_spec) == [3, 2, 1]
    assert out.evicted_keys == ks(2, 3, 4)
    m.complete_store(ks(6, 7, 8), CTX)
    assert list(m.take_events()) == [
        OffloadingEvent(keys=ks(2, 3, 4), medium="CPU", removed=True),
        OffloadingEvent(keys=ks(6, 7, 8), medium="CPU", removed=False),
    ]

    m.touch(ks(5, 6, 7), CTX)
    out = m.prepare_store(ks(9), CTX)
    assert out is not None
    assert out.keys_to_store == ks(9)
    assert slots(out.store_spec) == [1]
    assert out.evicted_keys == ks(8)

    m.complete_store(ks(7, 9), CTX, success=False)
    assert m.lookup(k(7), CTX) is True
    assert m.lookup(k(9), CTX) is False
    assert list(m.take_events()) == [OffloadingEvent(keys=ks(8), medium="CPU", removed=True)]
    assert list(m.take_events()) == []
    # slot 1 went back to the free list and is reused first
    out = m.prepare_store(ks(10), CTX)
    assert out is not None and slots(out.store_spec) == [1]


def test_lookup_batch_matches_lookup() -> None:
    m = CPUOffloadingManager(8)
    m.prepare_store(ks(1, 2, 3), CTX)
    m.complete_store(ks(1, 3), CTX)
    q = ks(1, 2, 3, 4, 1, 4)
    codes = m.lookup_batch(q, CTX)
    assert codes.dtype == np.int8
    assert codes.tolist() == [LOOKUP_HIT, LOOKUP_PENDING, LOOKUP_HIT, LOOKUP_MISS, LOOKUP_HIT, LOOKUP_MISS]
    expect = [m.lookup(x, CTX) for x in q]
    assert expect == [True, None, True, False, True, False]
    assert m.lookup_batch([], CTX).tolist() == []
