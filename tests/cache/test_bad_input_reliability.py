"""Bad input found by the reliability review (issue 12, items 3 and 5), offload side.

Every case must raise a ``KVOffloadError`` that is also a ``ValueError``/``TypeError``, name the
argument, and leave the object exactly as it was.
"""

from __future__ import annotations

import copy
from abc import ABC
from dataclasses import dataclass

import numpy as np
import pytest

from kvoffload.cache import policies
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.policies.base import CachePolicy, get_policy_class, register_policy
from kvoffload.cache.policies.lru import LRUPolicy
from kvoffload.cache.reuse import FilteredReuseManager
from kvoffload.core.base import (
    CPULoadStoreSpec,
    GPULoadStoreSpec,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_keys,
)
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, KeyStateError, KVOffloadError
from tests.cache.test_manager_errors import snapshot

CTX = ReqContext(req_id="r")
#: group-0 keys end in four NUL bytes, which numpy's fixed-width bytes dtype strips
K0 = [make_offload_key(b"hash%04d" % i, 0) for i in range(40)]
#: group-1 keys survive a numpy round trip unchanged
K1 = [make_offload_key(b"hash%04d" % i, 1) for i in range(40)]


def busy_manager() -> CPUOffloadingManager:
    m = CPUOffloadingManager(8, enable_events=True)
    m.prepare_store(K0[:3] + K1[:2], CTX)
    m.complete_store(K0[:2] + K1[:2], CTX)
    m.prepare_load([K0[0]], CTX)
    return m


# ------------------------------------------------------------------ item 3: numpy bytes as keys
def test_numpy_array_strips_the_nul_bytes_of_group_0_keys() -> None:
    # the premise of the bug: np.bytes_ subclasses bytes but is not the same key
    arr = np.array(K0[:2])
    assert isinstance(arr[0], bytes) and arr[0] != K0[0] and arr[0] + b"\0\0\0\0" == K0[0]


def test_store_of_a_numpy_key_array_is_rejected_instead_of_leaking_pending_slots() -> None:
    """The review's scenario: prepare_store(np.array(keys)) stored truncated keys, the caller's
    complete_store(keys) was ignored and the slots stayed pending forever."""
    m = CPUOffloadingManager(8)
    with pytest.raises(InvalidTypeError, match="keys"):
        m.prepare_store(np.array(K0[:4]), CTX)
    assert len(m) == 0 and m.get_stats().num_pending == 0
    out = m.prepare_store(K0[:4], CTX)
    assert out is not None
    m.complete_store(K0[:4], CTX)
    assert m.get_stats().num_pending == 0 and all(m.lookup(k, CTX) for k in K0[:4])


MANAGER_METHODS = ["prepare_store", "complete_store", "prepare_load", "complete_load", "touch", "lookup_batch"]


@pytest.mark.parametrize("method", MANAGER_METHODS)
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda ks: np.array(ks), id="ndarray"),
        pytest.param(lambda ks: list(np.array(ks)), id="list-small"),  # the scalar fast paths
        pytest.param(lambda ks: list(np.array(ks)) + list(np.array(K0[8:40])), id="list-large"),  # > SMALL_BATCH
        pytest.param(lambda ks: [np.bytes_(ks[1])], id="one-absent-key"),
    ],
)
def test_numpy_bytes_keys_rejected_by_every_manager_method(method: str, make) -> None:
    m = busy_manager()
    before = snapshot(m)
    with pytest.raises(InvalidTypeError, match=r"keys.*(numpy|bytes)"):
        getattr(m, method)(make(K0[2:4]), CTX)
    assert snapshot(m) == before


def test_numpy_key_array_rejected_even_where_it_happens_to_be_lossless() -> None:
    # group-1 keys survive numpy unchanged, but a numpy bytes array is refused as a whole: the
    # same call must not work for one group and corrupt another
    m = busy_manager()
    before = snapshot(m)
    for method in MANAGER_METHODS:
        with pytest.raises(InvalidTypeError, match="numpy"):
            getattr(m, method)(np.array(K1[:2]), CTX)
    assert snapshot(m) == before


