"""State and shared helpers of :class:`~kvoffload.cache.manager.CPUOffloadingManager`.

:class:`ManagerState` owns what both the manager's array paths and its scalar small-batch paths
(:mod:`kvoffload.cache.manager_small`) work on: the slot table, the policy, the event list and
the statistics counters. The public methods live in :mod:`kvoffload.cache.manager`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from kvoffload.cache.keytable import Resolved, SlotTable
from kvoffload.cache.manager_stats import COUNTERS, OffloadingStats
from kvoffload.cache.policies.base import CachePolicy, get_policy_class
from kvoffload.checks import check_bool
from kvoffload.core.base import OffloadingEvent, OffloadKey
from kvoffload.core.lookup_result import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.errors import KeyStateError

__all__ = ["ManagerState", "LOOKUP_CODES"]

#: lookup code by class (0 absent, 1 unused, 2 pending, 3 ready): ``LOOKUP_CODES[ManagerState._classes(slots)]``
LOOKUP_CODES = np.array([LOOKUP_MISS, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_HIT], dtype=np.int8)


class ManagerState:
    """Slot table + policy + events + counters of a CPU offloading manager (see its docstring)."""

    def __init__(self, num_blocks: int, cache_policy: str = "lru", enable_events: bool = False) -> None:
        enable_events = check_bool(enable_events, "enable_events")
        policy_cls = get_policy_class(cache_policy)
        self._table = SlotTable(num_blocks)
        self.num_blocks: int = self._table.num_blocks
        self.cache_policy: str = cache_policy
        self._policy: CachePolicy = policy_cls(self.num_blocks, self._table)
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._closed = False
        self._n_hits = 0
        self._n_pending_hits = 0
        self._n_misses = 0
        self._n_evictions = 0
        self._n_stores_started = 0
        self._n_stores_skipped = 0
        self._n_stores_failed = 0
        self._n_stores_completed = 0
        self._n_stores_aborted = 0
        self._n_loads = 0
        # hot-path aliases
        self._index: dict[bytes, int] = self._table.index
        self._ref_buf = self._table.ref_buf
        #: set by a manager whose ``lookup`` is a closure counting on its own
        self._drain_lookup_counts: Callable[[], tuple[int, int, int]] | None = None

    @property
    def policy(self) -> CachePolicy:
        """The policy instance (read-only use)."""
        return self._policy

    @property
    def table(self) -> SlotTable:
        """The slot table (read-only use)."""
        return self._table

    def _check_open(self) -> None:
        if self._closed:
            raise KeyStateError("the CPUOffloadingManager has been shut down")

    def _classes(self, slots: np.ndarray) -> np.ndarray:
        """Per slot (``-1``: absent key), its class: 0 absent, 2 pending, 3 ready (a new array)."""
        st = self._table.ref[slots] if self.num_blocks else np.zeros(len(slots), dtype=np.int32)
        np.minimum(st, 0, out=st)
        st += 3
        st[slots < 0] = 0
        return st

    def _resolve(self, keys: Iterable[OffloadKey], allow_duplicates: bool, remember: bool = False) -> Resolved:
        if self._closed:
            self._check_open()
        return self._table.resolve(keys, "keys", allow_duplicates=allow_duplicates, remember=remember)

    def _evict(self, need: int, protected: np.ndarray) -> list[OffloadKey] | None:
        """Evict ``need`` ready, unpinned blocks not in ``protected`` (slots); return their keys.

        The caller has checked that enough such blocks exist; None (nothing changed) if the
        policy still cannot find them.
        """
        t = self._table
        if len(protected):
            mark = t.prot_mark
            mark[protected] = 1
            try:
                victims = self._policy.evict(need, protected)
            finally:
                mark[protected] = 0
        else:
            victims = self._policy.evict(need, protected)
        if victims is None:
            return None
        if len(victims) != need:  # pragma: no cover - policy contract violation
            raise RuntimeError(f"policy {self.cache_policy!r} returned {len(victims)} victims, expected {need}")
        self._n_evictions += need
        return t.release(victims, ready=True)

    def take_events(self) -> list[OffloadingEvent]:
        """Drain the events recorded since the last call (always empty without ``enable_events``)."""
        if not self._events:
            return []
        out = self._events
        self._events = []
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
        self._fold_lookup_counts()
        stats.lookups = self._n_hits + self._n_pending_hits + self._n_misses
        for name in COUNTERS:
            setattr(stats, name, getattr(self, "_n_" + name))
            setattr(self, "_n_" + name, 0)
        return stats

    def _fold_lookup_counts(self) -> None:
        if self._drain_lookup_counts is not None:
            hits, pending, misses = self._drain_lookup_counts()
            self._n_hits += hits
            self._n_pending_hits += pending
            self._n_misses += misses

    def reset_cache(self) -> None:
        """Drop every block (pending and pinned ones too) and the policy's history.

        Slot allocation restarts from slot 0. No event is emitted (docs/contract.md §2 defines events
        for stores and evictions only); event consumers should treat a reset as "all
        cleared". Statistics counters are kept.
        """
        self._check_open()
        self._table.clear()
        self._policy.clear()

    def __len__(self) -> int:
        """Number of keys present (pending or ready)."""
        return self._table.num_used

    def __contains__(self, key: object) -> bool:
        return key in self._index
