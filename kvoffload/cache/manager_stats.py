"""Statistics snapshot and small helpers of :class:`~kvoffload.cache.manager.CPUOffloadingManager`."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.errors import KeyStateError

__all__ = ["OffloadingStats", "COUNTERS", "ClosedIndex"]


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


class ClosedIndex:
    """Stands in for the key index after ``shutdown``: every per-key lookup raises."""

    def get(self, key: object, default: object = None) -> object:
        raise KeyStateError("the CPUOffloadingManager has been shut down")

    def __contains__(self, key: object) -> bool:
        raise KeyStateError("the CPUOffloadingManager has been shut down")
