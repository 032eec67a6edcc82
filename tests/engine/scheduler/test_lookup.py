"""Pure lookup functions (worked numbers) and their batched, chunked twins."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.engine.scheduler.lookup import (
    LookupCodes,
    maximal_prefix_lookup,
    prefix_hits_from_codes,
    sliding_window_lookup,
)
from kvoffload.errors import InvalidArgumentError, InvalidTypeError


class Recorder:
    """lookup(key) from a dict (missing keys: False), recording every call."""

    def __init__(self, answers: dict[int, bool | None]) -> None:
        self.answers = answers
        self.calls: list[int] = []

    def __call__(self, key: int) -> bool | None:
        self.calls.append(key)
        return self.answers.get(key, False)


def hits(*keys: int) -> Recorder:
    return Recorder({k: True for k in keys})


# ---------------------------------------------------------------- maximal prefix (issue numbers)
def test_prefix_all_hit() -> None:
    assert maximal_prefix_lookup([1, 2], hits(1, 2)) == 2


def test_prefix_all_miss() -> None:
    assert maximal_prefix_lookup([1, 2], hits()) == 0


def test_prefix_partial() -> None:
    rec = hits(1, 2)
    assert maximal_prefix_lookup([1, 2, 3], rec) == 2
    assert rec.calls == [1, 2, 3]


def test_prefix_miss_then_hit_stops_at_first_miss() -> None:
    rec = hits(2)
    assert maximal_prefix_lookup([1, 2], rec) == 0
    assert rec.calls == [1]


def test_prefix_empty() -> None:
    assert maximal_prefix_lookup([], hits()) == 0


def test_prefix_none_first_defers() -> None:
    assert maximal_prefix_lookup([1, 2], Recorder({1: None, 2: True})) is None


def test_prefix_none_then_miss_defers_after_two_calls() -> None:
    rec = Recorder({1: None, 2: False, 3: True})
    assert maximal_prefix_lookup([1, 2, 3], rec) is None
    assert rec.calls == [1, 2]


# ---------------------------------------------------------------- sliding window (issue numbers)
def test_window_all_hit() -> None:
    assert sliding_window_lookup([1, 2], 2, hits(1, 2)) == 2


def test_window_all_miss() -> None:
    assert sliding_window_lookup([1, 2], 2, hits()) == 0


def test_window_tail_hits() -> None:
    assert sliding_window_lookup([1, 2, 3], 2, hits(2, 3)) == 3


def test_window_middle_hits() -> None:
    rec = hits(2, 3)
    assert sliding_window_lookup([1, 2, 3, 4], 2, rec) == 3
    assert rec.calls == [4, 3, 2]  # scans from the end, stops at the first full window


def test_window_prefix_fallback() -> None:
    assert sliding_window_lookup([1, 2, 3], 3, hits(1, 2)) == 2


def test_window_empty() -> None:
    assert sliding_window_lookup([], 2, hits()) == 0


def test_window_pending_defers_and_resets_streak() -> None:
    # the pending key 3 breaks the streak: the full window is [1, 2], deferred
    assert sliding_window_lookup([1, 2, 3, 4], 2, Recorder({1: True, 2: True, 3: None, 4: True})) is None
    # a pending key before (left of) the window found is never reached
    assert sliding_window_lookup([1, 2, 3], 2, Recorder({1: None, 2: True, 3: True})) == 3


@pytest.mark.parametrize("bad", [0, -1])
def test_window_size_checked(bad: int) -> None:
    with pytest.raises(InvalidArgumentError, match="window"):
        sliding_window_lookup([1], bad, hits(1))


def test_window_size_bool_rejected() -> None:
    with pytest.raises(InvalidTypeError, match="window"):
        sliding_window_lookup([1], True, hits(1))  # type: ignore[arg-type]


# ---------------------------------------------------------------- batched twins
_CODE = {True: LOOKUP_HIT, False: LOOKUP_MISS, None: LOOKUP_PENDING}
answers = st.lists(st.sampled_from([True, True, True, False, None]), max_size=80)


class BatchRecorder:
    def __init__(self, values: list[bool | None]) -> None:
        self.codes = np.array([_CODE[v] for v in values], dtype=np.int8)
        self.asked: list[int] = []

    def __call__(self, keys: list[int]) -> np.ndarray:
        self.asked.extend(keys)
        return self.codes[np.asarray(keys, dtype=np.int64)]


@settings(max_examples=300, deadline=None)
@given(answers, st.integers(0, 6))
def test_prefix_codes_equal_pure(values: list[bool | None], first_chunk: int) -> None:
    keys = list(range(len(values)))
    expected = maximal_prefix_lookup(keys, lambda k: values[k])
    codes = np.array([_CODE[v] for v in values], dtype=np.int8)
    assert prefix_hits_from_codes(codes) == expected
    batch = BatchRecorder(values)
    lc = LookupCodes(keys, batch, first_chunk=first_chunk + 1)
    assert lc.prefix(0, len(keys)) == expected
    assert len(batch.asked) == len(set(batch.asked))  # never asks twice about a key
    stop = next((i for i, v in enumerate(values) if v is False), len(values))
    # the pure function asks keys[0..stop]; the chunked one at most one chunk more
    assert set(range(min(stop + 1, len(values)))) <= set(batch.asked)


@settings(max_examples=300, deadline=None)
@given(answers, st.integers(1, 5), st.integers(0, 6), st.integers(0, 10))
def test_window_codes_equal_pure(values: list[bool | None], window: int, first_chunk: int, known: int) -> None:
    keys = list(range(len(values)))
    known = min(known, len(values))
    shown = [True] * known + values[known:]
    expected = sliding_window_lookup(keys, window, lambda k: shown[k])
    batch = BatchRecorder(values)
    lc = LookupCodes(keys, batch, known_hits=known, first_chunk=first_chunk + 1)
    assert lc.window(len(keys), window) == expected
    assert len(batch.asked) == len(set(batch.asked))
    assert all(k >= known for k in batch.asked)  # GPU-held positions are never looked up


@settings(max_examples=100, deadline=None)
@given(answers, st.integers(1, 4), st.integers(0, 80))
def test_mixed_prefix_then_window_asks_each_key_once(values: list[bool | None], window: int, end: int) -> None:
    keys = list(range(len(values)))
    end = min(end, len(values))
    batch = BatchRecorder(values)
    lc = LookupCodes(keys, batch, first_chunk=3)
    assert lc.prefix(0, end) == maximal_prefix_lookup(keys[:end], lambda k: values[k])
    assert lc.window(len(keys), window) == sliding_window_lookup(keys, window, lambda k: values[k])
    assert len(batch.asked) == len(set(batch.asked))
