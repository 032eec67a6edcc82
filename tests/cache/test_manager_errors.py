"""CPUOffloadingManager: bad input raises a typed error naming the argument, before any change."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyStateError,
    KVOffloadError,
)
from tests.keys import CTX, K0, POLICIES

K = K0[:12]


def snapshot(m: CPUOffloadingManager) -> object:
    t = m.table
    p = m.policy
    order = p.ordered_slots()  # type: ignore[attr-defined]
    return (
        dict(t.index),
        t.ref.copy().tolist(),
        list(t.free_list),
        t.num_allocated,
        (t.num_pending, t.num_evictable, t.num_pinned),
        order,
        len(m._events or []),
    )


@pytest.fixture(params=POLICIES)
def busy(request: pytest.FixtureRequest) -> CPUOffloadingManager:
    """A full pool of 6: K0..K2 ready (K1 pinned), K3..K4 pending, K5 ready; events on."""
    m = CPUOffloadingManager(6, cache_policy=request.param, enable_events=True)
    m.prepare_store(K[:3], CTX)
    m.complete_store(K[:3], CTX)
    m.prepare_store(K[3:5], CTX)
    m.prepare_store(K[5:6], CTX)
    m.complete_store(K[5:6], CTX)
    m.prepare_load([K[1]], CTX)
    m.touch([K[0], K[1]], CTX)
    m.lookup_batch(K[:8], CTX)  # remembered by the translation memo
    return m


BAD_KEY_LISTS = [
    (["str-key"], InvalidTypeError),
    ([K[0], 7], InvalidTypeError),
    ([None], InvalidTypeError),
    ([bytearray(b"abcd")], InvalidTypeError),
    ([K[0], [1, 2]], InvalidTypeError),
    ([K[3], K[4], "str-key"], InvalidTypeError),  # pending keys before the bad one (complete_store)
    ({K[3], K[4], "str-key"}, InvalidTypeError),  # a set: the completions' one-pass path
    ({K[1], 7}, InvalidTypeError),
    (K[0], InvalidTypeError),  # a single key where a batch is expected
    ("abcd", InvalidTypeError),
    (5, InvalidTypeError),
    (None, InvalidTypeError),
]


METHODS = ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch", "lookup_batch"]


@pytest.mark.parametrize("keys,exc", BAD_KEY_LISTS)
@pytest.mark.parametrize("method", METHODS)
def test_non_bytes_keys_rejected_without_change(
    busy: CPUOffloadingManager, method: str, keys: object, exc: type
) -> None:
    before = snapshot(busy)
    with pytest.raises(exc, match="keys"):
        getattr(busy, method)(keys, CTX)
    assert snapshot(busy) == before


@pytest.mark.parametrize("key", ["k", 3, None, bytearray(b"abcd"), [1], (b"a",)])
def test_lookup_of_a_non_bytes_key(busy: CPUOffloadingManager, key: object) -> None:
    with pytest.raises(InvalidTypeError, match="key"):
        busy.lookup(key, CTX)  # type: ignore[arg-type]


def test_bad_key_inside_a_remembered_slice_is_still_caught(busy: CPUOffloadingManager) -> None:
    before = snapshot(busy)
    with pytest.raises(InvalidTypeError):
        busy.prepare_store([K[6], "x", K[7]], CTX)  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError):
        busy.touch([K[0], K[1], 3], CTX)  # type: ignore[list-item]
    assert snapshot(busy) == before


@pytest.mark.parametrize("method", ["prepare_store", "prepare_load"])
def test_duplicate_keys_rejected(busy: CPUOffloadingManager, method: str) -> None:
    before = snapshot(busy)
    for keys in ([K[0], K[2], K[0]], [K[7], K[8], K[7]], [K[6], K[6]], K[:8] + [K[5]]):
        with pytest.raises(InvalidArgumentError, match="more than once"):
            getattr(busy, method)(keys, CTX)
    assert snapshot(busy) == before


def test_duplicates_in_a_remembered_batch() -> None:
    m = CPUOffloadingManager(8)
    keys = K[:9] + [K[0]]
    m.lookup_batch(keys, CTX)  # remembered, with a repeat
    m.touch(keys, CTX)
    with pytest.raises(InvalidArgumentError):
        m.prepare_store(keys, CTX)
    assert len(m) == 0


def test_prepare_load_absent_or_pending(busy: CPUOffloadingManager) -> None:
    before = snapshot(busy)
    with pytest.raises(KeyStateError, match="not stored"):
        busy.prepare_load([K[0], K[9]], CTX)
    with pytest.raises(KeyStateError, match="not ready"):
        busy.prepare_load([K[0], K[3]], CTX)
    assert snapshot(busy) == before  # K0 was not pinned by the failed calls


def test_complete_load_of_unpinned_absent_or_pending(busy: CPUOffloadingManager) -> None:
    before = snapshot(busy)
    for keys in ([K[1], K[0]], [K[9]], [K[3]], [K[1], K[1]], {K[1], K[0]}, {K[1], K[9]}, {K[3], K[1]}):
        with pytest.raises(KeyStateError):
            busy.complete_load(keys, CTX)
    assert snapshot(busy) == before
    busy.complete_load([K[1]], CTX)
    with pytest.raises(KeyStateError, match="pinned 0"):
        busy.complete_load([K[1]], CTX)


def test_repeated_key_in_complete_load_unpins_per_occurrence() -> None:
    m = CPUOffloadingManager(4)
    m.prepare_store(K[:2], CTX)
    m.complete_store(K[:2], CTX)
    m.prepare_load([K[0]], CTX)
    m.prepare_load([K[0], K[1]], CTX)
    m.complete_load([K[0], K[1], K[0]], CTX)
    assert m.table.ref[:2].tolist() == [0, 0]
    assert m.table.num_evictable == 2 and m.table.num_pinned == 0


@pytest.mark.parametrize(
    "n,exc",
    [
        (-1, InvalidArgumentError),
        (True, InvalidTypeError),
        (4.0, InvalidTypeError),
        ("4", InvalidTypeError),
        (None, InvalidTypeError),
    ],
)
def test_bad_num_blocks(n: object, exc: type) -> None:
    with pytest.raises(exc, match="num_blocks"):
        CPUOffloadingManager(n)  # type: ignore[arg-type]


def test_bad_policy_and_flags() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown cache_policy 'lfu'"):
        CPUOffloadingManager(4, cache_policy="lfu")
    with pytest.raises(InvalidTypeError, match="cache_policy"):
        CPUOffloadingManager(4, cache_policy=None)  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailableError, match="cannot import"):
        CPUOffloadingManager(4, cache_policy="no_such_module_xyz:Policy")
    with pytest.raises(InvalidArgumentError, match="no attribute"):
        CPUOffloadingManager(4, cache_policy="kvoffload.cache.policies.lru:Nope")
    with pytest.raises(InvalidTypeError, match="not a CachePolicy"):
        CPUOffloadingManager(4, cache_policy="kvoffload.cache.manager:CPUOffloadingManager")
    with pytest.raises(InvalidTypeError, match="enable_events"):
        CPUOffloadingManager(4, enable_events=1)  # type: ignore[arg-type]


def test_bad_success_flag(busy: CPUOffloadingManager) -> None:
    before = snapshot(busy)
    for flag in (1, 0, None, "yes"):
        with pytest.raises(InvalidTypeError, match="success"):
            busy.complete_store([K[3]], CTX, success=flag)  # type: ignore[arg-type]
    assert snapshot(busy) == before
    busy.complete_store([K[3]], CTX, success=np.bool_(True))
    assert busy.lookup(K[3], CTX) is True


def test_errors_are_catchable_as_builtins() -> None:
    m = CPUOffloadingManager(2)
    with pytest.raises(ValueError):
        m.prepare_load([K[0]], CTX)
    with pytest.raises(TypeError):
        m.touch([1], CTX)  # type: ignore[list-item]
    with pytest.raises(KVOffloadError):
        m.prepare_store([K[0], K[0]], CTX)


def test_after_shutdown_every_call_raises() -> None:
    m = CPUOffloadingManager(2)
    m.prepare_store([K[0]], CTX)
    m.shutdown()
    m.shutdown()  # idempotent
    for call in (
        lambda: m.lookup(K[0], CTX),
        lambda: m.lookup_batch([K[0]], CTX),
        lambda: m.prepare_store([K[1]], CTX),
        lambda: m.complete_store([K[0]], CTX),
        lambda: m.touch([K[0]], CTX),
        lambda: m.prepare_load([K[0]], CTX),
        lambda: m.complete_load([K[0]], CTX),
        lambda: m.complete_store({K[0]}, CTX),
        lambda: m.complete_load({K[0]}, CTX),
        lambda: m.reset_cache(),
    ):
        with pytest.raises(KeyStateError, match="shut down"):
            call()
