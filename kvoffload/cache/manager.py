"""The CPU offloading manager: which offloaded blocks live in the host pool (docs/contract.md §2, §3).

:class:`CPUOffloadingManager` keeps its per-slot state in flat arrays
(:class:`~kvoffload.cache.keytable.SlotTable`) and delegates ordering to a pluggable
:class:`~kvoffload.cache.policies.base.CachePolicy` (``lru``, ``arc``, ``s3fifo`` or
``"module:Class"``). Batches are handled with array operations: a call on ``k`` keys costs a
C-level dict pass over the keys plus a fixed number of numpy operations on ``k`` elements,
independent of the pool's capacity. Calls on a few keys (a ``list`` of at most
:data:`~kvoffload.cache.manager_small.SMALL_BATCH`, e.g. one block per request in decode)
take the scalar paths of :mod:`kvoffload.cache.manager_small` instead: a numpy call costs
about a microsecond whatever its size, which would dominate them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from kvoffload.cache import manager_small as _small
from kvoffload.cache.keytable import PENDING
from kvoffload.cache.manager_hooks import RequestAccessMixin
from kvoffload.cache.manager_small import FALLBACK, SMALL_BATCH, cpu_spec, make_lookup
from kvoffload.cache.manager_state import LOOKUP_CODES
from kvoffload.cache.manager_stats import ClosedIndex, OffloadingStats
from kvoffload.checks import check_bool
from kvoffload.core.base import (
    CPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    check_req_context,
    validate_keys,
)
from kvoffload.errors import KeyStateError

logger = logging.getLogger(__name__)

__all__ = ["CPUOffloadingManager", "OffloadingStats"]

#: Medium name of the host pool (``OffloadingEvent.medium``, ``CPULoadStoreSpec.medium()``).
CPU_MEDIUM = CPULoadStoreSpec.medium()
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


class CPUOffloadingManager(RequestAccessMixin, OffloadingManager):
    """Offloading manager for a pool of ``num_blocks`` CPU slots, vLLM semantics (docs/contract.md §2).

    States: a key is absent, *pending* (store in flight: not loadable, not evictable) or
    *ready*; a ready block with ref count > 0 is *pinned* by loads. Slot ids returned in
    specs are CPU block ids ``0..num_blocks-1``: never-used slots first, in increasing
    order, then freed slots last-in-first-out.

    Per-slot state is in numpy/``array`` buffers (see :mod:`kvoffload.cache.keytable`);
    the only per-key Python structure is the ``dict`` key -> slot. Every method validates
    all of its arguments before changing anything (a ``req_context`` that is not a
    :class:`ReqContext` is an ``InvalidTypeError``); a failing call changes nothing.

    Costs (``k`` = keys in the call): one C-level dict pass over the keys (skipped when the
    keys are a slice of a recently looked-up/touched list: translation memo) plus a fixed
    number of numpy operations on ``k`` elements. Recency order is an append-only log with
    lazy deletion (:mod:`kvoffload.cache.policies.order`): touching ``k`` keys appends
    ``k`` entries; evicting ``k`` blocks scans O(k) entries amortised, because blocks found
    pinned or pending at the old end are parked (skipped for good until they become
    evictable again, then re-queued at their old recency position). Neither depends on the
    pool's capacity nor on how many pinned blocks sit at the old end; the log is compacted
    (O(capacity)) at most once per ``capacity`` appends. A ``prepare_store`` that cannot
    make room fails in O(1) (the manager counts evictable blocks exactly). Not thread-safe:
    call it from the scheduler's thread, like vLLM's manager. Calls on at most
    ``SMALL_BATCH`` (32) keys given as a ``list`` run scalar code over the same arrays
    (:mod:`kvoffload.cache.manager_small`), with the same results and errors.

    ``lookup`` is a per-instance closure (same contract as the method below) so that a miss
    costs no more than in a plain ``dict``-based manager. ``lookup_batch`` is the vectorised
    form of ``lookup`` for schedulers that look up a whole prompt at once. A key object that
    is not ``bytes`` but compares equal to a stored key (e.g. a ``memoryview`` of it) is
    treated as that key by lookups; keys that are stored are always exactly ``bytes`` (a
    ``numpy.bytes_`` or a numpy bytes array is refused: numpy drops trailing NUL bytes).

    Args:
        num_blocks: number of CPU slots (``>= 0``; 0 makes every store fail).
        cache_policy: ``"lru"`` (default), ``"arc"``, ``"s3fifo"``, a registered name, or
            an out-of-tree ``"package.module:Class"`` (a
            :class:`~kvoffload.cache.policies.base.CachePolicy` subclass).
        enable_events: record :class:`OffloadingEvent` s, drained by :meth:`take_events`:
            one ``removed=True`` event per ``prepare_store`` that evicted (all its evicted
            keys, in eviction order), one ``removed=False`` event per successful
            ``complete_store`` that made keys ready (just those keys, in call order).

    Raises:
        InvalidTypeError: ``num_blocks`` not an int (bools rejected), ``cache_policy`` not
            a str, ``enable_events`` not a bool.
        InvalidArgumentError: ``num_blocks < 0`` or an unknown policy name.
    """

    def __init__(self, num_blocks: int, cache_policy: str = "lru", enable_events: bool = False) -> None:
        super().__init__(num_blocks, cache_policy, enable_events)
        if type(self).lookup is CPUOffloadingManager.lookup:  # not overridden by a subclass
            self.lookup, self._drain_lookup_counts = make_lookup(self._index, self._ref_buf)  # type: ignore[method-assign,assignment]
            self.lookup.__doc__ = CPUOffloadingManager.lookup.__doc__

    # ------------------------------------------------------------------ lookups
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True if ``key`` is stored and ready, False if absent, None if its store is pending.

        Raises:
            InvalidTypeError: ``key`` is not ``bytes``.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        try:
            s = self._index.get(key)
        except TypeError:  # unhashable
            validate_keys([key], "key")
            raise
        if s is None:
            if key.__class__ is not bytes:
                validate_keys([key], "key")
            self._n_misses += 1
            return False
        if self._ref_buf[s] >= 0:
            self._n_hits += 1
            return True
        self._n_pending_hits += 1
        return None

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Look up many keys at once (duplicates allowed).

        Returns:
            ``np.int8[len(keys)]``: ``LOOKUP_HIT`` (1), ``LOOKUP_MISS`` (0) or
            ``LOOKUP_PENDING`` (2) per key, same as calling :meth:`lookup` on each.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            out = _small.lookup_batch_small(self, keys)  # type: ignore[arg-type]
            if out is not FALLBACK:
                return out  # type: ignore[return-value]
        r = self._resolve(keys, allow_duplicates=True, remember=True)
        n = len(r.keys)
        if n == 0:
            return np.zeros(0, dtype=np.int8)
        slots = r.slots
        st = self._classes(slots)  # FREE never occurs for a present key
        counts = np.bincount(st, minlength=4)
        self._n_hits += int(counts[3])
        self._n_pending_hits += int(counts[2])
        self._n_misses += int(counts[0])
        return LOOKUP_CODES[st]

    # ------------------------------------------------------------------ loads
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Pin ``keys`` (all stored and ready, no repeats) and return their CPU slots.

        Raises:
            KeyStateError: a key is absent or pending (nothing is pinned then).
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            out = _small.prepare_load_small(self, keys)  # type: ignore[arg-type]
            if out is not FALLBACK:
                return out  # type: ignore[return-value]
        r = self._resolve(keys, allow_duplicates=False)
        slots = r.slots
        if len(slots):
            t = self._table
            if int(slots.min()) < 0:
                i = int(np.argmax(slots < 0))
                raise KeyStateError(f"prepare_load: keys[{i}] {r.keys[i]!r} is not stored")
            states = t.ref[slots]
            if int(states.min()) < 0:
                i = int(np.argmax(states < 0))
                raise KeyStateError(f"prepare_load: keys[{i}] {r.keys[i]!r} is not ready (its store is in flight)")
            newly = int(np.count_nonzero(states == 0))
            states += 1
            t.ref[slots] = states
            t.num_evictable -= newly
            t.num_pinned += newly
            self._n_loads += len(slots)
        return cpu_spec(slots)

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` (ref count -1 per occurrence).

        Raises:
            KeyStateError: a key is absent, pending, or not pinned (often enough, counting
                repeats); nothing is unpinned then.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            if _small.complete_load_small(self, keys) is not FALLBACK:  # type: ignore[arg-type]
                return
        r = self._resolve(keys, allow_duplicates=True)
        slots = r.slots
        if len(slots) == 0:
            return
        t = self._table
        if int(slots.min()) < 0:
            i = int(np.argmax(slots < 0))
            raise KeyStateError(f"complete_load: keys[{i}] {r.keys[i]!r} is not stored")
        if r.unique:
            uniq, counts = slots, None
        else:
            uniq, counts = np.unique(slots, return_counts=True)
        states = t.ref[uniq]
        bad = states < (1 if counts is None else counts)
        if bad.any():
            j = int(np.argmax(bad))
            s = int(uniq[j])
            what = "pending" if states[j] == PENDING else f"pinned {int(states[j])} time(s)"
            c = 1 if counts is None else int(counts[j])
            raise KeyStateError(f"complete_load: key {t.keys[s]!r} is {what}, cannot unpin it {c} time(s)")
        if counts is None:
            states -= 1
        else:
            states -= counts.astype(np.int32)
        t.ref[uniq] = states
        freed = uniq[states == 0]
        if len(freed):
            t.num_evictable += len(freed)
            t.num_pinned -= len(freed)
            self._policy.on_evictable(freed)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used; ``keys[0]`` ends up most recent. Absent keys are ignored."""
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            if _small.touch_small(self, keys) is not FALLBACK:  # type: ignore[arg-type]
                return
        r = self._resolve(keys, allow_duplicates=True, remember=True)
        if r.keys:
            self._policy.touch(r.keys, r.slots, unique=r.unique)

    # ------------------------------------------------------------------ stores
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Allocate pending slots for the keys not present yet, evicting if needed.

        Keys already present (ready or pending) are dropped. Only ready, unpinned blocks
        not named in ``keys`` are evicted. All-or-nothing: returns None and changes
        nothing when room cannot be made.

        Raises:
            InvalidTypeError / InvalidArgumentError: non-bytes or repeated keys.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            out = _small.prepare_store_small(self, keys)  # type: ignore[arg-type]
            if out is not FALLBACK:
                return out  # type: ignore[return-value]
        r = self._resolve(keys, allow_duplicates=False)
        keys_l, slots = r.keys, r.slots
        t = self._table
        absent_mask = slots < 0
        n_new = int(np.count_nonzero(absent_mask))
        n_present = len(keys_l) - n_new
        if n_new == 0:
            self._n_stores_skipped += n_present
            return PrepareStoreOutput(keys_to_store=[], store_spec=cpu_spec(np.zeros(0, np.int64)), evicted_keys=[])
        if n_present == 0:
            positions = None
            to_store = keys_l
        else:
            positions = absent_mask.nonzero()[0]
            to_store = [keys_l[i] for i in positions.tolist()]
        need = n_new - t.num_free
        evicted: list[OffloadKey] = []
        if need > 0:
            protected = slots[~absent_mask] if n_present else _EMPTY_I64
            prot_ev = int(np.count_nonzero(t.ref[protected] == 0)) if n_present else 0
            if need > t.num_evictable - prot_ev:
                self._n_stores_failed += len(keys_l)
                return None
            got = self._evict(need, protected)
            if got is None:
                self._n_stores_failed += len(keys_l)
                return None
            evicted = got
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=list(evicted), medium=CPU_MEDIUM, removed=True))
        count_before = t.insert_count
        new_slots = t.allocate(to_store)
        if r.batch is not None:
            t.memo_note_insert(r, np.arange(len(keys_l)) if positions is None else positions, new_slots, count_before)
        self._policy.insert(new_slots, to_store)
        self._n_stores_started += n_new
        self._n_stores_skipped += n_present
        return PrepareStoreOutput(keys_to_store=list(to_store), store_spec=cpu_spec(new_slots), evicted_keys=evicted)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish stores: pending keys become ready (``success``) or are removed (failure).

        Ready keys are untouched and absent keys ignored, in both cases.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if success.__class__ is not bool:
            success = check_bool(success, "success")
        if keys.__class__ is list and len(keys) <= SMALL_BATCH and not self._closed:
            if _small.complete_store_small(self, keys, success) is not FALLBACK:  # type: ignore[arg-type]
                return
        r = self._resolve(keys, allow_duplicates=True)
        slots = r.slots
        if len(slots) == 0 or self.num_blocks == 0:
            return
        t = self._table
        sel_mask = t.ref[slots] == PENDING
        sel_mask &= slots >= 0
        sel = sel_mask.nonzero()[0]
        if len(sel) == 0:
            return
        pend = slots[sel]
        if not r.unique and len(pend) > 1:
            uniq, first = np.unique(pend, return_index=True)
            if len(uniq) != len(pend):
                order = np.sort(first)
                sel = sel[order]
                pend = pend[order]
        if success:
            t.ref[pend] = 0
            t.num_pending -= len(pend)
            t.num_evictable += len(pend)
            self._n_stores_completed += len(pend)
            self._policy.on_evictable(pend)
            if self._events is not None:
                ks = r.keys
                done = [ks[i] for i in sel.tolist()]
                self._events.append(OffloadingEvent(keys=done, medium=CPU_MEDIUM, removed=False))
        else:
            self._policy.remove(pend)
            t.release(pend)
            self._n_stores_aborted += len(pend)

    # ------------------------------------------------------------------ misc
    def shutdown(self) -> None:
        """Release the tables; every later call raises :class:`KeyStateError`. Idempotent."""
        if self._closed:
            return
        self._table.clear()
        self._policy.clear()
        if self._events is not None:
            self._events = []
        self._closed = True
        self._index = ClosedIndex()  # type: ignore[assignment]
        if self._drain_lookup_counts is not None:  # back to the method, which now raises
            self._fold_lookup_counts()
            self._drain_lookup_counts = None
            del self.lookup

    def __repr__(self) -> str:
        t = self._table
        return (
            f"CPUOffloadingManager(num_blocks={self.num_blocks}, cache_policy={self.cache_policy!r}, "
            f"used={t.num_used}, pending={t.num_pending}, pinned={t.num_pinned})"
        )
