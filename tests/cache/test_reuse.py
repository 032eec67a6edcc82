"""The manager's reuse filter (``store_threshold``): vLLM's reuse counting plus the per-request
counting fix (docs/contract.md §3)."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import PrepareStoreOutput, ReqContext
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.keys import k


def stored(out: PrepareStoreOutput | None) -> list[bytes]:
    assert out is not None
    return out.keys_to_store


def filtered(num_blocks: int = 16, **kw: object) -> CPUOffloadingManager:
    return CPUOffloadingManager(num_blocks, store_threshold=kw.pop("store_threshold", 2), **kw)  # type: ignore[arg-type]


def counts(m: CPUOffloadingManager) -> dict[bytes, int]:
    assert m.reuse is not None
    return dict(m.reuse.counts)


def test_issue_scenario_threshold_2_tracker_3() -> None:
    m = filtered(max_tracker_size=3)
    a = ReqContext(req_id="A")
    assert m.lookup(k(1), a) is False
    assert m.lookup(k(2), a) is False
    assert stored(m.prepare_store([k(1), k(2)], a)) == []  # both counted once, by lookup
    assert m.lookup(k(1), a) is False
    assert stored(m.prepare_store([k(1), k(2)], a)) == [k(1)]
    assert counts(m) == {k(2): 1, k(1): 2}
    m.complete_store([k(1)], a)

    # a second prompt [x, y, z]; its prefix lookups stop at the first miss (x)
    x, y, z = k("x"), k("y"), k("z")
    b1 = ReqContext(req_id="B-visit-1")
    assert m.lookup(x, b1) is False
    assert stored(m.prepare_store([x, y, z], b1)) == []  # y, z counted here (the fix)
    assert list(counts(m)) == [x, y, z]  # tracker of 3: keys 2 and 1 were forgotten, oldest first
    b2 = ReqContext(req_id="B-visit-2")
    assert m.lookup(x, b2) is False
    assert stored(m.prepare_store([x, y, z], b2)) == [x, y, z]
    assert counts(m) == {x: 2, y: 2, z: 2}


def test_vllm_counting_without_request_id_stops_at_the_first_miss() -> None:
    """With an anonymous context prepare_store does not count: vLLM's behaviour."""
    m = filtered()
    anon = ReqContext()
    for _ in range(3):
        m.lookup(k("x"), anon)
        out = m.prepare_store([k("x"), k("y")], anon)
        assert k("y") not in stored(out)


def test_prepare_store_counts_once_per_request() -> None:
    m = filtered()
    r = ReqContext(req_id="r")
    for _ in range(4):  # retries / overlapping steps of the same request never recount
        assert stored(m.prepare_store([k(1), k(2)], r)) == []
    assert counts(m) == {k(1): 1, k(2): 1}
    m.lookup(k(1), r)  # every lookup counts, even from a request that counted the key already
    assert counts(m)[k(1)] == 2
    assert stored(m.prepare_store([k(1), k(2)], r)) == [k(1)]
    assert stored(m.prepare_store([k(2), k(3)], ReqContext(req_id="s"))) == [k(2)]


def test_lookup_batch_counts_every_occurrence_and_delegates() -> None:
    m = filtered(8)
    r = ReqContext(req_id="r")
    codes = m.lookup_batch([k(1), k(2), k(1)], r)
    assert codes.dtype == np.int8 and codes.tolist() == [0, 0, 0]
    assert counts(m) == {k(2): 1, k(1): 2}
    assert stored(m.prepare_store([k(1), k(2)], r)) == [k(1)]


def test_filtered_keys_take_no_capacity_and_count_as_skipped() -> None:
    m = filtered(store_threshold=3)
    out = m.prepare_store([k(1), k(2)], ReqContext(req_id="q", kv_transfer_params={"x": 1}))
    assert out is not None and out.keys_to_store == [] and len(m) == 0
    f = filtered(1)
    f.prepare_store([k(1)], ReqContext(req_id="a"))
    assert len(f) == 0
    assert f.get_stats().stores_skipped == 1
    assert f.get_stats().stores_skipped == 0


def test_stored_keys_are_never_filtered_and_are_protected() -> None:
    m = filtered(2, store_threshold=2)
    r = ReqContext(req_id="r")
    m.lookup_batch([k(1), k(2)], r)
    m.lookup_batch([k(1), k(2)], r)
    m.complete_store(stored(m.prepare_store([k(1), k(2)], r)), r)
    m.lookup(k(3), r)
    m.lookup(k(3), r)
    out = m.prepare_store([k(1), k(3)], r)  # k(1) stored (below threshold would not matter): protected
    assert out is not None and out.keys_to_store == [k(3)] and out.evicted_keys == [k(2)]


def test_events_pass_and_reset_keeps_the_counts_as_vllm() -> None:
    m = filtered(4, store_threshold=1, enable_events=True)
    r = ReqContext(req_id="r")
    assert stored(m.prepare_store([k(1)], r)) == [k(1)]
    m.complete_store([k(1)], r)
    ev = list(m.take_events())
    assert len(ev) == 1 and ev[0].keys == [k(1)] and not ev[0].removed
    m.reset_cache()
    assert len(m) == 0 and counts(m) == {k(1): 1}


def test_request_memory_is_bounded() -> None:
    m = filtered(4, max_tracker_size=4)
    for i in range(50):
        m.prepare_store([k(f"{i}-a"), k(f"{i}-b")], ReqContext(req_id=f"r{i}"))
    assert m.reuse is not None and len(m.reuse.counts) <= 4
    assert m.reuse._num_pairs <= 4 and len(m.reuse._by_request) <= 2


@pytest.mark.parametrize("size", [0, -1])
def test_tracker_size_below_one_is_a_value_error(size: int) -> None:
    with pytest.raises(ValueError, match="max_tracker_size"):
        filtered(4, max_tracker_size=size)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidTypeError, match="max_tracker_size"):
        filtered(4, max_tracker_size=True)
    with pytest.raises(InvalidTypeError, match="store_threshold"):
        filtered(4, store_threshold=2.0)
    with pytest.raises(InvalidArgumentError, match="store_threshold"):
        filtered(4, store_threshold=0)
    m = filtered(4)
    r = ReqContext(req_id="r")
    with pytest.raises(InvalidTypeError):
        m.lookup("k", r)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        m.prepare_store([k(1), k(1)], r)
    with pytest.raises(InvalidTypeError):
        m.prepare_store([k(1), 5], r)  # type: ignore[list-item]
    assert counts(m) == {} and m.reuse is not None and len(m.reuse._by_request) == 0  # rejected: nothing counted
