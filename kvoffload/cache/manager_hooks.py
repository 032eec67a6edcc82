"""Request-scoped hooks (and ``discard``) of :class:`~kvoffload.cache.manager.CPUOffloadingManager`.

vLLM's scheduler never calls ``touch``: a request's accesses are recorded while it runs and
applied to the cache policy once, when it finishes (see
:class:`~kvoffload.cache.request_hooks.RequestHooksManager`, which does the recording). These
methods are what that recorder calls on the manager; they leave the seed API (``lookup``,
``touch``, ``prepare_store`` ...) unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from kvoffload.cache.manager_small import CPU_MEDIUM, SMALL_BATCH
from kvoffload.cache.manager_state import LOOKUP_CODES, ManagerState
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.core.base import OffloadingEvent, OffloadKey, ReqContext
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING

__all__ = ["RequestAccessMixin"]

#: request-level calls on at most this many keys (a whole prompt) run scalar code; beyond, numpy
_SCALAR_LIMIT = 256


class RequestAccessMixin(ManagerState):
    """``peek``, ``on_store_miss`` and ``apply_request_access`` over a manager's slot table."""

    def peek(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        """Like ``lookup_batch`` (``np.int8`` ``LOOKUP_*`` codes, duplicates allowed) but counts
        nothing in the statistics and remembers nothing: a read-only probe."""
        small = self._small_slots(keys)
        if small is not None:
            return np.array(self._small_codes(small), dtype=np.int8)
        return self._peek_array(keys)

    def peek_list(self, keys: Sequence[OffloadKey]) -> list[int]:
        """:meth:`peek` as a list of ints (cheaper for a few keys)."""
        small = self._small_slots(keys)
        if small is None:
            return self._peek_array(keys).tolist()
        return self._small_codes(small)

    def _small_codes(self, slots: list[int]) -> list[int]:
        ref = self._ref_buf
        return [LOOKUP_MISS if s < 0 else (LOOKUP_HIT if ref[s] >= 0 else LOOKUP_PENDING) for s in slots]

    @property
    def tracks_store_misses(self) -> bool:
        """Whether the policy learns from :meth:`on_store_miss` (ARC); if not, it is a no-op."""
        return type(self._policy).on_store_miss is not CachePolicy.on_store_miss

    def _peek_array(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        r = self._resolve(keys, allow_duplicates=True)
        if not r.keys:
            return np.zeros(0, dtype=np.int8)
        return LOOKUP_CODES[self._classes(r.slots)]

    def _small_slots(self, keys: Sequence[OffloadKey], limit: int = SMALL_BATCH) -> list[int] | None:
        """Slot (-1 = absent) per key for a list of at most ``limit`` exact ``bytes``; None otherwise."""
        if keys.__class__ is not list or len(keys) > limit or self._closed:
            return None
        get = self._index.get
        out = []
        for k in keys:
            if k.__class__ is not bytes:
                return None
            s = get(k)
            out.append(-1 if s is None else s)
        return out

    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """``keys`` are about to be offered to ``prepare_store``; the absent ones are passed to the
        policy's ``on_store_miss`` (ARC adapts its target on ghost hits there, as vLLM does)."""
        if not self.tracks_store_misses:
            return  # the policy keeps no history of absent keys
        small = self._small_slots(keys, _SCALAR_LIMIT)
        if small is not None:
            absent_keys = [k for k, s in zip(keys, small, strict=True) if s < 0]
            if absent_keys:
                self._policy.on_store_miss(absent_keys)
            return
        r = self._resolve(keys, allow_duplicates=True)
        if r.keys:
            absent = (r.slots < 0).nonzero()[0].tolist()
            if absent:
                self._policy.on_store_miss([r.keys[i] for i in absent])

    def discard(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """Remove the ready, unpinned ``keys`` (e.g. blocks whose bytes could not be read back).

        Pinned and pending keys and absent keys are left alone. The slots are freed like evicted
        ones; with events enabled one ``removed=True`` event lists the removed keys.

        Returns:
            The keys removed, in first-occurrence order.
        """
        r = self._resolve(keys, allow_duplicates=True)
        slots = [s for s in dict.fromkeys(r.slots.tolist()) if s >= 0]
        if not slots:
            return []
        arr = np.array(slots, dtype=np.int64)
        arr = arr[self._table.ref[arr] == 0]
        if not len(arr):
            return []
        self._policy.remove(arr)
        removed = self._table.release(arr, ready=True)
        if self._events is not None:
            self._events.append(OffloadingEvent(keys=list(removed), medium=CPU_MEDIUM, removed=True))
        return removed

    def apply_request_access(
        self,
        keys: Sequence[OffloadKey],
        req_context: ReqContext,
        inserted_only: Collection[OffloadKey] = (),
        reused: Collection[OffloadKey] = (),
    ) -> None:
        """Apply one finished request's accesses to the policy, at once.

        Args:
            keys: every key the request stored or loaded, head of the prompt first (the first
                key ends up most recent, as with ``touch``). Absent keys are ignored.
            inserted_only: keys this request stored and did not read back.
            reused: ready keys this request loaded (or found already stored).
        """
        if type(self._policy).on_request_finished is CachePolicy.on_request_finished:
            self.touch(keys if keys.__class__ is list else list(keys), req_context)  # type: ignore[attr-defined]
            return
        small = self._small_slots(keys, _SCALAR_LIMIT)
        if small is not None:
            self._policy.on_request_finished_list(
                keys, small, [k in inserted_only for k in keys], [k in reused for k in keys]
            )
            return
        r = self._resolve(keys, allow_duplicates=True)
        if not r.keys:
            return
        ins = np.fromiter((k in inserted_only for k in r.keys), dtype=bool, count=len(r.keys))
        reu = np.fromiter((k in reused for k in r.keys), dtype=bool, count=len(r.keys))
        self._policy.on_request_finished(r.keys, r.slots, ins, reu)
