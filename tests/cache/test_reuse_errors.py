"""The reuse filter counts nothing when the manager's call raises, and still counts after a
successful call."""

from __future__ import annotations

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import (
    ReqContext,
)
from kvoffload.errors import KeyStateError
from tests.cache.test_keys_and_contexts import REUSE_CALLS, reuse_state
from tests.keys import CTX, K0


def test_reuse_filter_counts_nothing_when_the_manager_is_shut_down() -> None:
    f = CPUOffloadingManager(8, store_threshold=2)
    f.lookup(K0[0], CTX)
    f.shutdown()
    before = reuse_state(f)
    for method in ("lookup", "lookup_batch", "prepare_store"):
        with pytest.raises(KeyStateError):
            REUSE_CALLS[method](f, ReqContext("late"))
    assert reuse_state(f) == before


def test_reuse_filter_still_counts_and_filters_after_a_successful_call() -> None:
    f = CPUOffloadingManager(8, store_threshold=2)
    assert f.lookup(K0[0], ReqContext("a")) is False
    out = f.prepare_store(K0[:2], ReqContext("a"))  # K0[0] counted once (lookup), K0[1] counted now
    assert out is not None and out.keys_to_store == []
    f.lookup_batch(K0[:2], ReqContext("b"))
    out = f.prepare_store(K0[:3], ReqContext("b"))  # K0[0]: 2, K0[1]: 2, K0[2]: 1
    assert out is not None and out.keys_to_store == K0[:2]
    assert f.reuse is not None and f.reuse.counts == {K0[0]: 2, K0[1]: 2, K0[2]: 1}
