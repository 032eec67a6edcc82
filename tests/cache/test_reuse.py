"""FilteredReuseManager: vLLM's reuse counting plus the per-request counting fix (docs/contract.md §3)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.reuse import FilteredReuseManager
from kvoffload.core.base import (
    CPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from kvoffload.errors import InvalidArgumentError, InvalidTypeError


def k(i: int | str) -> bytes:
    return make_offload_key(str(i).encode(), 0)


def stored(out: PrepareStoreOutput | None) -> list[bytes]:
    assert out is not None
    return out.keys_to_store


class Recorder(OffloadingManager):
    """Backing that records every call (to check pass-through and contexts)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, object]] = []

    def lookup(self, key: bytes, req_context: ReqContext) -> bool | None:
        self.calls.append(("lookup", key, req_context))
        return False

    def prepare_load(self, keys: Iterable[bytes], req_context: ReqContext) -> LoadStoreSpec:
        self.calls.append(("prepare_load", list(keys), req_context))
        return CPULoadStoreSpec([])

    def touch(self, keys: Iterable[bytes], req_context: ReqContext) -> None:
        self.calls.append(("touch", list(keys), req_context))

    def complete_load(self, keys: Iterable[bytes], req_context: ReqContext) -> None:
        self.calls.append(("complete_load", list(keys), req_context))

    def prepare_store(self, keys: Iterable[bytes], req_context: ReqContext) -> PrepareStoreOutput | None:
        self.calls.append(("prepare_store", list(keys), req_context))
        return PrepareStoreOutput(list(keys), CPULoadStoreSpec([]), [])

    def complete_store(self, keys: Iterable[bytes], req_context: ReqContext, success: bool = True) -> None:
        self.calls.append(("complete_store", (list(keys), success), req_context))


def test_issue_scenario_threshold_2_tracker_3() -> None:
    m = FilteredReuseManager(CPUOffloadingManager(16), store_threshold=2, max_tracker_size=3)
    a = ReqContext(req_id="A")
    assert m.lookup(k(1), a) is False
    assert m.lookup(k(2), a) is False
    assert stored(m.prepare_store([k(1), k(2)], a)) == []  # both counted once, by lookup
    assert m.lookup(k(1), a) is False
    assert stored(m.prepare_store([k(1), k(2)], a)) == [k(1)]
    assert dict(m.counts) == {k(2): 1, k(1): 2}
    m.complete_store([k(1)], a)

    # a second prompt [x, y, z]; its prefix lookups stop at the first miss (x)
    x, y, z = k("x"), k("y"), k("z")
    b1 = ReqContext(req_id="B-visit-1")
    assert m.lookup(x, b1) is False
    assert stored(m.prepare_store([x, y, z], b1)) == []  # y, z counted here (the fix)
    assert list(m.counts) == [x, y, z]  # tracker of 3: keys 2 and 1 were forgotten, oldest first
    b2 = ReqContext(req_id="B-visit-2")
    assert m.lookup(x, b2) is False
    assert stored(m.prepare_store([x, y, z], b2)) == [x, y, z]
    assert dict(m.counts) == {x: 2, y: 2, z: 2}


def test_vllm_counting_without_request_id_stops_at_the_first_miss() -> None:
    """With an anonymous context prepare_store does not count: vLLM's behaviour."""
    m = FilteredReuseManager(CPUOffloadingManager(16), store_threshold=2)
    anon = ReqContext()
    for _ in range(3):
        m.lookup(k("x"), anon)
        out = m.prepare_store([k("x"), k("y")], anon)
        assert k("y") not in stored(out)


def test_prepare_store_counts_once_per_request() -> None:
    m = FilteredReuseManager(CPUOffloadingManager(16), store_threshold=2)
    r = ReqContext(req_id="r")
    for _ in range(4):  # retries / overlapping steps of the same request never recount
        assert stored(m.prepare_store([k(1), k(2)], r)) == []
    assert dict(m.counts) == {k(1): 1, k(2): 1}
    m.lookup(k(1), r)  # every lookup counts, even from a request that counted the key already
    assert m.counts[k(1)] == 2
    assert stored(m.prepare_store([k(1), k(2)], r)) == [k(1)]
    assert stored(m.prepare_store([k(2), k(3)], ReqContext(req_id="s"))) == [k(2)]


