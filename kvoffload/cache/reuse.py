"""Reuse filter: store only blocks that were asked for at least ``store_threshold`` times (docs/contract.md §3)."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from kvoffload.cache.batch import KeyBatch, StorePlan, as_key_list
from kvoffload.checks import check_int
from kvoffload.core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    check_req_context,
    validate_keys,
)
from kvoffload.core.lookup_result import LOOKUP_MISS
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["FilteredReuseManager"]


def _subset(keys: Sequence[OffloadKey], keep: list[bool]) -> list[OffloadKey]:
    """The kept keys; a :class:`KeyBatch` stays one (with its slots)."""
    if keys.__class__ is KeyBatch:
        return keys.select(keep)  # type: ignore[attr-defined,no-any-return]
    return [k for k, f in zip(keys, keep, strict=True) if f]


class FilteredReuseManager(OffloadingManager):
    """Proxy that lets ``prepare_store`` store only keys seen at least ``store_threshold`` times.

    Counting follows vLLM's reuse filter: every :meth:`lookup` (and every key of
    :meth:`lookup_batch`) counts its key once, in a tracker of at most ``max_tracker_size``
    keys that forgets the least-recently-counted key when full. :meth:`prepare_store` holds
    back the absent keys below the threshold *before* delegating, so they take no capacity; an
    all-filtered call still delegates an empty list (and returns the backing's empty result).
    Keys the backing already holds are always delegated, whatever their count (the threshold
    is about new stores; the backing then keeps them out of the call's evictions, and they are
    not counted as skipped), as in vLLM's manager; the filter asks the backing's ``peek_list``
    (read-only) which keys it holds.

    The fix over vLLM (its issue #52022): a prefix lookup stops at the first miss, so the keys
    after it were never counted and could never become eligible. Here ``prepare_store`` also
    counts, once per request (``req_context.req_id``), every key this request has not counted
    yet (through ``lookup`` or an earlier ``prepare_store``), before filtering. The next
    request with the same prompt then finds them at the threshold. Which keys each request
    has counted is remembered for the most recent requests, at most ``max_tracker_size``
    (request, key) pairs in all, oldest requests forgotten first. Calls with an empty
    ``req_id`` (an anonymous context) are not counted by ``prepare_store``: they cannot be
    told apart.

    ``count_on="offer"`` counts as vLLM 0.32's CPU manager does instead: lookups count
    nothing, and every ``prepare_store`` call counts each key it offers once (anonymous
    contexts too); when the tracker is full, keys of the current offer are never the ones
    forgotten to make room (a new key is then simply not tracked).

    Every other method passes through unchanged, with its ``req_context``. Every method checks
    that ``req_context`` is a :class:`ReqContext`, and counts nothing when it raises (bad
    input, or a backing manager that refuses the call).

    Args:
        backing: the manager that stores the blocks.
        store_threshold: times a key must be counted before it may be stored (``>= 1``;
            1 stores everything that was counted once).
        max_tracker_size: keys the tracker holds (``>= 1``; smaller is a ``ValueError``).
        count_on: ``"lookup"`` (default: lookups, plus once per request at store time) or
            ``"offer"`` (every store offer, as vLLM counts).
    """

    def __init__(
        self,
        backing: OffloadingManager,
        store_threshold: int = 2,
        max_tracker_size: int = 64_000,
        count_on: str = "lookup",
    ) -> None:
        if count_on not in ("lookup", "offer"):
            raise InvalidArgumentError(f"count_on must be 'lookup' or 'offer', got {count_on!r}")
        self.count_on = count_on
        if not isinstance(backing, OffloadingManager):
            raise InvalidTypeError(f"backing must be an OffloadingManager, got {type(backing).__name__}")
        self.store_threshold = check_int(store_threshold, "store_threshold", 1)
        self.max_tracker_size = check_int(max_tracker_size, "max_tracker_size", 1)
        self._backing = backing
        self.counts: OrderedDict[bytes, int] = OrderedDict()
        self._by_request: OrderedDict[str, set[bytes]] = OrderedDict()
        self._num_pairs = 0
        self._skipped = 0

    @property
    def backing(self) -> OffloadingManager:
        """The wrapped manager."""
        return self._backing

    # ------------------------------------------------------------------ counting
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

    def _seen_set(self, req_id: str) -> set[bytes]:
        seen = self._by_request.get(req_id)
        if seen is None:
            seen = set()
            self._by_request[req_id] = seen
        else:
            self._by_request.move_to_end(req_id)
        return seen

    def _trim_requests(self) -> None:
        by_req = self._by_request
        while self._num_pairs > self.max_tracker_size and len(by_req) > 1:
            _, old = by_req.popitem(last=False)
            self._num_pairs -= len(old)

    def _note(self, req_context: ReqContext, keys: Iterable[bytes]) -> None:
        req_id = req_context.req_id
        if not req_id:
            return
        seen = self._seen_set(req_id)
        before = len(seen)
        seen.update(keys)
        self._num_pairs += len(seen) - before
        self._trim_requests()

    # ------------------------------------------------------------------ intercepted
    # Each call validates its arguments, delegates, and counts only once the backing returned:
    # a call that raises (bad input, a backing that refuses) changes nothing here.
    def _offer_new_tracked(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        """The keys of an offer (distinct) that are not tracked yet and will be: as many as the
        tracker holds beside the offered keys it already tracks (those are never forgotten to
        make room), first come first. Changes nothing."""
        counts = self.counts
        room = self.max_tracker_size - sum(1 for k in keys if k in counts)
        return [k for k in keys if k not in counts][: max(room, 0)]

    def _count_offer(self, keys: list[OffloadKey], new: list[OffloadKey]) -> None:
        """Count an offer: the tracked keys one more (now most recent), ``new`` (from
        :meth:`_offer_new_tracked`) at 1, forgetting the least recently counted keys for room."""
        counts = self.counts
        for k in keys:
            c = counts.get(k)
            if c is not None:
                counts[k] = c + 1
                counts.move_to_end(k)
        for k in new:
            if len(counts) >= self.max_tracker_size:
                counts.popitem(last=False)
            counts[k] = 1

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Delegate, then count ``key`` once (``count_on="lookup"``)."""
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if self.count_on == "offer":
            return self._backing.lookup(key, req_context)
        validate_keys([key], "key")
        result = self._backing.lookup(key, req_context)
        self._count(key)
        self._note(req_context, (key,))
        return result

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Delegate the batch, then count every key (each occurrence; ``count_on="lookup"``)."""
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if self.count_on == "offer":
            return self._backing.lookup_batch(keys, req_context)
        keys = as_key_list(keys, "keys", allow_duplicates=True)
        out = self._backing.lookup_batch(keys, req_context)
        for k in keys:
            self._count(k)
        self._note(req_context, keys)
        return out

    def _resident(self, keys: list[OffloadKey]) -> set[OffloadKey]:
        """The ``keys`` the backing holds (ready or pending), asked through its read-only
        ``peek_list`` (which takes a :class:`KeyBatch` resolved at the door without probing its
        keys again); none when the backing has no such probe (every key then counts as new)."""
        peek = getattr(self._backing, "peek_list", None)
        if peek is None:
            return set()
        return {k for k, c in zip(keys, peek(keys), strict=True) if c != LOOKUP_MISS}

    def _select(
        self, keys: list[OffloadKey], req_context: ReqContext
    ) -> tuple[list[OffloadKey], list[OffloadKey], int]:
        """``(keys to delegate, keys this offer starts counting, absent keys held back)``; changes nothing.

        A key is delegated when the backing holds it already (the threshold applies to new
        stores only; the backing then protects it from the call's evictions, as vLLM's manager
        protects every offered key) or when its count, this offer included, reaches the threshold.
        The keys to delegate are a :class:`KeyBatch` (with its slots) when ``keys`` is one.
        """
        counts, threshold = self.counts, self.store_threshold
        if self.count_on == "offer":
            new = self._offer_new_tracked(keys)
            new_set = set(new)
            hold = [(counts[k] + 1 if k in counts else int(k in new_set)) < threshold for k in keys]
        else:
            new = []
            if req_context.req_id:
                seen = self._by_request.get(req_context.req_id)
                new = list(keys) if seen is None else [k for k in keys if k not in seen]
            new_set = set(new)
            hold = [counts.get(k, 0) + (k in new_set) < threshold for k in keys]
        if True not in hold:
            return keys, new, 0
        resident = self._resident(_subset(keys, hold))
        keep = [not h or k in resident for k, h in zip(keys, hold, strict=True)]
        return _subset(keys, keep), new, keep.count(False)

    def store_candidates(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """The keys of an offer that :meth:`prepare_store` would delegate now (see there); changes nothing."""
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        return self._select(self._checked(keys), req_context)[0]

    @staticmethod
    def _checked(keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """``keys`` checked (distinct bytes), unless a :class:`KeyBatch` checked them at the door."""
        if keys.__class__ is KeyBatch and keys.unique:  # type: ignore[attr-defined]
            return keys  # type: ignore[return-value]
        return as_key_list(keys, "keys", allow_duplicates=False)

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Hold back the absent keys below the threshold (counting the keys this request has not
        counted yet), delegate the others -- the keys the backing holds already included.

        The counts are updated once the backing returned; a key counted by this call is eligible
        when its count including this call reaches the threshold. ``stores_skipped`` counts the
        absent keys held back.
        """
        return self._store(keys, req_context, self._backing.prepare_store)  # type: ignore[no-any-return]

    def store_plan(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> StorePlan | None:
        """:meth:`prepare_store` answering the backing's :class:`~kvoffload.cache.batch.StorePlan`
        (the backing must have ``store_plan``, as :class:`~kvoffload.cache.manager.CPUOffloadingManager` has)."""
        return self._store(keys, req_context, self._backing.store_plan)  # type: ignore[attr-defined,no-any-return]

    def _store(self, keys: Sequence[OffloadKey], req_context: ReqContext, step: Callable[..., Any]) -> Any:
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        keys = self._checked(keys)
        delegated, new, n_held = self._select(keys, req_context)
        out = step(delegated, req_context)
        if self.count_on == "offer":
            self._count_offer(keys, new)
        elif req_context.req_id:
            for k in new:
                self._count(k)
            self._seen_set(req_context.req_id).update(new)
            self._num_pairs += len(new)
            self._trim_requests()
        self._skipped += n_held
        return out

    def take_skipped(self) -> int:
        """Keys this filter held back from ``prepare_store`` since the previous call (then reset)."""
        skipped, self._skipped = self._skipped, 0
        return skipped

    # ------------------------------------------------------------------ delegated
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        return self._backing.prepare_load(keys, req_context)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        self._backing.touch(keys, req_context)

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        self._backing.complete_load(keys, req_context)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        self._backing.complete_store(keys, req_context, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._backing.take_events()

    def get_stats(self) -> Any:
        """The backing's stats with the keys this filter skipped added to ``stores_skipped``.

        Returns None when the backing has no ``get_stats``.
        """
        skipped = self.take_skipped()
        get = getattr(self._backing, "get_stats", None)
        if get is None:
            return None
        stats = get()
        if dataclasses.is_dataclass(stats) and not isinstance(stats, type) and hasattr(stats, "stores_skipped"):
            return dataclasses.replace(stats, stores_skipped=stats.stores_skipped + skipped)
        return stats

    def reset_cache(self) -> None:
        """Reset the backing (if it can) and forget every count."""
        reset = getattr(self._backing, "reset_cache", None)
        if reset is not None:
            reset()
        self.counts.clear()
        self._by_request.clear()
        self._num_pairs = 0

    def shutdown(self) -> None:
        self._backing.shutdown()

    def __repr__(self) -> str:
        return (
            f"FilteredReuseManager(backing={self._backing!r}, store_threshold={self.store_threshold}, "
            f"max_tracker_size={self.max_tracker_size}, tracked={len(self.counts)})"
        )
