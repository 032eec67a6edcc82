"""The manager's reuse filter (``store_threshold``, docs/contract.md §3): which absent keys of a store
offer were seen often enough to be stored."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.checks import check_int
from kvoffload.core.base import OffloadKey
from kvoffload.errors import InvalidArgumentError

__all__ = ["ReuseFilter"]


class ReuseFilter:
    """Counts keys in a tracker of at most ``max_tracker_size`` (``>= 1``) keys, least recently
    counted forgotten first, and admits an absent key once counted ``store_threshold`` (``>= 1``) times.

    ``count_on="lookup"``: each looked-up key counts once per lookup; since a prefix lookup stops
    at its first miss, a store offer also counts each of its keys this request (a non-empty
    ``req_id``) has not counted yet, remembered for the latest requests (at most
    ``max_tracker_size`` (request, key) pairs). ``count_on="offer"`` (vLLM 0.32): each store offer
    counts each of its keys once; keys of the current offer are never forgotten to make room (a
    new key is then not tracked).
    """

    def __init__(self, store_threshold: int, max_tracker_size: int, count_on: str) -> None:
        if count_on not in ("lookup", "offer"):
            raise InvalidArgumentError(f"count_on must be 'lookup' or 'offer', got {count_on!r}")
        self.store_threshold = check_int(store_threshold, "store_threshold", 1)
        self.max_tracker_size = check_int(max_tracker_size, "max_tracker_size", 1)
        self.count_on = count_on
        self.counts: OrderedDict[bytes, int] = OrderedDict()
        self._by_request: OrderedDict[str, set[bytes]] = OrderedDict()
        self._num_pairs = 0
        self._skipped = 0

    def count_lookups(self, keys: Iterable[OffloadKey], req_id: str) -> None:
        """Count looked-up (checked) keys, each occurrence."""
        keys = list(keys)
        for k in keys:
            self._count(k)
        self._note(req_id, keys)

    def admit(self, offer: Sequence[OffloadKey], absent: list[OffloadKey], req_id: str) -> list[OffloadKey]:
        """Count a store ``offer`` (distinct checked keys); its ``absent`` keys counted often enough,
        in order (the others are skipped)."""
        counts, threshold = self.counts, self.store_threshold
        if self.count_on == "offer":
            tracked = [k for k in offer if k in counts]
            for k in tracked:
                counts[k] += 1
                counts.move_to_end(k)
            for k in [k for k in offer if k not in counts][: max(self.max_tracker_size - len(tracked), 0)]:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[k] = 1
            admitted = [k for k in absent if counts.get(k, 0) >= threshold]
        else:
            seen = self._by_request.get(req_id)
            new = [] if not req_id else list(offer) if seen is None else [k for k in offer if k not in seen]
            fresh = set(new)
            admitted = [k for k in absent if counts.get(k, 0) + (k in fresh) >= threshold]
            for k in new:
                self._count(k)
            self._note(req_id, new)
        self._skipped += len(absent) - len(admitted)
        return admitted

    def take_skipped(self) -> int:
        """Absent keys held back since the previous call (then reset)."""
        skipped, self._skipped = self._skipped, 0
        return skipped

    def _count(self, key: bytes) -> None:
        counts = self.counts
        c = counts.get(key)
        if c is None:
            if len(counts) >= self.max_tracker_size:
                counts.popitem(last=False)
            counts[key] = 1
        else:
            counts[key] = c + 1
            counts.move_to_end(key)

    def _note(self, req_id: str, keys: Iterable[bytes]) -> None:
        """Remember that request ``req_id`` counted ``keys``."""
        if not req_id:
            return
        by_req = self._by_request
        seen = by_req.get(req_id)
        if seen is None:
            seen = by_req[req_id] = set()
        else:
            by_req.move_to_end(req_id)
        before = len(seen)
        seen.update(keys)
        self._num_pairs += len(seen) - before
        while self._num_pairs > self.max_tracker_size and len(by_req) > 1:
            _, old = by_req.popitem(last=False)
            self._num_pairs -= len(old)