def test_lookup_batch_counts_every_occurrence_and_delegates() -> None:
    backing = CPUOffloadingManager(8)
    m = FilteredReuseManager(backing, store_threshold=2)
    r = ReqContext(req_id="r")
    codes = m.lookup_batch([k(1), k(2), k(1)], r)
    assert codes.dtype == np.int8 and codes.tolist() == [0, 0, 0]
    assert dict(m.counts) == {k(2): 1, k(1): 2}
    assert stored(m.prepare_store([k(1), k(2)], r)) == [k(1)]


def test_filtered_keys_take_no_capacity_and_empty_call_delegates() -> None:
    rec = Recorder()
    m = FilteredReuseManager(rec, store_threshold=3)
    ctx = ReqContext(req_id="q", kv_transfer_params={"x": 1})
    out = m.prepare_store([k(1), k(2)], ctx)
    assert out is not None and out.keys_to_store == []
    assert rec.calls == [("prepare_store", [], ctx)]
    stats_backing = CPUOffloadingManager(1)
    f = FilteredReuseManager(stats_backing, store_threshold=2)
    f.prepare_store([k(1)], ReqContext(req_id="a"))
    assert len(stats_backing) == 0
    assert f.get_stats().stores_skipped == 1
    assert f.get_stats().stores_skipped == 0


def test_everything_else_passes_through_with_its_context() -> None:
    rec = Recorder()
    m = FilteredReuseManager(rec)
    ctx = ReqContext(req_id="q", kv_transfer_params={"max_offload_tokens": 16})
    m.prepare_load([k(1)], ctx)
    m.touch([k(2)], ctx)
    m.complete_load([k(3)], ctx)
    m.complete_store([k(4)], ctx, success=False)
    m.lookup(k(5), ctx)
    assert rec.calls == [
        ("prepare_load", [k(1)], ctx),
        ("touch", [k(2)], ctx),
        ("complete_load", [k(3)], ctx),
        ("complete_store", ([k(4)], False), ctx),
        ("lookup", k(5), ctx),
    ]
    assert list(m.take_events()) == []
    assert m.get_stats() is None


def test_events_and_reset_pass_through() -> None:
    backing = CPUOffloadingManager(4, enable_events=True)
    m = FilteredReuseManager(backing, store_threshold=1)
    r = ReqContext(req_id="r")
    assert stored(m.prepare_store([k(1)], r)) == [k(1)]
    m.complete_store([k(1)], r)
    ev = list(m.take_events())
    assert len(ev) == 1 and ev[0].keys == [k(1)] and not ev[0].removed
    m.reset_cache()
    assert len(backing) == 0 and len(m.counts) == 0


def test_request_memory_is_bounded() -> None:
    m = FilteredReuseManager(CPUOffloadingManager(4), store_threshold=2, max_tracker_size=4)
    for i in range(50):
        m.prepare_store([k(f"{i}-a"), k(f"{i}-b")], ReqContext(req_id=f"r{i}"))
    assert len(m.counts) <= 4
    assert m._num_pairs <= 4 and len(m._by_request) <= 2


@pytest.mark.parametrize("size", [0, -1])
def test_tracker_size_below_one_is_a_value_error(size: int) -> None:
    with pytest.raises(ValueError, match="max_tracker_size"):
        FilteredReuseManager(CPUOffloadingManager(4), max_tracker_size=size)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidTypeError, match="max_tracker_size"):
        FilteredReuseManager(CPUOffloadingManager(4), max_tracker_size=True)
    with pytest.raises(InvalidTypeError, match="store_threshold"):
        FilteredReuseManager(CPUOffloadingManager(4), store_threshold=2.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="store_threshold"):
        FilteredReuseManager(CPUOffloadingManager(4), store_threshold=0)
    with pytest.raises(InvalidTypeError, match="backing"):
        FilteredReuseManager(object())  # type: ignore[arg-type]
    m = FilteredReuseManager(CPUOffloadingManager(4))
    r = ReqContext(req_id="r")
    with pytest.raises(InvalidTypeError):
        m.lookup("k", r)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        m.prepare_store([k(1), k(1)], r)
    with pytest.raises(InvalidTypeError):
        m.prepare_store([k(1), 5], r)  # type: ignore[list-item]
    assert len(m.counts) == 0 and len(m._by_request) == 0  # nothing counted by rejected calls