def test_lookup_of_a_truncated_numpy_key() -> None:
    m = busy_manager()
    before = snapshot(m)
    with pytest.raises(InvalidTypeError, match="key"):
        m.lookup(np.array(K0[:1])[0], CTX)
    with pytest.raises(InvalidTypeError, match="key"):
        CPUOffloadingManager.lookup(m, np.bytes_(K0[5]), CTX)  # the method, not the closure
    assert snapshot(m) == before


class OtherBytes(bytes):
    pass


@pytest.mark.parametrize("bad", [np.bytes_(b"abc\0\0\0\0"), OtherBytes(b"abcd\0\0\0\0")])
def test_key_helpers_want_exactly_bytes(bad: bytes) -> None:
    with pytest.raises(InvalidTypeError, match=r"keys\[1\]"):
        validate_keys([K0[0], bad])
    with pytest.raises(InvalidTypeError, match="block_hash"):
        make_offload_key(bad, 0)
    with pytest.raises(InvalidTypeError, match="key"):
        get_offload_group_idx(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="key"):
        get_offload_block_hash(bad)  # type: ignore[arg-type]


def test_a_bytes_subclass_is_never_stored() -> None:
    m = CPUOffloadingManager(4)
    with pytest.raises(InvalidTypeError, match=r"keys\[0\]"):
        m.prepare_store([OtherBytes(K0[0])], CTX)
    assert len(m) == 0


def reuse_state(f: FilteredReuseManager) -> object:
    return (list(f.counts.items()), [(r, sorted(s)) for r, s in f._by_request.items()], f._num_pairs, f._skipped)


@pytest.mark.parametrize(
    "call",
    [
        lambda f: f.lookup(np.bytes_(K0[5]), CTX),
        lambda f: f.lookup_batch(np.array(K0[5:7]), CTX),
        lambda f: f.lookup_batch(list(np.array(K0[5:7])), CTX),
        lambda f: f.prepare_store(np.array(K0[5:7]), CTX),
        lambda f: f.prepare_store(list(np.array(K0[5:7])), CTX),
    ],
)
def test_reuse_filter_rejects_numpy_keys_without_counting(call) -> None:
    f = FilteredReuseManager(CPUOffloadingManager(8), store_threshold=1)
    f.lookup(K0[0], CTX)
    before = reuse_state(f)
    with pytest.raises(InvalidTypeError, match="key"):
        call(f)
    assert reuse_state(f) == before and len(f.backing) == 0  # type: ignore[arg-type]


# ------------------------------------------------------------------ item 5: req_context
@dataclass
class EngineContext:
    """An engine's own context class (like vLLM's ReqContext): not a subclass of ours."""

    req_id: object


BAD_CONTEXTS = ["r", None, {"req_id": "r"}, 5, ReqContext, EngineContext(5), EngineContext(None)]


@pytest.mark.parametrize("ctx", BAD_CONTEXTS)
@pytest.mark.parametrize("method", MANAGER_METHODS + ["lookup"])
def test_manager_rejects_a_req_context_that_is_not_one(method: str, ctx: object) -> None:
    m = busy_manager()
    before = snapshot(m)
    stats_before = copy.deepcopy(vars(m.get_stats()))
    arg = K0[2] if method == "lookup" else [K0[2], K1[5]]
    if method in ("prepare_load", "complete_load"):
        arg = [K0[0]] if method == "complete_load" else [K0[1]]
    with pytest.raises(InvalidTypeError, match="req_context"):
        getattr(m, method)(arg, ctx)
    assert snapshot(m) == before
    assert vars(m.get_stats()) == {**stats_before, **{k: 0 for k in stats_before if k not in _GAUGES}}


_GAUGES = {"num_blocks", "num_used", "num_pending", "num_pinned", "usage", "write_usage"}


