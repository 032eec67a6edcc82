"""Statistics snapshot and event counters of :class:`~kvoffload.cache.manager.CPUOffloadingManager`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.cache.keytable import SlotTable

__all__ = ["OffloadingStats", "COUNTERS", "Counters"]


@dataclass
class OffloadingStats:
    """Snapshot returned by :meth:`CPUOffloadingManager.get_stats`.

    Gauges (current values): ``num_blocks``, ``num_used`` (pending + ready), ``num_pending``,
    ``num_pinned`` (ready with ref count > 0), ``usage`` = ``num_used / num_blocks``
    (pending blocks count as used; 0.0 for an empty pool), ``write_usage`` =
    ``num_pending / num_blocks``.

    Counters (deltas since the previous ``get_stats`` call): ``lookups`` (keys looked up,
    per-key and batched), ``hits`` (ready), ``pending_hits`` (present but pending),
    ``misses``, ``evictions`` (blocks evicted), ``stores_started`` (slots allocated by
    ``prepare_store``), ``stores_skipped`` (keys not stored: already present, or filtered
    out by a reuse filter), ``stores_failed`` (keys of ``prepare_store`` calls that returned
    None), ``stores_completed``, ``stores_aborted`` (pending blocks removed by a failed
    ``complete_store``), ``loads`` (blocks pinned by ``prepare_load``).
    """

    num_blocks: int = 0
    num_used: int = 0
    num_pending: int = 0
    num_pinned: int = 0
    usage: float = 0.0
    write_usage: float = 0.0
    lookups: int = 0
    hits: int = 0
    pending_hits: int = 0
    misses: int = 0
    evictions: int = 0
    stores_started: int = 0
    stores_skipped: int = 0
    stores_failed: int = 0
    stores_completed: int = 0
    stores_aborted: int = 0
    loads: int = 0

    @classmethod
    def of(cls, table: SlotTable) -> OffloadingStats:
        """The gauges of ``table``'s pool (counters 0)."""
        n = table.num_blocks
        return cls(
            num_blocks=n,
            num_used=table.num_used,
            num_pending=table.num_pending,
            num_pinned=table.num_pinned,
            usage=table.num_used / n if n else 0.0,
            write_usage=table.num_pending / n if n else 0.0,
        )


COUNTERS = (
    "hits",
    "pending_hits",
    "misses",
    "evictions",
    "stores_started",
    "stores_skipped",
    "stores_failed",
    "stores_completed",
    "stores_aborted",
    "loads",
)


class Counters:
    """The manager's event counters, in one object (bumped in place on the hot paths)."""

    __slots__ = COUNTERS

    def __init__(self) -> None:
        self.hits = self.pending_hits = self.misses = self.evictions = self.loads = 0
        self.stores_started = self.stores_skipped = self.stores_failed = 0
        self.stores_completed = self.stores_aborted = 0

    def drain_into(self, stats: OffloadingStats) -> OffloadingStats:
        """Copy the counters into ``stats`` (plus ``lookups``), reset them, return ``stats``."""
        for name in COUNTERS:
            setattr(stats, name, getattr(self, name))
            setattr(self, name, 0)
        stats.lookups = stats.hits + stats.pending_hits + stats.misses
        return stats
