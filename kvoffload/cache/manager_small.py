"""Scalar fast paths of :class:`~kvoffload.cache.manager.CPUOffloadingManager`: small batches, per-key lookup.

A scheduler in decode calls the manager with one or a few keys at a time (a request's block
just filled: ``prepare_store([key])``, then ``complete_store([key])``). A numpy call costs
about a microsecond whatever its size, and the array paths make a few dozen of them, so for
up to :data:`SMALL_BATCH` keys given as a ``list`` the manager runs these functions instead:
per-key dict probes and memoryview reads/writes of the same per-slot arrays, and the
policies' ``*_list`` methods. Same semantics, same validation, same statistics as the array
paths (the tests drive both through the same reference model).

Each function returns :data:`FALLBACK` (before changing anything) when its input is not
the plain case -- an item that is not exactly ``bytes``, a repeated key where repeats are
errors, an absent or not-ready key for a load -- and the manager then runs the array path,
which raises the typed error or handles the unusual input.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable

import numpy as np

from kvoffload.cache.keytable import PENDING
from kvoffload.cache.manager_state import ManagerState
from kvoffload.core.base import (
    CPULoadStoreSpec,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    check_req_context,
    validate_keys,
)
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING

logger = logging.getLogger(__name__)

__all__ = ["SMALL_BATCH", "FALLBACK", "cpu_spec", "make_lookup"]

#: Calls on at most this many keys (a ``list``) take the scalar paths of this module.
SMALL_BATCH = 32
#: Returned by the functions below when the array path must handle the call.
FALLBACK = object()

CPU_MEDIUM = CPULoadStoreSpec.medium()


def cpu_spec(slots: np.ndarray) -> CPULoadStoreSpec:
    """A :class:`CPULoadStoreSpec` around ``slots``, a private 1-D ``int64`` array of valid ids.

    The manager's own slot arrays need none of the checks and the copy of the public
    constructor (a few microseconds, most of a small call).
    """
    spec = CPULoadStoreSpec.__new__(CPULoadStoreSpec)
    slots.setflags(write=False)  # specs are immutable (see BlockIDsLoadStoreSpec)
    spec.__dict__["block_ids"] = slots  # the checks of __setattr__ are not needed here
    return spec


def make_lookup(
    index: dict[bytes, int], ref: array
) -> tuple[Callable[[OffloadKey, ReqContext], bool | None], Callable[[], tuple[int, int, int]]]:
    """A per-instance ``lookup`` closure over the key index and the state buffer, and a
    function that returns and resets its (hits, pending hits, misses) counters.

    Same behaviour as :meth:`CPUOffloadingManager.lookup` (True ready, False absent, None
    pending; a non-``bytes`` key that is absent, or a ``req_context`` that is not a
    :class:`ReqContext`, is an ``InvalidTypeError``). Closure cells
    instead of attribute loads on ``self`` make a lookup miss cost no more than a bare
    ``dict.get`` plus one call (the type check a miss needs is then paid for).
    """
    hits = pending = misses = 0
    get = index.get
    context_cls = ReqContext

    def lookup(key: OffloadKey, req_context: ReqContext) -> bool | None:
        nonlocal hits, pending, misses
        if req_context.__class__ is not context_cls:
            check_req_context(req_context)
        try:
            s = get(key)
        except TypeError:  # unhashable
            validate_keys([key], "key")
            raise
        if s is None:
            if key.__class__ is not bytes:
                validate_keys([key], "key")
            misses += 1
            return False
        if ref[s] >= 0:
            hits += 1
            return True
        pending += 1
        return None

    def drain() -> tuple[int, int, int]:
        nonlocal hits, pending, misses
        out = (hits, pending, misses)
        hits = pending = misses = 0
        return out

    return lookup, drain


def _slots_or_fallback(m: ManagerState, keys: list[OffloadKey]) -> list[int | None] | None:
    """Slot (None = absent) of each key, or None when an item is not exactly ``bytes``."""
    get = m._index.get
    out: list[int | None] = []
    for k in keys:
        if k.__class__ is not bytes:
            return None
        out.append(get(k))
    return out


def lookup_batch_small(m: ManagerState, keys: list[OffloadKey]) -> object:
    """:meth:`CPUOffloadingManager.lookup_batch` for a few keys."""
    slots = _slots_or_fallback(m, keys)
    if slots is None:
        return FALLBACK
    ref = m._ref_buf
    codes: list[int] = []
    hits = pend = 0
    for s in slots:
        if s is None:
            codes.append(LOOKUP_MISS)
        elif ref[s] >= 0:
            codes.append(LOOKUP_HIT)
            hits += 1
        else:
            codes.append(LOOKUP_PENDING)
            pend += 1
    m._n_hits += hits
    m._n_pending_hits += pend
    m._n_misses += len(codes) - hits - pend
    return np.array(codes, dtype=np.int8)


def touch_small(m: ManagerState, keys: list[OffloadKey]) -> object:
    """:meth:`CPUOffloadingManager.touch` for a few keys."""
    slots = _slots_or_fallback(m, keys)
    if slots is None:
        return FALLBACK
    m._policy.touch_list(keys, [-1 if s is None else s for s in slots])
    return None


def prepare_store_small(m: ManagerState, keys: list[OffloadKey]) -> object:
    """:meth:`CPUOffloadingManager.prepare_store` for a few keys."""
    n = len(keys)
    slots: list[int | None] | None
    if n == 1:  # the decode-step case: one block per request
        k = keys[0]
        if k.__class__ is not bytes:
            return FALLBACK
        s1 = m._index.get(k)
        slots = [s1]
        to_store = [k] if s1 is None else []
    else:
        slots = _slots_or_fallback(m, keys)
        if slots is None or (n > 1 and len(set(keys)) != n):
            return FALLBACK
        to_store = [k for k, s in zip(keys, slots, strict=True) if s is None]
    n_new = len(to_store)
    n_present = n - n_new
    if n_new == 0:
        m._n_stores_skipped += n_present
        return PrepareStoreOutput(keys_to_store=[], store_spec=cpu_spec(np.zeros(0, dtype=np.int64)), evicted_keys=[])
    t = m._table
    need = n_new - t.num_free
    evicted: list[OffloadKey] = []
    if need > 0:
        protected = [s for s in slots if s is not None]
        ref = m._ref_buf
        prot_ev = 0
        for s in protected:
            if ref[s] == 0:
                prot_ev += 1
        if need > t.num_evictable - prot_ev:
            m._n_stores_failed += n
            return None
        pm = t.prot_mv
        for s in protected:
            pm[s] = 1
        try:
            victims = m._policy.evict_list(need, protected)
        finally:
            for s in protected:
                pm[s] = 0
        if victims is None:
            m._n_stores_failed += n
            return None
        if len(victims) != need:  # pragma: no cover - policy contract violation
            raise RuntimeError(f"policy {m.cache_policy!r} returned {len(victims)} victims, expected {need}")
        m._n_evictions += need
        evicted = t.release_list(victims)
        if m._events is not None:
            m._events.append(OffloadingEvent(keys=list(evicted), medium=CPU_MEDIUM, removed=True))
    new_slots = t.allocate_list(to_store)
    m._policy.insert_list(new_slots, to_store)
    m._n_stores_started += n_new
    m._n_stores_skipped += n_present
    return PrepareStoreOutput(
        keys_to_store=list(to_store),
        store_spec=cpu_spec(np.array(new_slots, dtype=np.int64)),
        evicted_keys=evicted,
    )


def complete_store_small(m: ManagerState, keys: list[OffloadKey], success: bool) -> object:
    """:meth:`CPUOffloadingManager.complete_store` for a few keys (repeats allowed)."""
    ref = m._ref_buf
    sel: list[int]
    done: list[OffloadKey]
    if len(keys) == 1:  # the decode-step case: one block per request
        k = keys[0]
        if k.__class__ is not bytes:
            return FALLBACK
        s1 = m._index.get(k)
        if s1 is None or ref[s1] != PENDING:
            return None
        sel = [s1]
        done = [k]
    else:
        slots = _slots_or_fallback(m, keys)
        if slots is None:
            return FALLBACK
        sel = []
        done = []
        for k, s in zip(keys, slots, strict=True):
            if s is not None and ref[s] == PENDING and s not in sel:
                sel.append(s)
                done.append(k)
        if not sel:
            return None
    t = m._table
    if success:
        for s in sel:
            ref[s] = 0
        t.num_pending -= len(sel)
        t.num_evictable += len(sel)
        m._n_stores_completed += len(sel)
        m._policy.on_evictable_list(sel)
        if m._events is not None:
            m._events.append(OffloadingEvent(keys=done, medium=CPU_MEDIUM, removed=False))
    else:
        m._policy.remove_list(sel)
        t.release_list(sel)
        m._n_stores_aborted += len(sel)
    return None


def prepare_load_small(m: ManagerState, keys: list[OffloadKey]) -> object:
    """:meth:`CPUOffloadingManager.prepare_load` for a few keys (errors: array path)."""
    n = len(keys)
    slots = _slots_or_fallback(m, keys)
    if slots is None or (n > 1 and len(set(keys)) != n):
        return FALLBACK
    ref = m._ref_buf
    for s in slots:
        if s is None or ref[s] < 0:
            return FALLBACK
    t = m._table
    newly = 0
    for s in slots:
        assert s is not None
        r = ref[s]
        if r == 0:
            newly += 1
        ref[s] = r + 1
    t.num_evictable -= newly
    t.num_pinned += newly
    m._n_loads += n
    return cpu_spec(np.array(slots, dtype=np.int64))


def complete_load_small(m: ManagerState, keys: list[OffloadKey]) -> object:
    """:meth:`CPUOffloadingManager.complete_load` for a few keys (repeats allowed; errors: array path)."""
    slots = _slots_or_fallback(m, keys)
    if slots is None:
        return FALLBACK
    ref = m._ref_buf
    counts: dict[int, int] = {}
    for s in slots:
        if s is None:
            return FALLBACK
        counts[s] = counts.get(s, 0) + 1
    for s, c in counts.items():
        if ref[s] < c:
            return FALLBACK
    freed: list[int] = []
    for s, c in counts.items():
        r = ref[s] - c
        ref[s] = r
        if r == 0:
            freed.append(s)
    if freed:
        t = m._table
        t.num_evictable += len(freed)
        t.num_pinned -= len(freed)
        m._policy.on_evictable_list(freed)
    return None