def test_req_context_subclass_and_engine_context_are_accepted() -> None:
    class MyContext(ReqContext):
        pass

    m = CPUOffloadingManager(4)
    assert m.prepare_store(K0[:2], MyContext("x")) is not None
    assert m.lookup(K0[0], MyContext("x")) is None
    f = FilteredReuseManager(m, store_threshold=1)
    assert f.lookup(K0[2], EngineContext("y")) is False
    out = f.prepare_store([K0[2], K0[3]], EngineContext("y"))  # K0[3] counted once by request "y" here
    assert out is not None and out.keys_to_store == [K0[2], K0[3]]
    f.complete_store(out.keys_to_store, EngineContext("y"))
    assert f.lookup_batch(K0[:4], EngineContext("z")).tolist() == [2, 2, 1, 1]  # K0[:2] still pending


REUSE_CALLS = {
    "lookup": lambda f, c: f.lookup(K0[3], c),
    "lookup_batch": lambda f, c: f.lookup_batch([K0[3]], c),
    "prepare_store": lambda f, c: f.prepare_store([K0[3]], c),
    "complete_store": lambda f, c: f.complete_store([K0[0]], c),
    "prepare_load": lambda f, c: f.prepare_load([K0[0]], c),
    "complete_load": lambda f, c: f.complete_load([K0[0]], c),
    "touch": lambda f, c: f.touch([K0[0]], c),
}


@pytest.mark.parametrize("ctx", BAD_CONTEXTS)
@pytest.mark.parametrize("method", sorted(REUSE_CALLS))
def test_reuse_filter_rejects_a_req_context_that_is_not_one(method: str, ctx: object) -> None:
    backing = CPUOffloadingManager(8)
    f = FilteredReuseManager(backing, store_threshold=1)
    f.lookup(K0[0], CTX)
    f.prepare_store([K0[0]], CTX)
    f.complete_store([K0[0]], CTX)
    before, mb = reuse_state(f), snapshot(backing)
    with pytest.raises(InvalidTypeError, match="req_context"):
        REUSE_CALLS[method](f, ctx)
    assert reuse_state(f) == before and snapshot(backing) == mb


# ------------------------------------------------------------------ item 5: reuse filter atomicity
class Refusing(CPUOffloadingManager):
    """A backing manager that refuses every call after its own checks (e.g. it was shut down)."""

    def lookup(self, key, req_context):  # type: ignore[override]
        raise KeyStateError("refused")

    def lookup_batch(self, keys, req_context):  # type: ignore[override]
        raise KeyStateError("refused")

    def prepare_store(self, keys, req_context):  # type: ignore[override]
        raise KeyStateError("refused")


@pytest.mark.parametrize("method", ["lookup", "lookup_batch", "prepare_store"])
def test_reuse_filter_counts_nothing_when_the_backing_raises(method: str) -> None:
    f = FilteredReuseManager(Refusing(8), store_threshold=2, max_tracker_size=3)
    f.counts.update({K0[0]: 1, K0[1]: 1, K0[2]: 1})  # a full tracker: counting would evict
    before = reuse_state(f)
    with pytest.raises(KeyStateError, match="refused"):
        REUSE_CALLS[method](f, ReqContext("other"))
    assert reuse_state(f) == before


def test_reuse_filter_counts_nothing_when_the_real_backing_is_shut_down() -> None:
    backing = CPUOffloadingManager(8)
    f = FilteredReuseManager(backing, store_threshold=2)
    f.lookup(K0[0], CTX)
    backing.shutdown()
    before = reuse_state(f)
    for method in ("lookup", "lookup_batch", "prepare_store"):
        with pytest.raises(KeyStateError):
            REUSE_CALLS[method](f, ReqContext("late"))
    assert reuse_state(f) == before


