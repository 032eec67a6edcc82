"""Statistics of :class:`~kvoffload.cache.manager.CPUOffloadingManager`: its counters and the snapshot
:meth:`~kvoffload.cache.manager.CPUOffloadingManager.get_stats` returns."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.cache.keytable import SlotTable

__all__ = ["OffloadingStats", "COUNTERS", "Counters"]


@dataclass
class OffloadingStats:
    """Gauges (current values): ``num_blocks``, ``num_used`` (pending + ready), ``num_pending``,
    ``num_pinned`` (ready with ref count > 0), ``usage`` = ``num_used / num_blocks`` and
    ``write_usage`` = ``num_pending / num_blocks`` (0.0 for an empty pool).

    Counters (since the previous ``get_stats``): ``lookups`` (keys looked up) = ``hits`` (ready) +
    ``pending_hits`` + ``misses``; ``evictions``; ``stores_started`` (slots allocated),
    ``stores_skipped`` (keys already present, or held back by the reuse filter), ``stores_failed``
    (keys of ``prepare_store`` calls that found no room), ``stores_completed``, ``stores_aborted``
    (failed ``complete_store``); ``loads`` (blocks pinned).
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
        n, used, pending = table.num_blocks, table.num_used, table.num_pending
        return cls(n, used, pending, table.num_pinned, used / n if n else 0.0, pending / n if n else 0.0)


@dataclass(slots=True)
class Counters:
    """The manager's counters, bumped in place on the hot paths."""

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

    def drain_into(self, stats: OffloadingStats) -> OffloadingStats:
        """Copy the counters into ``stats`` (and ``lookups``), reset them, return ``stats``."""
        for name in COUNTERS:
            setattr(stats, name, getattr(self, name))
            setattr(self, name, 0)
        stats.lookups = stats.hits + stats.pending_hits + stats.misses
        return stats


COUNTERS = tuple(f.name for f in fields(Counters))
