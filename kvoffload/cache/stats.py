"""The manager's counters and the snapshot ``get_stats`` returns."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.cache.keytable import SlotTable

__all__ = ["OffloadingStats", "COUNTERS"]


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

    def drain(self, table: SlotTable) -> OffloadingStats:
        """A snapshot: ``table``'s gauges and these counters, which are reset (a manager's
        :class:`OffloadingStats` is its counters, bumped in place)."""
        n, used, pending = table.num_blocks, table.num_used, table.num_pending
        out = replace(self, num_blocks=n, num_used=used, num_pending=pending, num_pinned=table.num_pinned)
        out.usage, out.write_usage = (used / n, pending / n) if n else (0.0, 0.0)
        out.lookups = out.hits + out.pending_hits + out.misses
        for name in COUNTERS:
            setattr(self, name, 0)
        return out


#: the counters of :class:`OffloadingStats` (the fields after ``lookups``)
COUNTERS = tuple(f.name for f in fields(OffloadingStats))[7:]
