"""A tier's counters and the warnings it logs once: what its threads and its backend report.

A :class:`~kvoffload.tiers.base.Tier` holds one :class:`TierCounters` as ``tier.counters``; its
backend reports what it sees through it (``self.counters.count("absent")``,
``self.counters.rejected(rej)``...). Every method may be called from any thread unless it says
the caller holds :attr:`TierCounters.lock`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from kvoffload.tiers.record import ValueRejected
from kvoffload.tiers.types import DROPPED, FAILED, PRESENT, STORED, TierStats

__all__ = ["TierCounters"]

logger = logging.getLogger(__name__)


class TierCounters:
    """The counters of the tier named ``name`` (see :class:`TierStats`), under ``lock`` (the tier's
    lock, which also guards its jobs)."""

    def __init__(self, name: str, lock: threading.Lock) -> None:
        self.name = name
        self.lock = lock
        self.stats = TierStats()
        self._logged: set[str] = set()
        self._removed: list[bytes] = []  # keys the store removed, not taken yet

    def snapshot(self) -> TierStats:
        """A copy of the cumulative counters."""
        with self.lock:
            return replace(self.stats)

    def removed(self, keys: list[bytes]) -> None:
        """Backends: ``keys`` were removed from the store."""
        with self.lock:
            self._removed.extend(keys)
            self.stats.removals += len(keys)

    def take_removed(self) -> list[bytes]:
        """The keys reported by :meth:`removed` since the last call."""
        with self.lock:
            out, self._removed = self._removed, []
        return out

    def removal_events_off(self, why: str) -> None:
        """Backends: removal events were asked for but the store will not send them all."""
        with self.lock:
            self.stats.removal_events_off = 1
            self.log_once("removal-events-off", "tier %s: removal events incomplete: %s", why)

    def rejected(self, rej: ValueRejected) -> None:
        """Backends: a value was read and refused; counted under its kind (see :class:`TierStats`)."""
        field = "corrupt" if rej.kind == "corrupt" else f"rejected_{rej.kind}"
        with self.lock:
            self.stats.rejected_values += 1
            setattr(self.stats, field, getattr(self.stats, field) + 1)
            self.log_once(
                f"reject-{rej.reason}", "tier %s rejected a stored value: %s (counted, not loaded)", rej.reason
            )

    def count(self, field: str, n: int = 1) -> None:
        """Backends: add ``n`` to the counter ``field`` of :class:`TierStats` (``absent``,
        ``deleted_values``, ``redirected``, ``evictions``...)."""
        if n:
            with self.lock:
                setattr(self.stats, field, getattr(self.stats, field) + n)

    def error(self, kind: str, exc: BaseException) -> None:
        """Backends: a ``kind`` operation (``"store"``, ``"load"``...) failed with ``exc``; counted in
        ``errors``, logged once per kind."""
        with self.lock:
            self.stats.errors += 1
            self.log_once(f"error-{kind}", "tier %s: %s", f"{kind} failed: {exc!r}")

    def probe(self, keys: list[bytes], found: list[bool] | None) -> None:
        """A probe of ``keys`` answered ``found`` (None: not answered, nothing counted)."""
        if found is None:
            return
        with self.lock:
            self.stats.lookup_round_trips += 1
            self.stats.lookups += len(keys)
            self.stats.hits += sum(found)

    def store_batch(self, outcome: list[int], dropped: bool, seconds: float, record_bytes: int) -> None:
        """Count a store batch's per-key outcomes (``dropped``: not tried, the store in back-off),
        which took ``seconds`` (caller holds the lock)."""
        s = self.stats
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

    def load_batch(self, n_ok: int, n: int, seconds: float, record_bytes: int) -> None:
        """Count a load batch of ``n`` keys, ``n_ok`` loaded, which took ``seconds`` (caller holds the lock)."""
        s = self.stats
        s.blocks_read += n_ok
        s.bytes_read += n_ok * record_bytes
        s.read_seconds += seconds if n_ok else 0.0
        s.read_failures += n - n_ok

    def dropped(self, n: int, reason: str) -> None:
        """A store job of ``n`` keys was dropped at submission for ``reason`` (caller holds the lock)."""
        self.stats.dropped_writes += n
        self.log_once(f"drop-{reason}", "tier %s drops stores: %s (counted in dropped_writes)", reason)

    def log_once(self, tag: str, fmt: str, arg: str) -> None:
        """Log ``fmt % (name, arg)`` at WARNING the first time ``tag`` is seen (caller holds the lock)."""
        if tag not in self._logged:
            self._logged.add(tag)
            logger.warning(fmt, self.name, arg)
