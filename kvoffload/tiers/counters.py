"""A tier's counters and the warnings it logs once: what its threads and its backend report.

:class:`TierCounters` is the base of :class:`~kvoffload.tiers.base.Tier`: it holds the tier's
lock, its cumulative :class:`TierStats` and the keys the store reported removed; every method may
be called from any thread.
"""

from __future__ import annotations

import logging
import threading

from kvoffload.tiers.record import ValueRejected
from kvoffload.tiers.types import DROPPED, FAILED, PRESENT, STORED, TierStats

__all__ = ["TierCounters"]

logger = logging.getLogger(__name__)


class TierCounters:
    """The counters of the tier named ``name`` (see :class:`TierStats`), under ``self._lock``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._stats = TierStats()
        self._logged: set[str] = set()
        self._removed: list[bytes] = []  # keys the store removed, not taken yet

    def _note_removed(self, keys: list[bytes]) -> None:
        """Backends: ``keys`` were removed from the store (any thread)."""
        with self._lock:
            self._removed.extend(keys)
            self._stats.removals += len(keys)

    def _removal_events_off(self, why: str) -> None:
        """Backends: removal events were asked for but the store will not send them all (any thread)."""
        with self._lock:
            self._stats.removal_events_off = 1
            self._log_once("removal-events-off", "tier %s: removal events incomplete: %s", why)

    def _count_rejected(self, rej: ValueRejected) -> None:
        """Count a value read and refused, under its kind (see :class:`TierStats`)."""
        field = "corrupt" if rej.kind == "corrupt" else f"rejected_{rej.kind}"
        with self._lock:
            self._stats.rejected_values += 1
            setattr(self._stats, field, getattr(self._stats, field) + 1)
            self._log_once(
                f"reject-{rej.reason}", "tier %s rejected a stored value: %s (counted, not loaded)", rej.reason
            )

    def _count(self, field: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``field`` of :class:`TierStats` (``absent``, ``redirected``...)."""
        if n:
            with self._lock:
                setattr(self._stats, field, getattr(self._stats, field) + n)

    def _count_error(self, kind: str, exc: BaseException) -> None:
        with self._lock:
            self._stats.errors += 1
            self._log_once(f"error-{kind}", "tier %s: %s", f"{kind} failed: {exc!r}")

    def _count_probe(self, keys: list[bytes], found: list[bool] | None) -> None:
        if found is None:
            return
        with self._lock:
            self._stats.lookup_round_trips += 1
            self._stats.lookups += len(keys)
            self._stats.hits += sum(found)

    def _count_store_batch(self, outcome: list[int], dropped: bool, seconds: float, record_bytes: int) -> None:
        """Count a store batch's per-key outcomes (``dropped``: not tried, the store in back-off),
        which took ``seconds`` (caller holds the lock)."""
        s = self._stats
        stored = outcome.count(STORED)
        s.blocks_written += stored
        s.bytes_written += stored * record_bytes
        s.write_seconds += seconds if stored else 0.0
        s.writes_skipped += outcome.count(PRESENT)
        if dropped:
            s.dropped_writes += len(outcome)
        else:
            s.dropped_writes += outcome.count(DROPPED)
            s.write_failures += outcome.count(FAILED)

    def _count_load_batch(self, n_ok: int, n: int, seconds: float, record_bytes: int) -> None:
        """Count a load batch of ``n`` keys, ``n_ok`` loaded, which took ``seconds`` (caller holds the lock)."""
        s = self._stats
        s.blocks_read += n_ok
        s.bytes_read += n_ok * record_bytes
        s.read_seconds += seconds if n_ok else 0.0
        s.read_failures += n - n_ok

    def _log_once(self, tag: str, fmt: str, arg: str) -> None:
        """Log ``fmt % (name, arg)`` at WARNING the first time ``tag`` is seen (caller holds the lock)."""
        if tag not in self._logged:
            self._logged.add(tag)
            logger.warning(fmt, self.name, arg)
