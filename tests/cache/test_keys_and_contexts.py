"""Keys and request contexts the managers and the reuse filter refuse.

Keys must be exactly ``bytes`` (never numpy bytes, which drop trailing NUL bytes, nor a ``bytes``
subclass); a ``req_context`` must be a ``ReqContext`` or an engine context with a ``str`` ``req_id``.
Every refusal raises a ``KVOffloadError`` that is also a ``ValueError``/``TypeError``, names the
argument, and leaves the object exactly as it was.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest

from kvoffload.cache.manager import SMALL_BATCH, CPUOffloadingManager
from kvoffload.core.base import (
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_keys,
)
from kvoffload.errors import InvalidTypeError
from tests.cache.test_manager_errors import snapshot
from tests.keys import CTX, K0, K1


def busy_manager() -> CPUOffloadingManager:
    m = CPUOffloadingManager(8, enable_events=True)
    m.prepare_store(K0[:3] + K1[:2], CTX)
    m.complete_store(K0[:2] + K1[:2], CTX)
    m.prepare_load([K0[0]], CTX)
    return m


# ------------------------------------------------------------------ numpy bytes as keys
def test_numpy_array_strips_the_nul_bytes_of_group_0_keys() -> None:
    # the premise of the bug: np.bytes_ subclasses bytes but is not the same key
    arr = np.array(K0[:2])
    assert isinstance(arr[0], bytes) and arr[0] != K0[0] and arr[0] + b"\0\0\0\0" == K0[0]


def test_store_of_a_numpy_key_array_is_rejected_instead_of_leaking_pending_slots() -> None:
    """prepare_store(np.array(keys)) is refused: the truncated keys it would store could never be
    completed by the caller's complete_store(keys), and their slots would stay pending forever."""
    m = CPUOffloadingManager(8)
    with pytest.raises(InvalidTypeError, match="keys"):
        m.prepare_store(np.array(K0[:4]), CTX)
    assert len(m) == 0 and m.get_stats().num_pending == 0
    out = m.prepare_store(K0[:4], CTX)
    assert out is not None
    m.complete_store(K0[:4], CTX)
    assert m.get_stats().num_pending == 0 and all(m.lookup(k, CTX) for k in K0[:4])


#: absent keys that make a call larger than the manager's small-call limit
_PAD = [make_offload_key(b"pad%04d" % i, 0) for i in range(SMALL_BATCH)]
MANAGER_METHODS = ["prepare_store", "complete_store", "prepare_load", "complete_load", "touch", "lookup_batch"]


@pytest.mark.parametrize("method", MANAGER_METHODS)
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda ks: np.array(ks), id="ndarray"),
        pytest.param(lambda ks: list(np.array(ks)), id="list-small"),  # the scalar fast paths
        pytest.param(lambda ks: list(np.array(ks)) + list(np.array(_PAD)), id="list-large"),  # > SMALL_BATCH
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


def reuse_state(m: CPUOffloadingManager) -> object:
    f = m.reuse
    assert f is not None
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
    f = CPUOffloadingManager(8, store_threshold=1)
    f.lookup(K0[0], CTX)
    before = reuse_state(f)
    with pytest.raises(InvalidTypeError, match="key"):
        call(f)
    assert reuse_state(f) == before and len(f) == 0


# ------------------------------------------------------------------ req_context
@dataclass
class EngineContext:
    """An engine's own context class (like vLLM's ReqContext): not a subclass of ours."""

    req_id: object


BAD_CONTEXTS = ["r", None, {"req_id": "r"}, 5, ReqContext, EngineContext(5), EngineContext(None)]


@pytest.mark.parametrize("trusted", [False, True], ids=["general", "engine-class-trusted"])
@pytest.mark.parametrize("ctx", BAD_CONTEXTS)
@pytest.mark.parametrize("method", MANAGER_METHODS + ["lookup"])
def test_manager_rejects_a_req_context_that_is_not_one(method: str, ctx: object, trusted: bool) -> None:
    m = busy_manager()
    if trusted:  # an engine's class checked by its req_id alone: the same contexts are still refused
        m.trust_context_class(EngineContext)
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

    f = m = CPUOffloadingManager(4, store_threshold=1)
    assert m.prepare_store(K0[:2], MyContext("x")) is not None
    assert m.lookup(K0[0], MyContext("x")) is None
    assert f.lookup(K0[2], EngineContext("y")) is False
    out = f.prepare_store([K0[2], K0[3]], EngineContext("y"))  # K0[3] counted once by request "y" here
    assert out is not None and out.keys_to_store == [K0[2], K0[3]]
    f.complete_store(out.keys_to_store, EngineContext("y"))
    assert f.lookup_batch(K0[:4], EngineContext("z")).tolist() == [2, 2, 1, 1]  # K0[:2] still pending


def test_trusted_engine_context_class_is_accepted_and_only_a_class_can_be_trusted() -> None:
    m = CPUOffloadingManager(4)
    m.trust_context_class(EngineContext)
    out = m.prepare_store(K0[:2], EngineContext("y"))
    assert out is not None and out.keys_to_store == K0[:2]
    m.complete_store(K0[:2], EngineContext("y"))
    assert m.lookup_batch(K0[:3], EngineContext("y")).tolist() == [1, 1, 0]
    assert m.prepare_load([K0[0]], ReqContext("r")).block_ids.tolist() == [0]  # ours still accepted
    with pytest.raises(InvalidTypeError, match="cls"):
        m.trust_context_class(EngineContext("y"))  # type: ignore[arg-type]


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
    f = CPUOffloadingManager(8, store_threshold=1)
    f.lookup(K0[0], CTX)
    f.prepare_store([K0[0]], CTX)
    f.complete_store([K0[0]], CTX)
    before, mb = reuse_state(f), snapshot(f)
    with pytest.raises(InvalidTypeError, match="req_context"):
        REUSE_CALLS[method](f, ctx)
    assert reuse_state(f) == before and snapshot(f) == mb
