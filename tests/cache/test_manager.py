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


def test_memo_never_takes_a_freed_slot_across_the_generation_wrap() -> None:
    """A slot's generation is the epoch (mod 2**32) it was last freed at: across the wrap of the
    epoch's low bits, a remembered slot freed again at an equal low value is still seen as freed."""
    m = CPUOffloadingManager(41)  # more keys than the manager's scalar path takes: the memo's path
    a, x, y, spare = ks(*range(40)), k(100), k(101), k(102)
    m.prepare_store([*a, spare], CTX)
    m.complete_store([*a, spare], CTX)
    assert m.discard([a[0]], CTX) == [a[0]]
    m.prepare_store([x], CTX)  # x takes a[0]'s slot
    m.complete_store([x], CTX)
    remembered = [x, *a[1:]]
    assert m.lookup_batch(remembered, CTX).tolist() == [LOOKUP_HIT] * 40
    freed_at = int(m.table.gen[m.table.index[x]])
    m.discard([spare], CTX)
    m.table.epoch = (1 << 32) - 1  # as after 2**32 - 1 insertions and frees
    for i in range(freed_at):  # one epoch each (an insertion, then its failure); the first wraps
        m.prepare_store([k(200 + i)], CTX) if i % 2 == 0 else m.complete_store([k(199 + i)], CTX, success=False)
    assert m.table.epoch & 0xFFFFFFFF == freed_at - 1
    assert m.discard([x], CTX) == [x]  # x's slot freed again at the same low value
    m.prepare_store([y], CTX)  # y reuses x's slot
    assert m.lookup_batch(remembered, CTX).tolist() == [LOOKUP_MISS] + [LOOKUP_HIT] * 39
