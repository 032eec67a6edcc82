"""Request hooks: per-request access recording, applied to the cache policy when a request ends.

vLLM's scheduler (0.32+) never calls ``touch``. It tells the manager when a request starts
(``on_new_request``) and ends (``on_request_finished``); in between, the manager records which
blocks the request stored and which ready blocks it read, and applies that recency (and, for
ARC, frequency) in one go at the end -- so blocks of a long request do not age while it runs
and a block a request merely stored is not mistaken for a block used twice.

:class:`RequestHooksManager` adds these hooks to any kvoffload manager stack; the policy work is
done here (:func:`apply_request_access`) over the core manager's narrow request interface:
``key_batch`` (keys checked and resolved once), ``split_present``, ``touch`` and ``policy``
(:class:`~kvoffload.cache.manager.CPUOffloadingManager` has them). Everything else passes
through unchanged with its ``req_context``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from kvoffload.cache.batch import StorePlan
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.cache.stores import store_output
from kvoffload.core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.core.lookup_result import LookupResult, lookup_code
from kvoffload.errors import InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["RequestHooksManager", "apply_request_access"]

_CORE_METHODS = ("key_batch", "split_present", "touch")
#: a key's last 4 bytes: its big-endian KV-cache group index (see core.base.make_offload_key)
_GROUP_SUFFIX = itemgetter(slice(-4, None))
#: request-level calls on at most this many keys (a whole prompt) run scalar code; beyond, numpy
REQUEST_SCALAR_LIMIT = 256


def apply_request_access(
    core: Any,
    keys: Sequence[OffloadKey],
    req_context: ReqContext,
    inserted_only: Collection[bytes] = (),
    reused: Collection[bytes] = (),
) -> None:
    """Apply one finished request's accesses to ``core``'s policy, at once.

    Args:
        core: a :class:`~kvoffload.cache.manager.CPUOffloadingManager` (uses its ``policy``,
            ``key_batch`` and ``touch``).
        keys: every key the request stored or loaded, head of the prompt first (the first key
            ends up most recent, as with ``touch``). Absent keys are ignored.
        inserted_only: keys this request stored and did not read back.
        reused: ready keys this request loaded (or found already stored).
    """
    policy = core.policy
    if type(policy).on_request_finished is CachePolicy.on_request_finished:
        core.touch(keys if keys.__class__ is list else list(keys), req_context)
        return
    batch = core.key_batch(keys, dedup=False, limit=REQUEST_SCALAR_LIMIT)
    if not batch:
        return
    if len(batch) <= REQUEST_SCALAR_LIMIT:
        policy.on_request_finished_list(
            batch, batch.slots, [k in inserted_only for k in batch], [k in reused for k in batch]
        )
        return
    n = len(batch)
    ins = np.fromiter((k in inserted_only for k in batch), dtype=bool, count=n)
    reu = np.fromiter((k in reused for k in batch), dtype=bool, count=n)
    policy.on_request_finished(batch, np.array(batch.slots, dtype=np.int64), ins, reu)


def _plan_of(manager: OffloadingManager) -> Callable[[Sequence[OffloadKey], ReqContext], StorePlan | None]:
    """``store_plan`` for a manager that has only ``prepare_store``."""

    def plan(keys: Sequence[OffloadKey], req_context: ReqContext) -> StorePlan | None:
        out = manager.prepare_store(keys, req_context)
        if out is None:
            return None
        return StorePlan(list(out.keys_to_store), out.store_spec.block_ids, list(out.evicted_keys))  # type: ignore[attr-defined]

    return plan


class _Access:
    """What one request did, in first-seen order."""

    __slots__ = ("keys", "inserted", "reused", "store_misses")

    def __init__(self) -> None:
        self.keys: dict[bytes, None] = {}
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()
        self.store_misses: set[bytes] = set()


class RequestHooksManager(OffloadingManager):
    """Proxy adding ``on_new_request`` / ``on_request_finished`` (vLLM's request hooks) to a manager.

    Recording (per ``req_context.req_id``; calls with an empty ``req_id`` are not recorded):

    * ``prepare_store``: before delegating, the keys absent from the cache that this request
      has not offered yet go to the core policy's ``on_store_miss`` (ARC adapts on ghost hits
      there; a no-op for policies without history); the batch the core resolved (``key_batch``)
      is delegated; afterwards the call's store candidates (the absent keys, minus those a reuse
      filter below holds back: its ``store_candidates``) and the keys already stored and ready
      are recorded for the request -- also when the allocation failed (``None``), as vLLM records
      them before allocating; the keys the call inserted are marked *inserted*, the ready ones
      *reused*.
    * ``prepare_load``: the keys are recorded as *reused* (unless this request inserted them).
    * ``on_request_finished``: the recorded keys, ordered head of the prompt first (by KV-cache
      group, then by token position when ``key_position`` knows every key), go to
      :func:`apply_request_access` with the inserted-only and reused sets; the record is dropped.

    Lookups and ``touch`` record nothing (``touch`` still works as in the seed API).

    Args:
        backing: the manager stack to delegate to (e.g. a ``FilteredReuseManager``).
        core: the manager that owns the cache policy (has ``key_batch``, ``split_present``, ``touch``
            and ``policy``, like :class:`~kvoffload.cache.manager.CPUOffloadingManager`);
            defaults to ``backing``.
    """

    def __init__(self, backing: OffloadingManager, core: Any = None) -> None:
        if not isinstance(backing, OffloadingManager):
            raise InvalidTypeError(f"backing must be an OffloadingManager, got {type(backing).__name__}")
        core = backing if core is None else core
        missing = [m for m in _CORE_METHODS if not callable(getattr(core, m, None))]
        if not isinstance(getattr(core, "policy", None), CachePolicy):
            missing.append("policy")
        if missing:
            raise InvalidTypeError(
                f"core must have {', '.join(_CORE_METHODS)} and a policy; {type(core).__name__} lacks {missing}"
            )
        self._backing = backing
        self._core = core
        self._requests: dict[str, _Access] = {}
        self._select = getattr(backing, "store_candidates", None)  # a reuse filter's (see prepare_store)
        self._plan = getattr(backing, "store_plan", None) or _plan_of(backing)
        self._learns_misses = type(core.policy).on_store_miss is not CachePolicy.on_store_miss

    @property
    def backing(self) -> OffloadingManager:
        """The wrapped manager."""
        return self._backing

    @property
    def num_tracked_requests(self) -> int:
        """Requests with recorded accesses, not finished yet."""
        return len(self._requests)

    def _state(self, req_context: ReqContext) -> _Access | None:
        req_id = getattr(req_context, "req_id", "")
        if not req_id:
            return None
        st = self._requests.get(req_id)
        if st is None:
            st = self._requests[req_id] = _Access()
        return st

    # ------------------------------------------------------------------ hooks
    def on_new_request(self, req_context: ReqContext) -> None:
        """Start recording for ``req_context.req_id`` (a request id seen again starts afresh; the
        record itself is created by the request's first recorded call)."""
        req_id = getattr(req_context, "req_id", "")
        if req_id:
            self._requests.pop(req_id, None)

    def on_request_finished(
        self, req_context: ReqContext, key_position: Callable[[OffloadKey], int | None] | None = None
    ) -> None:
        """Apply the request's recorded accesses to the policy and forget them.

        Args:
            key_position: optional map from a key to the token position where its block ends;
                used to order the keys head first when it knows all of them.
        """
        st = self._requests.pop(getattr(req_context, "req_id", ""), None)
        if st is None or not st.keys:
            return
        keys: list[OffloadKey] = list(st.keys)  # type: ignore[arg-type]
        # head first: by token position when known for every key, ties (blocks of several groups
        # ending at one position) and unknown positions by group, then first-seen order; recorded
        # keys were checked, and their big-endian group index suffix orders as its bytes do
        by_position = None
        if key_position is not None:
            pos = list(map(key_position, keys))
            if None not in pos:
                by_position = dict(zip(keys, pos, strict=True))  # distinct keys
                if len(set(pos)) < len(pos):
                    keys.sort(key=_GROUP_SUFFIX)
                keys.sort(key=by_position.__getitem__)  # type: ignore[arg-type]
        if by_position is None:
            keys.sort(key=_GROUP_SUFFIX)
        inserted_only = st.inserted - st.reused
        apply_request_access(self._core, keys, req_context, inserted_only, st.reused)

    def lookup_result(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """:meth:`lookup` as a four-valued :class:`LookupResult` (never ``RETRY`` here)."""
        return lookup_code(self._backing.lookup(key, req_context))

    # ------------------------------------------------------------------ recorded
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Record, then delegate the batch resolved once by the core (:meth:`key_batch`)."""
        return store_output(self.store_plan(keys, req_context))

    def store_plan(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> StorePlan | None:
        """:meth:`prepare_store` answering the backing's :class:`~kvoffload.cache.batch.StorePlan`."""
        st = self._state(req_context)
        if st is None:
            return self._plan(keys, req_context)  # type: ignore[no-any-return]
        core = self._core
        batch = core.key_batch(keys, dedup=False)
        absent, ready = core.split_present(batch)
        candidates = absent
        if absent and self._select is not None:  # a reuse filter below says which absent keys pass
            passed = set(self._select(batch, req_context))
            candidates = [k for k in absent if k in passed]
        misses = None
        if absent and self._learns_misses:  # the policy learns from store misses (ARC)
            seen = st.store_misses
            misses = [k for k in absent if k not in seen]
            if misses:
                core.policy.on_store_miss(misses)
        out = self._plan(batch, req_context)
        if misses:
            st.store_misses.update(misses)
        if candidates or ready:  # recorded whether or not the allocation succeeded, as vLLM does
            if candidates is absent and len(absent) + len(ready) == len(batch):  # nothing pending, no filter
                st.keys.update(dict.fromkeys(batch))
            else:
                keep = set(candidates).union(ready)
                st.keys.update(dict.fromkeys(k for k in batch if k in keep))
            if out is not None and out.keys:
                st.inserted.update(out.keys)
            if ready:
                st.reused.update(set(ready).difference(st.inserted))
        return out

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = self._backing.prepare_load(keys, req_context)
        st = self._state(req_context)
        if st is not None:
            st.keys.update(dict.fromkeys(keys))
            st.reused.update(set(keys).difference(st.inserted))
        return spec

    # ------------------------------------------------------------------ delegated
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return self._backing.lookup(key, req_context)

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        return self._backing.lookup_batch(keys, req_context)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        self._backing.touch(keys, req_context)

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        self._backing.complete_load(keys, req_context)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        self._backing.complete_store(keys, req_context, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._backing.take_events()

    def get_stats(self) -> Any:
        get = getattr(self._backing, "get_stats", None)
        return None if get is None else get()

    def reset_cache(self) -> None:
        """Reset the backing (if it can) and forget every request's record."""
        reset = getattr(self._backing, "reset_cache", None)
        if reset is not None:
            reset()
        self._requests.clear()

    def shutdown(self) -> None:
        self._requests.clear()
        self._backing.shutdown()

    def __repr__(self) -> str:
        return f"RequestHooksManager(backing={self._backing!r}, tracked_requests={len(self._requests)})"