def test_reuse_filter_still_counts_and_filters_after_a_successful_call() -> None:
    # the counting moved after the delegation: check the semantics did not change
    backing = CPUOffloadingManager(8)
    f = FilteredReuseManager(backing, store_threshold=2)
    assert f.lookup(K0[0], ReqContext("a")) is False
    out = f.prepare_store(K0[:2], ReqContext("a"))  # K0[0] counted once (lookup), K0[1] counted now
    assert out is not None and out.keys_to_store == []
    f.lookup_batch(K0[:2], ReqContext("b"))
    out = f.prepare_store(K0[:3], ReqContext("b"))  # K0[0]: 2, K0[1]: 2, K0[2]: 1
    assert out is not None and out.keys_to_store == K0[:2]
    assert f.counts == {K0[0]: 2, K0[1]: 2, K0[2]: 1}


# ------------------------------------------------------------------ item 5: load/store specs
@pytest.mark.parametrize(
    "build,name",
    [
        (lambda: CPULoadStoreSpec([2**70]), r"block_ids\[0\]"),
        (lambda: CPULoadStoreSpec([1, 2**63]), r"block_ids\[1\]"),
        (lambda: GPULoadStoreSpec([0, 2**70], [2]), r"block_ids\[1\]"),
        (lambda: GPULoadStoreSpec([1], [2**70]), r"group_sizes\[0\]"),
        (lambda: GPULoadStoreSpec([1], [1], [2**70]), r"block_indices\[0\]"),
        (lambda: CPULoadStoreSpec(np.array([2**63], dtype=np.uint64)), "block_ids"),
        (lambda: CPULoadStoreSpec([np.uint64(2**63)]), r"block_ids\[0\]"),
        (lambda: GPULoadStoreSpec([1], np.array([2**64 - 1], dtype=np.uint64)), "group_sizes"),
    ],
)
def test_spec_ids_beyond_int64_are_a_typed_error(build, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name) as info:
        build()
    assert "-92233720" not in str(info.value)  # no wrapped-around value
    assert "2**63 - 1" in str(info.value) or "9223372036854775807" in str(info.value)


def test_uint64_id_is_reported_with_its_value() -> None:
    with pytest.raises(InvalidArgumentError, match=r"(?<!-)9223372036854775808"):
        CPULoadStoreSpec(np.array([5, 2**63], dtype=np.uint64))
    assert CPULoadStoreSpec(np.array([5, 2**63 - 1], dtype=np.uint64)).block_ids.tolist() == [5, 2**63 - 1]


@pytest.mark.parametrize(
    "build,name",
    [
        (lambda: CPULoadStoreSpec(None), "block_ids"),
        (lambda: CPULoadStoreSpec(5), "block_ids"),
        (lambda: CPULoadStoreSpec("12"), "block_ids"),
        (lambda: CPULoadStoreSpec(b"\x01"), "block_ids"),
        (lambda: GPULoadStoreSpec([1], 5), "group_sizes"),
        (lambda: GPULoadStoreSpec([1], [1], 0), "block_indices"),
        (lambda: GPULoadStoreSpec(None), "block_ids"),
    ],
)
def test_spec_non_sequences_are_a_typed_error(build, name: str) -> None:
    with pytest.raises(InvalidTypeError, match=name):
        build()


SPECS = [
    lambda: CPULoadStoreSpec([1, 2]),
    lambda: GPULoadStoreSpec([3, 4, 5], [1, 2], [0, 7]),
    lambda: CPUOffloadingManager(4).prepare_store(K0[:2], CTX).store_spec,  # type: ignore[union-attr]
]


@pytest.mark.parametrize("build", SPECS)
def test_specs_cannot_be_changed_after_construction(build) -> None:
    spec = build()
    names = ["block_ids"] + (["group_sizes", "block_indices"] if isinstance(spec, GPULoadStoreSpec) else [])
    before = {n: getattr(spec, n).tolist() for n in names}
    for n in names:
        for value in ([1.5, 2.7], [-1, 0], np.array([0, 1]), None):
            with pytest.raises(KVOffloadError, match=n) as info:
                setattr(spec, n, value)
            assert isinstance(info.value, TypeError) and isinstance(info.value, AttributeError)
        with pytest.raises(KVOffloadError, match=n):
            delattr(spec, n)
        arr = getattr(spec, n)
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = -1
    assert {n: getattr(spec, n).tolist() for n in names} == before


