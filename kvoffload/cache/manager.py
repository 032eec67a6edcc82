"""The CPU offloading manager: which offloaded blocks live in the host pool (docs/contract.md §2, §3).

One class, :class:`CPUOffloadingManager`, composed of a slot table (key index and per-slot
state in flat arrays, :mod:`kvoffload.cache.keytable`), a pluggable cache policy (order and
victims, :mod:`kvoffload.cache.policies`), one :class:`~kvoffload.cache.stats.Counters`
object and an event list. Each operation checks its arguments once, at its start, then runs
one of two paths side by side: calls on a few keys (a ``list`` of at most
:data:`SMALL_BATCH`, e.g. one block per request in decode) run scalar code (a numpy call
costs about a microsecond whatever its size, which would dominate them); larger calls run a
fixed number of numpy operations on ``k`` elements after one C-level pass over the keys.
Both paths give the same results, errors and statistics. A
:class:`~kvoffload.cache.keytable.KeyBatch` resolved by :meth:`CPUOffloadingManager.key_batch`
(the outer door of a manager stack) is taken as it is: no second check or key probe.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Collection, Sequence

import numpy as np

from kvoffload.cache.keytable import PENDING, ClosedIndex, KeyBatch, Resolved, SlotTable
from kvoffload.cache.policies.base import CachePolicy, get_policy_class
from kvoffload.cache.request_hooks import apply_request_access
from kvoffload.cache.stats import Counters, OffloadingStats, check_bool
from kvoffload.core.base import (
    LOOKUP_HIT,
    LOOKUP_MISS,
    LOOKUP_PENDING,
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

__all__ = ["CPUOffloadingManager", "OffloadingStats", "CPU_MEDIUM", "SMALL_BATCH", "LOOKUP_CODES"]

#: Medium name of the host pool (``OffloadingEvent.medium``, ``CPULoadStoreSpec.medium()``).
CPU_MEDIUM = CPULoadStoreSpec.medium()
#: Calls on at most this many keys (a ``list``) take the scalar paths.
SMALL_BATCH = 32
#: request-level calls (a whole prompt) on at most this many keys run scalar code
REQUEST_SCALAR_LIMIT = 256
#: lookup code by class (0 absent, 1 unused, 2 pending, 3 ready): ``LOOKUP_CODES[_classes(slots)]``
LOOKUP_CODES = np.array([LOOKUP_MISS, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_HIT], dtype=np.int8)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


def cpu_spec(slots: np.ndarray) -> CPULoadStoreSpec:
    """A :class:`CPULoadStoreSpec` around ``slots``, a private 1-D ``int64`` array of valid ids
    (the manager's own slots need none of the public constructor's checks and copy)."""
    spec = CPULoadStoreSpec.__new__(CPULoadStoreSpec)
    slots.setflags(write=False)  # specs are immutable (see BlockIDsLoadStoreSpec)
    spec.__dict__["block_ids"] = slots
    return spec


def make_lookup(index: dict[bytes, int], ref: array, counters: Counters) -> Callable[[OffloadKey, ReqContext], bool | None]:
    """A per-instance ``lookup`` closure (same contract as :meth:`CPUOffloadingManager.lookup`):
    closure cells instead of attribute loads make a miss cost a ``dict.get`` plus one call."""
    get = index.get
    context_cls = ReqContext

    def lookup(key: OffloadKey, req_context: ReqContext) -> bool | None:
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
            counters.misses += 1
            return False
        if ref[s] >= 0:
            counters.hits += 1
            return True
        counters.pending_hits += 1
        return None

    return lookup


class CPUOffloadingManager(OffloadingManager):
    """Offloading manager for a pool of ``num_blocks`` CPU slots, vLLM semantics (docs/contract.md §2).

    States: a key is absent, *pending* (store in flight: not loadable, not evictable) or
    *ready*; a ready block with ref count > 0 is *pinned* by loads. Slot ids returned in specs
    are CPU block ids ``0..num_blocks-1``: never-used slots first, in increasing order, then
    freed slots last-in-first-out. Every method validates all of its arguments before changing
    anything (a ``req_context`` that is not a :class:`ReqContext` is an ``InvalidTypeError``);
    a failing call changes nothing.

    Costs (``k`` = keys in the call): one C-level dict pass over the keys (skipped for a
    current :class:`KeyBatch`, or keys that are a slice of a recently looked-up/touched list:
    the table's translation memo) plus a fixed number of numpy operations on ``k`` elements.
    Recency order is an append-only log with lazy deletion (:mod:`kvoffload.cache.policies.order`):
    touching or evicting ``k`` blocks is O(k) amortised, independent of capacity and of pinned
    blocks at the old end. A ``prepare_store`` that cannot make room fails in O(1). Not
    thread-safe: call it from the scheduler's thread, like vLLM's manager.

    ``lookup`` is a per-instance closure (same contract as the method) so that a miss costs no
    more than in a plain ``dict``-based manager. A key object that is not ``bytes`` but compares
    equal to a stored key (e.g. a ``memoryview`` of it) is treated as that key by lookups; keys
    that are stored are always exactly ``bytes`` (a ``numpy.bytes_`` or a numpy bytes array is
    refused: numpy drops trailing NUL bytes).

    Args:
        num_blocks: number of CPU slots (``>= 0``; 0 makes every store fail).
        cache_policy: ``"lru"`` (default), ``"arc"``, ``"s3fifo"``, a registered name, or an
            out-of-tree ``"package.module:Class"`` (a :class:`CachePolicy` subclass).
        enable_events: record :class:`OffloadingEvent` s, drained by :meth:`take_events`: one
            ``removed=True`` event per ``prepare_store`` that evicted (its evicted keys, in
            eviction order), one ``removed=False`` event per successful ``complete_store`` that
            made keys ready (just those keys, in call order).

    Raises:
        InvalidTypeError: ``num_blocks`` not an int (bools rejected), ``cache_policy`` not a
            str, ``enable_events`` not a bool.
        InvalidArgumentError: ``num_blocks < 0`` or an unknown policy name.
    """

    def __init__(self, num_blocks: int, cache_policy: str = "lru", enable_events: bool = False) -> None:
        enable_events = check_bool(enable_events, "enable_events")
        policy_cls = get_policy_class(cache_policy)
        self._table = SlotTable(num_blocks)
        self.num_blocks: int = self._table.num_blocks
        self.cache_policy: str = cache_policy
        self._policy: CachePolicy = policy_cls(self.num_blocks, self._table)
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._counters = Counters()
        self._closed = False
        self._index: dict[bytes, int] = self._table.index
        self._ref = self._table.ref_buf
        if type(self).lookup is CPUOffloadingManager.lookup:  # not overridden by a subclass
            self.lookup = make_lookup(self._index, self._ref, self._counters)  # type: ignore[method-assign]
            self.lookup.__doc__ = CPUOffloadingManager.lookup.__doc__

    @property
    def policy(self) -> CachePolicy:
        """The policy instance (read-only use)."""
        return self._policy

    @property
    def table(self) -> SlotTable:
        """The slot table (read-only use)."""
        return self._table

    # ------------------------------------------------------------------ the door
    def key_batch(self, keys: Collection[OffloadKey], *, dedup: bool = True) -> KeyBatch:
        """Validate ``keys`` and resolve them to slots once (repeats reduced to their first
        occurrence with ``dedup``); every layer of a stack over this manager, and this manager,
        take the result as it is while no key was inserted or freed since.

        Raises:
            InvalidTypeError: a key is not ``bytes``; KeyStateError: after :meth:`shutdown`.
        """
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        return self._table.key_batch(keys, dedup=dedup)

    def _small(self, keys: Sequence[OffloadKey], limit: int = 0) -> list[int] | None:
        """Slot (-1 = absent) per key of a few plain keys; None: the call takes the array path."""
        if keys.__class__ is KeyBatch:
            t = self._table
            if keys.owner is t and keys.epoch == t.epoch and len(keys) <= (limit or SMALL_BATCH):  # type: ignore[attr-defined]
                return keys.slots  # type: ignore[attr-defined,no-any-return]
            return None
        if keys.__class__ is not list or len(keys) > (limit or SMALL_BATCH) or self._closed:
            return None
        get = self._index.get
        out = []
        for k in keys:
            if k.__class__ is not bytes:
                return None
            s = get(k)
            out.append(-1 if s is None else s)
        return out

    @staticmethod
    def _distinct(keys: Sequence[OffloadKey]) -> bool:
        if len(keys) < 2 or (keys.__class__ is KeyBatch and keys.unique):  # type: ignore[attr-defined]
            return True
        return len(set(keys)) == len(keys)

    def _resolve(self, keys: Sequence[OffloadKey], allow_duplicates: bool, remember: bool = False) -> Resolved:
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        return self._table.resolve(keys, "keys", allow_duplicates=allow_duplicates, remember=remember)

    # ------------------------------------------------------------------ lookups
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True if ``key`` is stored and ready, False if absent, None if its store is pending.

        Raises:
            InvalidTypeError: ``key`` is not ``bytes``.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        return make_lookup(self._index, self._ref, self._counters)(key, req_context)  # type: ignore[arg-type]

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Look up many keys at once (duplicates allowed).

        Returns:
            ``np.int8[len(keys)]``: ``LOOKUP_HIT`` (1), ``LOOKUP_MISS`` (0) or ``LOOKUP_PENDING``
            (2) per key, same as calling :meth:`lookup` on each.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        return self._codes(keys, count=True)

    def peek(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        """:meth:`lookup_batch` that counts nothing in the statistics and remembers nothing."""
        return self._codes(keys, count=False)

    def peek_list(self, keys: Sequence[OffloadKey]) -> list[int]:
        """:meth:`peek` as a list of ints (cheaper for a few keys)."""
        small = self._small(keys)
        return self._codes(keys, count=False).tolist() if small is None else self._small_codes(small)

    def _small_codes(self, slots: list[int]) -> list[int]:
        ref = self._ref
        return [LOOKUP_MISS if s < 0 else (LOOKUP_HIT if ref[s] >= 0 else LOOKUP_PENDING) for s in slots]

    def _codes(self, keys: Sequence[OffloadKey], count: bool) -> np.ndarray:
        small = self._small(keys)
        if small is not None:
            codes = self._small_codes(small)
            if count:
                c = self._counters
                hits, pend = codes.count(LOOKUP_HIT), codes.count(LOOKUP_PENDING)
                c.hits += hits
                c.pending_hits += pend
                c.misses += len(codes) - hits - pend
            return np.array(codes, dtype=np.int8)
        r = self._resolve(keys, allow_duplicates=True, remember=count)
        if not r.keys:
            return np.zeros(0, dtype=np.int8)
        st = self._classes(r.slots)  # FREE never occurs for a present key
        if count:
            counts = np.bincount(st, minlength=4)
            c = self._counters
            c.hits += int(counts[3])
            c.pending_hits += int(counts[2])
            c.misses += int(counts[0])
        return LOOKUP_CODES[st]

    def _classes(self, slots: np.ndarray) -> np.ndarray:
        """Per slot (``-1``: absent key), its class: 0 absent, 2 pending, 3 ready (a new array)."""
        st = self._table.ref[slots] if self.num_blocks else np.zeros(len(slots), dtype=np.int32)
        np.minimum(st, 0, out=st)
        st += 3
        st[slots < 0] = 0
        return st

    # ------------------------------------------------------------------ loads
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Pin ``keys`` (all stored and ready, no repeats) and return their CPU slots.

        Raises:
            KeyStateError: a key is absent or pending (nothing is pinned then).
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        t = self._table
        small = self._small(keys)
        if small is not None and self._distinct(keys):
            ref = self._ref
            if all(s >= 0 and ref[s] >= 0 for s in small):  # else the array path raises
                newly = 0
                for s in small:
                    r = ref[s]
                    newly += r == 0
                    ref[s] = r + 1
                t.num_evictable -= newly
                t.num_pinned += newly
                self._counters.loads += len(small)
                return cpu_spec(np.array(small, dtype=np.int64))
        r = self._resolve(keys, allow_duplicates=False)
        slots = r.slots
        if len(slots):
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
            self._counters.loads += len(slots)
        return cpu_spec(slots)

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` (ref count -1 per occurrence).

        Raises:
            KeyStateError: a key is absent, pending, or not pinned (often enough, counting
                repeats); nothing is unpinned then.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        t = self._table
        small = self._small(keys)
        if small is not None:
            ref = self._ref
            counts: dict[int, int] = {}
            for s in small:
                counts[s] = counts.get(s, 0) + 1
            if all(s >= 0 and ref[s] >= c for s, c in counts.items()):  # else the array path raises
                freed = []
                for s, c in counts.items():
                    ref[s] -= c
                    if ref[s] == 0:
                        freed.append(s)
                if freed:
                    t.num_evictable += len(freed)
                    t.num_pinned -= len(freed)
                    self._policy.on_evictable_list(freed)
                return
        r = self._resolve(keys, allow_duplicates=True)
        slots = r.slots
        if len(slots) == 0:
            return
        if int(slots.min()) < 0:
            i = int(np.argmax(slots < 0))
            raise KeyStateError(f"complete_load: keys[{i}] {r.keys[i]!r} is not stored")
        uniq, cnt = (slots, None) if r.unique else np.unique(slots, return_counts=True)
        states = t.ref[uniq]
        bad = states < (1 if cnt is None else cnt)
        if bad.any():
            j = int(np.argmax(bad))
            s = int(uniq[j])
            what = "pending" if states[j] == PENDING else f"pinned {int(states[j])} time(s)"
            c = 1 if cnt is None else int(cnt[j])
            raise KeyStateError(f"complete_load: key {t.keys[s]!r} is {what}, cannot unpin it {c} time(s)")
        states -= 1 if cnt is None else cnt.astype(np.int32)
        t.ref[uniq] = states
        freed_a = uniq[states == 0]
        if len(freed_a):
            t.num_evictable += len(freed_a)
            t.num_pinned -= len(freed_a)
            self._policy.on_evictable(freed_a)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used; ``keys[0]`` ends up most recent. Absent keys are ignored."""
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        small = self._small(keys)
        if small is not None:
            self._policy.touch_list(keys, small)
            return
        r = self._resolve(keys, allow_duplicates=True, remember=True)
        if r.keys:
            self._policy.touch(r.keys, r.slots, unique=r.unique)

    # ------------------------------------------------------------------ stores
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Allocate pending slots for the keys not present yet, evicting if needed.

        Keys already present (ready or pending) are dropped. Only ready, unpinned blocks not
        named in ``keys`` are evicted. All-or-nothing: returns None and changes nothing when
        room cannot be made.

        Raises:
            InvalidTypeError / InvalidArgumentError: non-bytes or repeated keys.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        small = self._small(keys)
        if small is not None and self._distinct(keys):
            return self._store_small(keys, small)
        r = self._resolve(keys, allow_duplicates=False)
        keys_l, slots = r.keys, r.slots
        absent_mask = slots < 0
        n_new = int(np.count_nonzero(absent_mask))
        n_present = len(keys_l) - n_new
        if n_new == 0:
            return self._stored([], np.zeros(0, dtype=np.int64), [], n_present)
        if n_present == 0:
            positions = None
            to_store = keys_l
        else:
            positions = absent_mask.nonzero()[0]
            to_store = [keys_l[i] for i in positions.tolist()]
        protected = slots[~absent_mask] if n_present else _EMPTY_I64
        evicted = self._make_room(n_new, protected, len(keys_l))
        if evicted is None:
            return None
        t = self._table
        count_before = t.insert_count
        new_slots = t.allocate(to_store)
        t.memo_note_insert(r, np.arange(len(keys_l)) if positions is None else positions, new_slots, count_before)
        self._policy.insert(new_slots, to_store)
        return self._stored(to_store, new_slots, evicted, n_present)

    def _store_small(self, keys: Sequence[OffloadKey], slots: list[int]) -> PrepareStoreOutput | None:
        to_store = [k for k, s in zip(keys, slots, strict=True) if s < 0]
        protected = [s for s in slots if s >= 0]
        if not to_store:
            return self._stored([], np.zeros(0, dtype=np.int64), [], len(protected))
        evicted = self._make_room(len(to_store), protected, len(keys))
        if evicted is None:
            return None
        new_slots = self._table.allocate_list(to_store)
        self._policy.insert_list(new_slots, to_store)
        return self._stored(to_store, np.array(new_slots, dtype=np.int64), evicted, len(protected))

    def _make_room(self, n_new: int, protected: np.ndarray | list[int], n_keys: int) -> list[OffloadKey] | None:
        """Evict for ``n_new`` slots, sparing ``protected`` (slots); the evicted keys, or None
        (nothing changed, the store counted failed) when room cannot be made."""
        t = self._table
        need = n_new - t.num_free
        if n_new == 0 or need <= 0:
            return []
        scalar = protected.__class__ is list
        if not len(protected):
            prot_ev = 0
        elif scalar:
            ref = self._ref
            prot_ev = sum(1 for s in protected if ref[s] == 0)
        else:
            prot_ev = int(np.count_nonzero(t.ref[protected] == 0))
        victims = None
        if need <= t.num_evictable - prot_ev:
            mark = t.prot_mv if scalar else t.prot_mark
            for s in protected:
                mark[s] = 1
            try:
                if scalar:
                    victims = self._policy.evict_list(need, protected)  # type: ignore[arg-type]
                else:
                    victims = self._policy.evict(need, protected)  # type: ignore[arg-type]
            finally:
                for s in protected:
                    mark[s] = 0
        if victims is None:
            self._counters.stores_failed += n_keys
            return None
        if len(victims) != need:  # pragma: no cover - policy contract violation
            raise RuntimeError(f"policy {self.cache_policy!r} returned {len(victims)} victims, expected {need}")
        self._counters.evictions += need
        evicted = t.release_list(victims) if scalar else t.release(victims, ready=True)  # type: ignore[arg-type]
        if self._events is not None:
            self._events.append(OffloadingEvent(keys=list(evicted), medium=CPU_MEDIUM, removed=True))
        return evicted

    def _stored(
        self, to_store: list[OffloadKey], slots: np.ndarray, evicted: list[OffloadKey], n_present: int
    ) -> PrepareStoreOutput:
        c = self._counters
        c.stores_started += len(to_store)
        c.stores_skipped += n_present
        return PrepareStoreOutput(keys_to_store=list(to_store), store_spec=cpu_spec(slots), evicted_keys=evicted)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish stores: pending keys become ready (``success``) or are removed (failure).

        Ready keys are untouched and absent keys ignored, in both cases.
        """
        if req_context.__class__ is not ReqContext:
            check_req_context(req_context)
        if success.__class__ is not bool:
            success = check_bool(success, "success")
        small = self._small(keys)
        if small is not None:
            ref = self._ref
            sel: list[int] = []
            done: list[OffloadKey] = []
            for k, s in zip(keys, small, strict=True):
                if s >= 0 and ref[s] == PENDING and s not in sel:
                    sel.append(s)
                    done.append(k)
            if sel:
                self._finish_stores(sel, done, success)
            return
        r = self._resolve(keys, allow_duplicates=True)
        slots = r.slots
        if len(slots) == 0 or self.num_blocks == 0:
            return
        sel_mask = self._table.ref[slots] == PENDING
        sel_mask &= slots >= 0
        idx = sel_mask.nonzero()[0]
        if len(idx) == 0:
            return
        pend = slots[idx]
        if not r.unique and len(pend) > 1:
            uniq, first = np.unique(pend, return_index=True)
            if len(uniq) != len(pend):
                order = np.sort(first)
                idx, pend = idx[order], pend[order]
        self._finish_stores(pend, [r.keys[i] for i in idx.tolist()] if self._events is not None else [], success)

    def _finish_stores(self, pend: np.ndarray | list[int], done: list[OffloadKey], success: bool) -> None:
        """Make the pending slots ``pend`` (keys ``done``) ready, or remove them."""
        t = self._table
        scalar = pend.__class__ is list
        if success:
            if scalar:
                for s in pend:
                    self._ref[s] = 0
                self._policy.on_evictable_list(pend)  # type: ignore[arg-type]
            else:
                t.ref[pend] = 0
                self._policy.on_evictable(pend)  # type: ignore[arg-type]
            t.num_pending -= len(pend)
            t.num_evictable += len(pend)
            self._counters.stores_completed += len(pend)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=done, medium=CPU_MEDIUM, removed=False))
        else:
            if scalar:
                self._policy.remove_list(pend)  # type: ignore[arg-type]
                t.release_list(pend)  # type: ignore[arg-type]
            else:
                self._policy.remove(pend)  # type: ignore[arg-type]
                t.release(pend)  # type: ignore[arg-type]
            self._counters.stores_aborted += len(pend)

    # ------------------------------------------------------------------ request-scoped engines
    def discard(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """Remove the ready, unpinned ``keys`` (e.g. blocks whose bytes could not be read back).

        Pinned, pending and absent keys are left alone. The slots are freed like evicted ones;
        with events enabled one ``removed=True`` event lists the removed keys.

        Returns:
            The keys removed, in first-occurrence order.
        """
        r = self._resolve(keys, allow_duplicates=True)
        slots = [s for s in dict.fromkeys(r.slots.tolist()) if s >= 0]
        arr = np.array(slots, dtype=np.int64)
        arr = arr[self._table.ref[arr] == 0] if slots else arr
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
        """Apply one finished request's accesses to the policy at once
        (:func:`kvoffload.cache.request_hooks.apply_request_access`)."""
        apply_request_access(self, keys, req_context, inserted_only, reused)

    # ------------------------------------------------------------------ events, stats, lifecycle
    def take_events(self) -> list[OffloadingEvent]:
        """Drain the events recorded since the last call (always empty without ``enable_events``)."""
        if not self._events:
            return []
        out, self._events = self._events, []
        return out

    def get_stats(self) -> OffloadingStats:
        """Current gauges and the counters accumulated since the previous call (then reset)."""
        t = self._table
        n = self.num_blocks
        stats = OffloadingStats(
            num_blocks=n,
            num_used=t.num_used,
            num_pending=t.num_pending,
            num_pinned=t.num_pinned,
            usage=t.num_used / n if n else 0.0,
            write_usage=t.num_pending / n if n else 0.0,
        )
        return self._counters.drain_into(stats)

    def reset_cache(self) -> None:
        """Drop every block (pending and pinned ones too) and the policy's history.

        Slot allocation restarts from slot 0. No event is emitted (docs/contract.md §2 defines
        events for stores and evictions only); event consumers should treat a reset as "all
        cleared". Statistics counters are kept.
        """
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        self._table.clear()
        self._policy.clear()

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
        self.__dict__.pop("lookup", None)  # back to the method, which now raises

    def __len__(self) -> int:
        """Number of keys present (pending or ready)."""
        return self._table.num_used

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __repr__(self) -> str:
        t = self._table
        return (
            f"CPUOffloadingManager(num_blocks={self.num_blocks}, cache_policy={self.cache_policy!r}, "
            f"used={t.num_used}, pending={t.num_pending}, pinned={t.num_pinned})"
        )
