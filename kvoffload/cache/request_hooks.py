"""Request hooks: per-request access recording, applied to the cache policy when a request ends.

vLLM's scheduler (0.32+) never calls ``touch``. It tells the manager when a request starts
(``on_new_request``) and ends (``on_request_finished``); in between, the manager records which
blocks the request stored and which ready blocks it read, and applies that recency (and, for
ARC, frequency) in one go at the end -- so blocks of a long request do not age while it runs
and a block a request merely stored is not mistaken for a block used twice.

:class:`RequestHooksManager` adds these hooks to any kvoffload manager stack; the policy work is
done by the core manager's ``peek`` / ``on_store_miss`` / ``apply_request_access``
(:class:`~kvoffload.cache.manager.CPUOffloadingManager` has them). Everything else passes
through unchanged with its ``req_context``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvoffload.core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    get_offload_group_idx,
)
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_MISS, LookupResult, lookup_code
from kvoffload.errors import InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["RequestHooksManager"]

_CORE_METHODS = ("peek_list", "on_store_miss", "apply_request_access")


@dataclass
class _Access:
    """What one request did, in first-seen order."""

    keys: dict[bytes, None] = field(default_factory=dict)
    inserted: set[bytes] = field(default_factory=set)
    reused: set[bytes] = field(default_factory=set)
    store_misses: set[bytes] = field(default_factory=set)


class RequestHooksManager(OffloadingManager):
    """Proxy adding ``on_new_request`` / ``on_request_finished`` (vLLM's request hooks) to a manager.

    Recording (per ``req_context.req_id``; calls with an empty ``req_id`` are not recorded):

    * ``prepare_store``: before delegating, the keys absent from the cache that this request
      has not offered yet go to the core's ``on_store_miss`` (ARC adapts on ghost hits there);
      afterwards the call's store candidates (the absent keys, minus those a reuse filter below
      holds back: its ``store_candidates``) and the keys already stored and ready are recorded
      for the request -- also when the allocation failed (``None``), as vLLM records them
      before allocating; the keys the call inserted are marked *inserted*, the ready ones *reused*.
    * ``prepare_load``: the keys are recorded as *reused* (unless this request inserted them).
    * ``on_request_finished``: the recorded keys, ordered head of the prompt first (by KV-cache
      group, then by token position when ``key_position`` knows every key), go to the core's
      ``apply_request_access`` with the inserted-only and reused sets; the record is dropped.

    Lookups and ``touch`` record nothing (``touch`` still works as in the seed API).

    Args:
        backing: the manager stack to delegate to (e.g. a ``FilteredReuseManager``).
        core: the manager that owns the cache policy (has ``peek_list``, ``on_store_miss`` and
            ``apply_request_access``, like :class:`~kvoffload.cache.manager.CPUOffloadingManager`);
            defaults to ``backing``.
    """

    def __init__(self, backing: OffloadingManager, core: Any = None) -> None:
        if not isinstance(backing, OffloadingManager):
            raise InvalidTypeError(f"backing must be an OffloadingManager, got {type(backing).__name__}")
        core = backing if core is None else core
        missing = [m for m in _CORE_METHODS if not callable(getattr(core, m, None))]
        if missing:
            raise InvalidTypeError(f"core must have {', '.join(_CORE_METHODS)}; {type(core).__name__} lacks {missing}")
        self._backing = backing
        self._core = core
        self._requests: dict[str, _Access] = {}

    @property
    def backing(self) -> OffloadingManager:
        """The wrapped manager."""
        return self._backing

    @property
    def num_tracked_requests(self) -> int:
        """Requests seen and not finished yet."""
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
        """Start recording for ``req_context.req_id`` (a request id seen again starts afresh)."""
        req_id = getattr(req_context, "req_id", "")
        if req_id:
            self._requests[req_id] = _Access()

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
        keys.sort(key=get_offload_group_idx)  # stable: first-seen order inside a group
        if key_position is not None:
            pos = [key_position(k) for k in keys]
            if all(p is not None for p in pos):
                order = sorted(range(len(keys)), key=lambda i: pos[i])  # type: ignore[arg-type,return-value]
                keys = [keys[i] for i in order]
        inserted_only = st.inserted - st.reused
        self._core.apply_request_access(keys, req_context, inserted_only, st.reused)

    def lookup_result(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """:meth:`lookup` as a four-valued :class:`LookupResult` (never ``RETRY`` here)."""
        return lookup_code(self._backing.lookup(key, req_context))

    # ------------------------------------------------------------------ recorded
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        st = self._state(req_context)
        if st is None:
            return self._backing.prepare_store(keys, req_context)
        keys = list(keys)
        core = self._core
        codes = core.peek_list(keys)
        ready = {k for k, c in zip(keys, codes, strict=True) if c == LOOKUP_HIT}
        select = getattr(self._backing, "store_candidates", None)  # a reuse filter below says which pass
        passed = None if select is None or LOOKUP_MISS not in codes else set(select(keys, req_context))
        candidates = {
            k for k, c in zip(keys, codes, strict=True) if c == LOOKUP_MISS and (passed is None or k in passed)
        }
        misses = None
        if getattr(core, "tracks_store_misses", True):
            seen = st.store_misses
            misses = [k for k, c in zip(keys, codes, strict=True) if c == LOOKUP_MISS and k not in seen]
            if misses:
                core.on_store_miss(misses, req_context)
        out = self._backing.prepare_store(keys, req_context)
        if misses:
            st.store_misses.update(misses)
        inserted = set(out.keys_to_store) if out is not None else set()
        if candidates or ready:  # recorded whether or not the allocation succeeded, as vLLM does
            st.keys.update(dict.fromkeys(k for k in keys if k in candidates or k in ready))
            st.inserted |= inserted
            st.reused.update(k for k in ready if k not in st.inserted)
        return out

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = self._backing.prepare_load(keys, req_context)
        st = self._state(req_context)
        if st is not None:
            st.keys.update(dict.fromkeys(keys))
            st.reused.update(k for k in keys if k not in st.inserted)
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