def test_spec_from_a_caller_array_does_not_alias_it() -> None:
    ids = np.array([1, 2, 3])
    spec = CPULoadStoreSpec(ids)
    ids[0] = 99  # the caller's array stays writable, the spec keeps its own copy
    assert spec.block_ids.tolist() == [1, 2, 3]


def test_scheduler_built_gpu_specs_are_immutable_too() -> None:
    from kvoffload.scheduler.building import trusted_gpu_spec

    spec = trusted_gpu_spec(np.array([1, 2]), np.array([2]), np.array([0]))
    with pytest.raises(KVOffloadError, match="block_ids"):
        spec.block_ids = np.array([-1, 5])
    with pytest.raises(ValueError, match="read-only"):
        spec.block_ids[0] = -1


# ------------------------------------------------------------------ item 5: policy registry
class _Tmp(LRUPolicy):
    pass


class _Abstract(CachePolicy, ABC):
    """Implements nothing: every abstract method is still missing."""


class _HalfDone(LRUPolicy, ABC):
    from abc import abstractmethod

    @abstractmethod
    def extra(self) -> None: ...


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    reg = dict(policies.base.POLICIES._entries)
    monkeypatch.setattr(policies.base.POLICIES, "_entries", reg)
    return reg


@pytest.mark.parametrize("name", ["lru", "arc", "s3fifo"])
def test_register_policy_does_not_silently_replace_a_builtin(registry: dict, name: str) -> None:
    builtin = get_policy_class(name)
    with pytest.raises(InvalidArgumentError, match=rf"'{name}'.*replace=True"):
        register_policy(name, _Tmp)
    assert get_policy_class(name) is builtin
    register_policy(name, _Tmp, replace=True)
    assert get_policy_class(name) is _Tmp


def test_register_policy_replacing_a_registered_name_needs_replace(registry: dict) -> None:
    register_policy("tmp-policy", _Tmp)
    register_policy("tmp-policy", _Tmp)  # the same class again: nothing to replace

    class _Other(LRUPolicy):
        pass

    with pytest.raises(InvalidArgumentError, match="replace"):
        register_policy("tmp-policy", _Other)
    assert get_policy_class("tmp-policy") is _Tmp
    register_policy("tmp-policy", _Other, replace=True)
    assert get_policy_class("tmp-policy") is _Other
    with pytest.raises(InvalidTypeError, match="replace"):
        register_policy("tmp-policy", _Tmp, replace="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [_Abstract, _HalfDone, CachePolicy])
def test_register_policy_rejects_an_abstract_class(registry: dict, cls: type) -> None:
    with pytest.raises(InvalidTypeError, match=r"abstract.*(insert|extra|evict)"):
        register_policy("abstract-policy", cls)
    assert "abstract-policy" not in registry


def test_out_of_tree_abstract_policy_is_rejected_when_named() -> None:
    with pytest.raises(InvalidTypeError, match="abstract"):
        get_policy_class("kvoffload.cache.policies.base:CachePolicy")
    with pytest.raises(InvalidTypeError, match="abstract"):
        CPUOffloadingManager(4, cache_policy="tests.cache.test_bad_input_reliability:_Abstract")


# ------------------------------------------------------------------ item 5: worker wait
@pytest.mark.parametrize("ids,idx", [([1.5], 0), ([1, 2.5], 1), ((3, 4, "5"), 2), ([0, True], 1)])
def test_wait_names_the_bad_index(ids: object, idx: int) -> None:
    from tests.transfer.test_worker import _worker

    w, _ = _worker()
    with pytest.raises(InvalidTypeError, match=rf"job_ids\[{idx}\]"):
        w.wait(ids)  # type: ignore[arg-type]


def test_register_policy_same_builtin_class_again_is_a_no_op(registry: dict) -> None:
    registry["lru"] = "kvoffload.cache.policies.lru:LRUPolicy"  # not loaded yet
    register_policy("lru", LRUPolicy)
    assert get_policy_class("lru") is LRUPolicy
