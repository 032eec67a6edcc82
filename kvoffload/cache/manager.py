"""The CPU offloading manager: which offloaded blocks live in the host pool (docs/contract.md §2, §3).

One class composed of a slot table (:mod:`~kvoffload.cache.keytable`), a cache policy
(:mod:`~kvoffload.cache.policies`), one :class:`~kvoffload.cache.stats.Counters`, an event list,
its :class:`~kvoffload.cache.stores.Stores` (stores and evictions) and its
:class:`~kvoffload.cache.loads.Loads` (pins and unpins). Each operation checks its arguments once, at
its start, then runs one of two paths side by side: a few keys (a ``list`` of at most
:data:`SMALL_BATCH`, e.g. one block per request in decode) take scalar code, since a numpy call
costs about a microsecond whatever its size; larger calls a fixed number of numpy operations.
Both give the same results, errors and statistics. A :class:`~kvoffload.cache.batch.KeyBatch`
from :meth:`CPUOffloadingManager.key_batch` (the outer door of a manager stack) is taken as it
is: no second check or key probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from kvoffload.cache.batch import KeyBatch, Resolved, StorePlan
from kvoffload.cache.keytable import ClosedIndex, SlotTable
from kvoffload.cache.loads import Loads
from kvoffload.cache.lookups import LOOKUP_CODES, make_lookup, slot_classes, small_codes
from kvoffload.cache.policies.base import CachePolicy, get_policy_class
from kvoffload.cache.stats import Counters, OffloadingStats
from kvoffload.cache.stores import CPU_MEDIUM, Stores, store_output
from kvoffload.checks import check_bool
from kvoffload.core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    check_req_context,
)
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_PENDING
from kvoffload.errors import InvalidTypeError, KeyStateError

logger = logging.getLogger(__name__)

__all__ = ["CPUOffloadingManager", "OffloadingStats", "CPU_MEDIUM", "SMALL_BATCH", "LOOKUP_CODES"]

#: Calls on at most this many keys (a ``list``) take the scalar paths.
SMALL_BATCH = 32


class CPUOffloadingManager(OffloadingManager):
    """Offloading manager for a pool of ``num_blocks`` CPU slots, vLLM semantics (docs/contract.md §2).

    States: a key is absent, *pending* (store in flight: not loadable, not evictable) or
    *ready*; a ready block with ref count > 0 is *pinned* by loads. Slot ids returned in specs
    are CPU block ids ``0..num_blocks-1``: never-used slots first, in increasing order, then
    freed slots last-in-first-out. Every method validates all of its arguments before changing
    anything (a ``req_context`` that is not a :class:`ReqContext` is an ``InvalidTypeError``);
    a failing call changes nothing.

    Costs (``k`` keys): one C-level dict pass over the keys (none for a current
    :class:`KeyBatch` or a slice of a recently looked-up/touched list: the table's memo) plus a
    fixed number of numpy operations on ``k`` elements; touching or evicting ``k`` blocks is
    O(k) amortised (:mod:`kvoffload.cache.policies.order`), independent of capacity and of
    pinned blocks; a ``prepare_store`` that cannot make room fails in O(1). Not thread-safe.

    ``lookup`` is a per-instance closure (same contract as the method): a miss costs no more
    than in a plain ``dict``-based manager. A key that is not ``bytes`` but equals a stored key
    (e.g. a ``memoryview`` of it) is that key for lookups; stored keys are exactly ``bytes``
    (``numpy.bytes_`` and numpy bytes arrays are refused: numpy drops trailing NUL bytes).

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
        self._stores = Stores(self._table, self._policy, self._counters, self._events)
        self._loads = Loads(self._table, self._policy, self._counters)
        self._closed = False
        self._ctx: type = ReqContext  # see trust_context_class
        self._index: dict[bytes, int] = self._table.index
        self._ref = self._table.ref_buf
        if type(self).lookup is CPUOffloadingManager.lookup:  # not overridden by a subclass
            self.lookup = make_lookup(self._index, self._ref, self._counters)  # type: ignore[method-assign,assignment]
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
    def key_batch(
        self, keys: Collection[OffloadKey], *, dedup: bool = True, limit: int = SMALL_BATCH, distinct: bool = False
    ) -> KeyBatch:
        """Validate ``keys`` and resolve them to slots once (repeats reduced to their first
        occurrence with ``dedup``); every layer of a stack over this manager, and this manager,
        take the result as it is while no key was inserted or freed since. A ``list`` of at
        most ``limit`` keys is resolved with scalar code. ``distinct``: the caller knows the
        keys have no repeats (e.g. keys recorded from earlier batches), so that is not checked.

        Raises:
            InvalidTypeError: a key is not ``bytes``; KeyStateError: after :meth:`shutdown`.
        """
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        return self._table.key_batch(keys, dedup=dedup, limit=limit, distinct=distinct)

    def trust_context_class(self, cls: type) -> None:
        """Check contexts of class ``cls`` (an engine's own, e.g. vLLM's ``ReqContext``) by their
        ``req_id`` alone: its class has the field, so one attribute test replaces the general
        :func:`~kvoffload.core.base.check_req_context` on every call."""
        if not isinstance(cls, type):
            raise InvalidTypeError(f"cls must be a class, got {type(cls).__name__}")
        self._ctx = cls

    def _small(self, keys: Sequence[OffloadKey], limit: int = 0) -> list[int] | None:
        """Slot (-1 = absent) per key of a few plain keys; None: the call takes the array path."""
        return None if self._closed else self._table.small_slots(keys, limit or SMALL_BATCH)

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
    def lookup_function(self, answers: tuple[Any, Any, Any], context_cls: type) -> Callable[[OffloadKey, Any], Any]:
        """A ``lookup`` for an engine adapter: same checks and statistics as :meth:`lookup`, answering
        ``answers`` (ready, absent, pending) and taking ``context_cls`` contexts unchecked. Valid
        until :meth:`shutdown`."""
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        return make_lookup(self._index, self._ref, self._counters, answers, context_cls)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True if ``key`` is stored and ready, False if absent, None if its store is pending.

        Raises:
            InvalidTypeError: ``key`` is not ``bytes``.
        """
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        return make_lookup(self._index, self._ref, self._counters)(key, req_context)  # type: ignore[arg-type]

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Look up many keys at once (duplicates allowed).

        Returns:
            ``np.int8[len(keys)]``: ``LOOKUP_HIT`` (1), ``LOOKUP_MISS`` (0) or ``LOOKUP_PENDING``
            (2) per key, same as calling :meth:`lookup` on each.
        """
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        return self._codes(keys, count=True)

    def peek(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        """:meth:`lookup_batch` that counts nothing in the statistics and remembers nothing."""
        return self._codes(keys, count=False)

    def peek_list(self, keys: Sequence[OffloadKey]) -> list[int]:
        """:meth:`peek` as a list of ints (cheaper for a few keys)."""
        small = self._small(keys)
        return self._codes(keys, count=False).tolist() if small is None else small_codes(self._ref, small)

    def split_present(self, batch: KeyBatch) -> tuple[list[OffloadKey], list[OffloadKey]]:
        """The absent keys and the ready keys of ``batch`` (from :meth:`key_batch`), each in batch
        order; pending keys are in neither. Counts and changes nothing."""
        t = self._table
        if batch.owner is not t or batch.epoch != t.epoch:  # stale: resolve again
            batch = self.key_batch(list(batch), dedup=False)
        ref = self._ref
        absent, _ = batch.presence()
        if len(absent) == len(batch):
            return absent, []
        ready = [k for k, s in zip(batch, batch.slots, strict=True) if s >= 0 and ref[s] >= 0]
        return absent, ready

    def _codes(self, keys: Sequence[OffloadKey], count: bool) -> np.ndarray:
        small = self._small(keys)
        if small is not None:
            codes = small_codes(self._ref, small)
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
        st = slot_classes(self._table.ref, r.slots)  # FREE never occurs for a present key
        if count:
            counts = np.bincount(st, minlength=4)
            c = self._counters
            c.hits += int(counts[3])
            c.pending_hits += int(counts[2])
            c.misses += int(counts[0])
        return LOOKUP_CODES[st]

    # ------------------------------------------------------------------ loads
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Pin ``keys`` (all stored and ready, no repeats) and return their CPU slots.

        Raises:
            KeyStateError: a key is absent or pending (nothing is pinned then).
        """
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        small = self._small(keys)
        if small is not None and self._distinct(keys):
            spec = self._loads.prepare_small(small)
            if spec is not None:
                return spec
        return self._loads.prepare(self._resolve(keys, allow_duplicates=False))

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` (ref count -1 per occurrence).

        Raises:
            KeyStateError: a key is absent, pending, or not pinned (often enough, counting
                repeats); nothing is unpinned then.
        """
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        small = self._small(keys)
        if small is not None and self._loads.complete_small(small):
            return
        self._loads.complete(self._resolve(keys, allow_duplicates=True))

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used; ``keys[0]`` ends up most recent. Absent keys are ignored."""
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
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
        return store_output(self.store_plan(keys, req_context))

    def store_plan(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> StorePlan | None:
        """:meth:`prepare_store` answering a :class:`~kvoffload.cache.batch.StorePlan` (the same
        decision, before it is wrapped in an output type: engine adapters wrap it in theirs)."""
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        small = self._small(keys)
        if small is not None and self._distinct(keys):
            return self._stores.prepare_small(keys, small)
        return self._stores.prepare(self._resolve(keys, allow_duplicates=False))

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish stores: pending keys become ready (``success``) or are removed (failure).

        Ready keys are untouched and absent keys ignored, in both cases.
        """
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)
        if success.__class__ is not bool:
            success = check_bool(success, "success")
        small = self._small(keys)
        if small is not None:
            self._stores.complete_small(keys, small, success)
        elif self.num_blocks:
            self._stores.complete(self._resolve(keys, allow_duplicates=True), success)
        else:
            self._resolve(keys, allow_duplicates=True)  # checks only: nothing can be pending

    # ------------------------------------------------------------------ request-scoped engines
    def discard(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """Remove the ready, unpinned ``keys`` (e.g. blocks whose bytes could not be read back).

        Pinned, pending and absent keys are left alone. The slots are freed like evicted ones;
        with events enabled one ``removed=True`` event lists the removed keys.

        Returns:
            The keys removed, in first-occurrence order.
        """
        return self._stores.discard(self._resolve(keys, allow_duplicates=True))

    # ------------------------------------------------------------------ events, stats, lifecycle
    def take_events(self) -> list[OffloadingEvent]:
        """Drain the events recorded since the last call (always empty without ``enable_events``)."""
        if not self._events:
            return []
        out = list(self._events)
        self._events.clear()
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
            self._events.clear()
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
