"""Translation memo of the slot table: the key -> slot translation of recent key lists.

A scheduler calls the manager several times per request on slices of the same key list
(lookup, touch, load of the hit prefix, stores of the rest, completions). The memo keeps the
translation of the last :data:`MEMO_ENTRIES` lists of at least :data:`MEMO_MIN_KEYS` keys
given to ``lookup_batch`` / ``touch``; a later call whose keys equal a slice of a remembered
list (one C-level list comparison) reuses it instead of probing the key index again.

Exact by construction: a remembered slot is used only while the slot's generation
(``SlotTable.gen``, bumped each time the slot is freed) is unchanged, so it still holds that
key; remembered absences are re-checked whenever a key was inserted since.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from kvoffload.core.base import OffloadKey

logger = logging.getLogger(__name__)

__all__ = ["MEMO_ENTRIES", "MEMO_MIN_KEYS", "MemoBatch", "TranslationMemo"]

#: How many recent key lists the memo keeps, and the smallest worth keeping.
MEMO_ENTRIES = 16
MEMO_MIN_KEYS = 8


class MemoBatch:
    """A remembered key list: keys, their slots (-1 = absent) and the slots' generations."""

    __slots__ = ("keys", "slots", "gen", "pos", "has_dups", "insert_seen")

    keys: list[OffloadKey]
    slots: np.ndarray
    gen: np.ndarray
    pos: dict[bytes, int]
    has_dups: bool
    insert_seen: int


class TranslationMemo:
    """The remembered lists of one slot table (see the module docstring).

    Args:
        gen: the table's per-slot generation array (read only).
        slots_of: the table's uncached translation (``int64`` slot per key, -1 if absent).
    """

    def __init__(self, gen: np.ndarray, slots_of: Callable[[list[OffloadKey]], np.ndarray]) -> None:
        self._gen = gen
        self._slots_of = slots_of
        self._entries: list[MemoBatch] = []

    def __bool__(self) -> bool:
        return bool(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def find(self, lst: list[OffloadKey]) -> tuple[MemoBatch, int] | None:
        """The remembered list holding ``lst`` as a slice, and the slice's offset; None if none."""
        k0 = lst[0]
        n = len(lst)
        try:
            for b in self._entries:
                off = b.pos.get(k0)
                if off is not None and b.keys[off : off + n] == lst:
                    return b, off
        except TypeError:  # unhashable first item: let the normal path report it
            return None
        return None

    def slots(self, b: MemoBatch, off: int, n: int, insert_count: int) -> np.ndarray:
        """The current slots of ``b.keys[off:off+n]`` (a new array), refreshing stale entries."""
        end = off + n
        sl = b.slots[off:end]
        gen = self._gen
        if (gen[sl] != b.gen[off:end]).any():
            fresh = self._slots_of(b.keys[off:end])
            b.slots[off:end] = fresh
            b.gen[off:end] = gen[fresh]
        elif b.insert_seen != insert_count:
            a = (sl < 0).nonzero()[0]
            if len(a):
                ks = b.keys
                found = self._slots_of([ks[off + i] for i in a.tolist()])
                if (found >= 0).any():
                    b.slots[off + a] = found
                    b.gen[off + a] = gen[found]
        return b.slots[off:end].copy()

    def remember(self, lst: list[OffloadKey], slots: np.ndarray, insert_count: int) -> MemoBatch:
        """Keep ``lst`` (owned by the memo from now on) and its translation ``slots``."""
        b = MemoBatch()
        n = len(lst)
        b.keys = lst
        b.slots = slots.copy()
        b.gen = self._gen[slots]
        b.pos = dict(zip(lst, range(n), strict=True))
        b.has_dups = len(b.pos) != n
        if b.has_dups:  # keep each key's first position
            b.pos = dict(zip(reversed(lst), range(n - 1, -1, -1), strict=True))
        b.insert_seen = insert_count
        entries = self._entries
        entries.insert(0, b)
        if len(entries) > MEMO_ENTRIES:
            entries.pop()
        return b

    def note_insert(
        self, b: MemoBatch, idx: np.ndarray, slots: np.ndarray, count_before: int, count_after: int
    ) -> None:
        """Keys ``b.keys[idx]`` were just given ``slots`` by one allocation (insert count
        ``count_before`` -> ``count_after``): record them."""
        b.slots[idx] = slots
        b.gen[idx] = self._gen[slots]
        if b.insert_seen == count_before:
            b.insert_seen = count_after
