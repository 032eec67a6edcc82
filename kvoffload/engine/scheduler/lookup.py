"""Block lookups over a request's offloaded keys: maximal prefix and sliding window.

Two pure functions define the semantics (docs/contract.md §6); ``lookup(key)`` answers True (stored and
ready), False (absent) or None (present but still being stored: "retry later"):

* :func:`maximal_prefix_lookup` counts the leading hits. A None counts as a hit but marks the
  result *deferred* -- the scan goes on so that a manager with asynchronous lookups can start
  them all at once -- and the function then returns None. The scan stops at the first miss.
* :func:`sliding_window_lookup` scans from the end. A None resets the streak of hits and marks
  the result deferred. At the first run of ``window`` consecutive hits it returns the run's
  exclusive end index (None if deferred). With no full window it returns the final streak, i.e.
  the number of leading hits (a prefix fallback: when the whole prefix is there, the attention
  window needs nothing before it), or None if deferred.

The scheduler does not call ``manager.lookup`` key by key: :class:`LookupCodes` fetches codes in
geometric chunks through ``manager.lookup_batch`` (``np.int8``: ``LOOKUP_MISS``/``LOOKUP_HIT``/
``LOOKUP_PENDING``) and :func:`prefix_hits_from_codes` / :func:`sliding_window_lookup` run on
them. Prefix chunks stop after the chunk holding the first miss, window chunks are fetched from
the end backwards, so the manager sees (up to one chunk of slack) the same keys the key-by-key
functions would have asked for, and the results are identical.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from kvoffload.checks import check_int
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

__all__ = [
    "maximal_prefix_lookup",
    "sliding_window_lookup",
    "prefix_hits_from_codes",
    "LookupCodes",
]

K = TypeVar("K")

_UNKNOWN = -1


def maximal_prefix_lookup(keys: Sequence[K], lookup: Callable[[K], bool | None]) -> int | None:
    """Number of leading keys that are offloaded, or None when any of them is still pending.

    Args:
        keys: keys in prefix order.
        lookup: ``lookup(key) -> True | False | None`` (None: pending, retry later).

    Returns:
        The count of leading hits (a None counts as a hit); None if a None was seen before the
        first miss. Stops calling ``lookup`` at the first miss.
    """
    hits = 0
    deferred = False
    for key in keys:
        result = lookup(key)
        if result is None:
            deferred = True
        elif not result:
            break
        hits += 1
    return None if deferred else hits


def sliding_window_lookup(keys: Sequence[K], window: int, lookup: Callable[[K], bool | None]) -> int | None:
    """Exclusive end index of the last run of ``window`` consecutive hits, scanning from the end.

    Args:
        keys: keys in prefix order.
        window: the attention window in blocks, ``>= 1``.
        lookup: ``lookup(key) -> True | False | None`` (None: pending, retry later).

    Returns:
        ``idx + window`` for the first full window met scanning from the end (``keys[idx:idx +
        window]`` all hits); with no full window, the number of leading hits. None instead when a
        pending key was met before the answer was reached.
    """
    window = check_int(window, "window", 1)
    deferred = False
    streak = 0
    for idx in range(len(keys) - 1, -1, -1):
        result = lookup(keys[idx])
        if result is None:
            deferred = True
            streak = 0
        elif not result:
            streak = 0
        else:
            streak += 1
            if streak == window:
                return None if deferred else idx + window
    return None if deferred else streak


def prefix_hits_from_codes(codes: np.ndarray) -> int | None:
    """:func:`maximal_prefix_lookup` over already fetched ``np.int8`` lookup codes (vectorised)."""
    miss = np.flatnonzero(codes == LOOKUP_MISS)
    end = int(miss[0]) if miss.size else int(codes.size)
    if end and bool((codes[:end] == LOOKUP_PENDING).any()):
        return None
    return end


class LookupCodes:
    """Lazily fetched lookup codes for a list of keys, one manager batch call per chunk.

    ``codes[i]`` is fetched the first time it is needed, together with the rest of its chunk.
    Positions below ``known_hits`` are hits without asking the manager (blocks the engine
    already holds on the GPU).

    Args:
        keys: the keys, in prefix order.
        fetch: ``fetch(keys) -> np.ndarray`` of ``np.int8`` codes, one per key (e.g.
            ``lambda ks: manager.lookup_batch(ks, ctx)``).
        known_hits: number of leading positions that count as hits without a lookup.
        first_chunk: size of the first chunk.
        growth: chunks grow by this factor after each fetch (1 with ``first_chunk=1``: key by
            key, exactly the calls of the pure functions).
    """

    __slots__ = ("keys", "codes", "_fetch", "_chunk", "_growth", "num_fetched")

    def __init__(
        self,
        keys: Sequence[Any],
        fetch: Callable[[Sequence[Any]], np.ndarray],
        known_hits: int = 0,
        first_chunk: int = 32,
        growth: int = 4,
    ) -> None:
        self.keys = keys
        self.codes = np.full(len(keys), _UNKNOWN, dtype=np.int8)
        self.codes[: max(0, known_hits)] = LOOKUP_HIT
        self._fetch = fetch
        self._chunk = max(1, first_chunk)
        self._growth = max(1, growth)
        self.num_fetched = 0

    def _fetch_range(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        codes = np.asarray(self._fetch(self.keys[lo:hi]), dtype=np.int8)
        if codes.shape != (hi - lo,):
            raise InvalidArgumentError(f"lookup_batch returned {codes.shape[0]} codes for {hi - lo} keys")
        self.codes[lo:hi] = codes
        self.num_fetched += hi - lo
        self._chunk *= self._growth

    def _ensure(self, lo: int, hi: int) -> None:
        """Fetch every unknown code in ``[lo, hi)``, one batch call per run of unknown positions."""
        unknown = np.flatnonzero(self.codes[lo:hi] == _UNKNOWN)
        if not unknown.size:
            return
        # split into runs of consecutive positions: never ask the manager twice about a key
        breaks = np.flatnonzero(np.diff(unknown) != 1)
        starts = np.concatenate(([0], breaks + 1))
        ends = np.concatenate((breaks, [unknown.size - 1]))
        for s, e in zip(starts.tolist(), ends.tolist(), strict=False):
            self._fetch_range(lo + int(unknown[s]), lo + int(unknown[e]) + 1)

    def prefix(self, start: int, end: int) -> int | None:
        """:func:`maximal_prefix_lookup` over positions ``[start, end)``; returns the count of hits."""
        pos = start
        while pos < end:
            hi = min(end, pos + self._chunk)
            self._ensure(pos, hi)
            if bool((self.codes[pos:hi] == LOOKUP_MISS).any()):
                break
            pos = hi
        return prefix_hits_from_codes(self.codes[start:end])

    def get(self, idx: int) -> bool | None:
        """The lookup answer of position ``idx`` (fetching its chunk, backwards, if needed)."""
        code = int(self.codes[idx])
        if code == _UNKNOWN:
            self._ensure(max(0, idx + 1 - self._chunk), idx + 1)
            code = int(self.codes[idx])
        if code == LOOKUP_PENDING:
            return None
        return code == LOOKUP_HIT

    def window(self, end: int, window: int) -> int | None:
        """:func:`sliding_window_lookup` over positions ``[0, end)``."""
        return sliding_window_lookup(range(end), window, self.get)
