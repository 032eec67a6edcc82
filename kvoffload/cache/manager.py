"""The CPU offloading manager (docs/contract.md §2, §3): one class calling its parts directly (slot
table, policy, stores, loads, counters, events, optional reuse filter and request log). Each
operation checks its arguments once, then runs scalar code for a ``list`` of at most
:data:`SMALL_BATCH` keys (a numpy call costs ~1 us whatever its size; the completions take a ``set``
too, resolving its keys in the same pass), numpy operations otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from kvoffload.cache.batch import KeyBatch, Resolved, StorePlan
from kvoffload.cache.keytable import BYTES_ONLY, SlotTable
from kvoffload.cache.policies.base import CachePolicy, get_policy_class
from kvoffload.cache.reads import LOOKUP_CODES, Loads, lookup_codes, make_lookup
from kvoffload.cache.requests import RequestLog
from kvoffload.cache.reuse import ReuseFilter
from kvoffload.cache.stats import OffloadingStats
from kvoffload.cache.stores import CPU_MEDIUM, Stores
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
    workload_tag,
)
from kvoffload.errors import InvalidTypeError, KeyStateError

__all__ = ["CPUOffloadingManager", "OffloadingStats", "CPU_MEDIUM", "SMALL_BATCH", "LOOKUP_CODES"]

#: inside an engine, between whose calls numpy's code and data leave the CPU caches, scalar code
#: stays cheaper than numpy calls up to about this many keys (bench_vllm, 256req-1e5: the manager's
#: calls 0.85x the time they take with 32); in a tight loop over the manager alone (bench_manager)
#: numpy wins from about 32 keys
SMALL_BATCH = 96


class CPUOffloadingManager(OffloadingManager):
    """Manager of a pool of ``num_blocks`` CPU slots, vLLM semantics (docs/contract.md §2).

    A key is absent, *pending* (store in flight: neither loadable nor evictable) or *ready*; a
    ready block with ref count > 0 is *pinned* by loads. Slot ids are CPU block ids (never-used
    slots first, in increasing order, then freed ones last-in-first-out). A failing call changes
    nothing. Keys are exactly ``bytes``. A call on ``k`` keys costs O(k) amortised, whatever the
    capacity and the pinned blocks. Not thread-safe.

    Args:
        num_blocks: CPU slots (``>= 0``; 0 makes every store fail).
        cache_policy: ``"lru"`` (default), ``"arc"``, ``"s3fifo"``, a registered name, or
            ``"package.module:Class"`` (a :class:`CachePolicy` subclass).
        enable_events: record :class:`OffloadingEvent` s for :meth:`take_events`: one
            ``removed=True`` event per ``prepare_store`` that evicted (its evicted keys in eviction
            order), one ``removed=False`` event per ``complete_store`` that made keys ready.
        store_threshold: None: store every offered key; an int ``>= 1``: store an absent key once
            counted that many times (:class:`~kvoffload.cache.reuse.ReuseFilter`, configured by
            ``max_tracker_size`` and ``count_on``, ``"lookup"`` or ``"offer"``).
        record_requests: record each request's accesses and apply them to the policy at
            :meth:`on_request_finished` (vLLM's request hooks).

    Raises:
        InvalidTypeError / InvalidArgumentError: a bad argument (bools are not ints), an unknown
            policy, a bad filter setting.
    """

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        *,
        store_threshold: int | None = None,
        max_tracker_size: int = 64_000,
        count_on: str = "lookup",
        record_requests: bool = False,
    ) -> None:
        enable_events = check_bool(enable_events, "enable_events")
        record_requests = check_bool(record_requests, "record_requests")
        policy_cls = get_policy_class(cache_policy)
        reuse = None if store_threshold is None else ReuseFilter(store_threshold, max_tracker_size, count_on)
        self._table = SlotTable(num_blocks)
        self.num_blocks: int = self._table.num_blocks
        self.cache_policy: str = cache_policy
        self._policy: CachePolicy = policy_cls(self.num_blocks, self._table)
        self._lists = self._policy.takes_lists
        self._tags = self._policy.uses_workload
        self._tells_requests = self._policy.uses_requests
        self._tell = self._tags or self._tells_requests
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._counters = OffloadingStats()
        self._stores = Stores(self._table, self._policy, self._counters, self._events)
        self._loads = Loads(self._table, self._policy, self._counters)
        self._reuse = reuse
        self._count_lookup = reuse.count_lookups if reuse is not None and reuse.count_on == "lookup" else None
        self._requests = RequestLog(self._table, self._policy) if record_requests else None
        self._closed = False
        self._ctx: type = ReqContext
        self._lookup = make_lookup(self._table, self._counters, count=self._count_lookup)
        if type(self).lookup is CPUOffloadingManager.lookup:  # one closure call per lookup
            self.lookup = self._lookup  # type: ignore[method-assign,assignment]
            self.lookup.__doc__ = CPUOffloadingManager.lookup.__doc__

    @property
    def policy(self) -> CachePolicy:
        """The policy instance (read-only use)."""
        return self._policy

    @property
    def table(self) -> SlotTable:
        """The slot table (read-only use)."""
        return self._table

    @property
    def reuse(self) -> ReuseFilter | None:
        """The reuse filter (read-only use), None without ``store_threshold``."""
        return self._reuse

    @property
    def num_tracked_requests(self) -> int:
        """Requests recorded, not finished yet (0 without ``record_requests``)."""
        return len(self._requests or ())

    def key_batch(self, keys: Collection[OffloadKey], *, dedup: bool = True) -> KeyBatch:
        """``keys`` checked and resolved to slots once (repeats allowed; with ``dedup`` each key
        once, at its first occurrence), taken as they are by this manager's calls while no key was
        inserted or freed since."""
        t = self._table
        if keys.__class__ is KeyBatch and keys.owner is t and keys.epoch == t.epoch:  # type: ignore[attr-defined]
            if keys.unique or not dedup:  # type: ignore[attr-defined]
                return keys  # type: ignore[return-value]
        ks, slots, r = self._at(keys, True)  # type: ignore[arg-type]
        out = KeyBatch(ks)
        listed: list[int] = slots if r is None else slots.tolist()
        out.unique = (r is not None and r.unique) or len(set(out)) == len(out)
        if dedup and not out.unique:
            first = dict(zip(out, listed, strict=True))  # equal keys have equal slots
            out, listed = KeyBatch(first), list(first.values())
            out.unique = True
        out.slots, out.owner, out.epoch = listed, t, t.epoch
        return out

    def trust_context_class(self, cls: type) -> None:
        """Check contexts of class ``cls`` (an engine's own, with a ``req_id`` field) by the type of
        their ``req_id`` alone."""
        if not isinstance(cls, type):
            raise InvalidTypeError(f"cls must be a class, got {type(cls).__name__}")
        self._ctx = cls

    def _live(self) -> None:
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")

    def _check(self, req_context: ReqContext) -> None:
        if (c := req_context.__class__) is not ReqContext and (
            c is not self._ctx or req_context.req_id.__class__ is not str
        ):
            check_req_context(req_context)

    def _check_tagged(self, req_context: ReqContext) -> None:
        """:meth:`_check`, then the request's workload tag and context set on a policy that reads
        them (before the calls that may read them)."""
        self._check(req_context)
        if self._tell:
            if self._tags:
                self._policy.workload = workload_tag(req_context)
            if self._tells_requests:
                self._policy.request = req_context

    def _at(
        self, keys: Sequence[OffloadKey], repeats: bool, remember: bool = False
    ) -> tuple[Any, Any, Resolved | None]:
        """``(keys, slots, resolved)``: a few keys with a list of slots (``resolved`` None), else the
        checked keys with an ``int64`` array. Raises on a bad key, or a repeat unless ``repeats``."""
        t = self._table
        if keys.__class__ is list:
            if self._closed:
                raise KeyStateError("the CPUOffloadingManager has been shut down")
            if len(keys) <= SMALL_BATCH:  # scalar code, C-level passes; else resolve checks and names
                try:
                    slots = list(map(t.index.get, keys, repeat(-1)))
                except TypeError:  # an unhashable item
                    slots = None
                if (
                    slots is not None
                    and (-1 not in slots or set(map(type, keys)) == BYTES_ONLY)  # absent keys: exact bytes
                    and (repeats or len(keys) < 2 or len(set(keys)) == len(keys))
                ):
                    return keys, slots, None
        elif keys.__class__ is KeyBatch and keys.owner is t and keys.epoch == t.epoch:  # type: ignore[attr-defined]
            if len(keys) <= SMALL_BATCH and (repeats or keys.unique):  # type: ignore[attr-defined]
                return keys, keys.slots, None  # type: ignore[attr-defined]
        elif self._closed:  # (a current batch implies an open manager)
            raise KeyStateError("the CPUOffloadingManager has been shut down")
        r = t.resolve(keys, "keys", allow_duplicates=repeats, remember=remember)
        return r.keys, r.slots, r

    def lookup_function(self, answers: tuple[Any, Any, Any], context_cls: type) -> Callable[[OffloadKey, Any], Any]:
        """:meth:`lookup` answering ``answers`` (ready, absent, pending), taking ``context_cls``
        contexts unchecked, for an engine adapter; valid until :meth:`shutdown`."""
        self._live()
        return make_lookup(self._table, self._counters, answers, context_cls, self._count_lookup)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True if ``key`` is stored and ready, False if absent, None if its store is pending."""
        self._live()
        return self._lookup(key, req_context)  # type: ignore[no-any-return]

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """:meth:`lookup` of each key (repeats allowed) as ``np.int8`` ``LookupCode`` values."""
        self._check(req_context)
        if self._count_lookup is None:
            return self._codes(keys, count=True)
        keys = list(keys)
        codes = self._codes(keys, count=True)
        self._count_lookup(keys, req_context.req_id)
        return codes

    def peek(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        """:meth:`lookup_batch` that counts nothing in the statistics and remembers nothing."""
        return self._codes(keys, count=False)

    def _codes(self, keys: Sequence[OffloadKey], count: bool) -> np.ndarray:
        return lookup_codes(self._table, self._counters if count else None, self._at(keys, True, remember=count)[1])

    def prepare_load(
        self, keys: Sequence[OffloadKey], req_context: ReqContext, *, record_access: bool = True
    ) -> LoadStoreSpec:
        """Pin ``keys`` (distinct, all ready, else :class:`KeyStateError`) and return their slots;
        recorded as the request's reuses unless ``record_access`` is False (an internal read)."""
        return CPULoadStoreSpec(self.load_slots(keys, req_context, record_access=record_access))

    def load_slots(
        self, keys: Sequence[OffloadKey], req_context: ReqContext, *, record_access: bool = True
    ) -> list[int] | np.ndarray:
        """:meth:`prepare_load`'s pinned slots, a list (a few keys) or an ``int64`` array (for an
        engine adapter's own spec type)."""
        self._check(req_context)
        if self._tells_requests:
            self._policy.request = req_context
        ks, slots, _ = self._at(keys, False)
        slots = self._loads.prepare(ks, slots)
        if record_access and self._requests is not None:
            self._requests.read(req_context.req_id, ks)
        return slots

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` once per occurrence (:class:`KeyStateError` if one is not pinned that often)."""
        self._check(req_context)
        if (c := keys.__class__) is list or c is set:  # a few keys: resolved and unpinned in one pass
            if len(keys) <= SMALL_BATCH and not self._closed and self._loads.complete(keys, None, c is set):
                return
        ks, slots, r = self._at(keys, True)
        self._loads.complete(ks, np.asarray(slots, dtype=np.int64), r is not None and r.unique)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used; ``keys[0]`` ends up most recent. Absent keys are ignored."""
        self._check_tagged(req_context)
        ks, slots, r = self._at(keys, True, remember=True)
        if r is None and not self._lists:  # a few keys: an array for a policy that takes only arrays
            slots = np.array(slots, dtype=np.int64)
        if len(slots):
            self._policy.touch(ks, slots, unique=r is not None and r.unique)

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Allocate pending slots for the distinct ``keys`` not present yet (past the reuse filter),
        evicting ready, unpinned blocks not named in ``keys``; None and nothing changed (but the
        filter's counts and the request's record) when room cannot be made."""
        plan = self.store_plan(keys, req_context)
        if plan.slots is None:
            return None
        spec = CPULoadStoreSpec(np.asarray(plan.slots, dtype=np.int64))
        return PrepareStoreOutput(keys_to_store=plan.keys, store_spec=spec, evicted_keys=plan.evicted)

    def store_plan(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> StorePlan:
        """:meth:`prepare_store`'s decision as a :class:`~kvoffload.cache.batch.StorePlan` (for an
        engine adapter's own output type)."""
        self._check_tagged(req_context)
        ks, slots, r = self._at(keys, False)
        plain = self._reuse is None and self._requests is None
        if r is None:
            listed = slots
        elif plain:
            return self._stores.prepare(ks, slots, r)
        else:
            listed = slots.tolist()
        # the absent keys in order (an offer of absent keys only, the common one: copied whole)
        absent = list(ks) if not listed or max(listed) < 0 else [k for k, s in zip(ks, listed) if s < 0]  # noqa: B905
        if plain:
            return self._stores.prepare(ks, slots, None, absent)
        req_id = req_context.req_id
        candidates = absent if self._reuse is None else self._reuse.admit(ks, absent, req_id)
        inserted = self._requests.offer(req_id, ks, listed, candidates) if self._requests is not None else None
        if len(candidates) < len(absent):  # the filter held some back: store the rest
            passed = set(candidates)
            keep = [s >= 0 or k in passed for k, s in zip(ks, listed, strict=True)]
            ks = [k for k, f in zip(ks, keep, strict=True) if f]
            slots = [s for s, f in zip(listed, keep, strict=True) if f] if r is None else slots[np.array(keep)]
            r, absent = None, candidates
        plan = self._stores.prepare(ks, slots, r, absent)
        if inserted is not None and plan.slots is not None:
            inserted.update(plan.keys)
        return plan

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Pending keys become ready (``success``) or are removed; ready and absent keys are ignored."""
        self._check(req_context)
        if success.__class__ is not bool:
            success = check_bool(success, "success")
        if (c := keys.__class__) is list or c is set:  # a few keys: resolved and completed in one pass
            if len(keys) <= SMALL_BATCH and not self._closed and self._stores.complete(keys, None, success, c is set):
                return
        _, slots, r = self._at(keys, True)
        if self.num_blocks:  # else nothing can be pending: checks only
            self._stores.complete((), np.asarray(slots, dtype=np.int64), success, r is not None and r.unique)

    def discard(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """Remove the ready, unpinned ``keys`` (others are left alone) like evicted ones; the keys
        removed, in first-occurrence order."""
        return self._stores.discard(np.asarray(self._at(keys, True)[1], dtype=np.int64))

    def on_new_request(self, req_context: ReqContext) -> None:
        """A request starts (vLLM's hook): a request id seen again starts a fresh record."""
        self._check(req_context)
        if self._requests is not None and req_context.req_id:
            self._requests.start(req_context.req_id)

    def on_request_finished(
        self, req_context: ReqContext, key_position: Callable[[OffloadKey], int | None] | None = None
    ) -> None:
        """Apply the request's recorded accesses to the policy (``key_position``: a key's token
        position) and forget them."""
        self._check_tagged(req_context)
        if self._requests is not None:
            self._requests.finish(req_context.req_id, key_position)

    def take_events(self) -> list[OffloadingEvent]:
        """Drain the events recorded since the last call (always empty without ``enable_events``)."""
        if not self._events:
            return []
        out, self._events[:] = self._events[:], []
        return out

    def take_filtered(self) -> int:
        """Absent keys the reuse filter held back since the previous call or :meth:`get_stats`."""
        return self._reuse.take_skipped() if self._reuse is not None else 0

    def get_stats(self) -> OffloadingStats:
        """Gauges, and the counters since the previous call (``stores_skipped`` with the filter's)."""
        stats = self._counters.drain(self._table)
        stats.stores_skipped += self.take_filtered()
        return stats

    def reset_cache(self) -> None:
        """Drop every block, the policy's history and the requests' records, keeping the filter's
        counts and the statistics (as vLLM); slots restart from 0; no event (docs/contract.md §2)."""
        self._live()
        self._table.clear()
        self._policy.clear()
        if self._requests is not None:
            self._requests.clear()

    def shutdown(self) -> None:
        """Release the tables; every later call raises :class:`KeyStateError`. Idempotent."""
        if self._closed:
            return
        self.reset_cache()
        if self._events is not None:
            self._events.clear()
        self._closed = True
        self.__dict__.pop("lookup", None)  # back to the method, which now raises

    def __len__(self) -> int:
        """Number of keys present (pending or ready)."""
        return self._table.num_used

    def __contains__(self, key: object) -> bool:
        self._live()
        return key in self._table.index

    def __repr__(self) -> str:
        return f"CPUOffloadingManager({self.num_blocks}, {self.cache_policy!r}, used={len(self)})"
