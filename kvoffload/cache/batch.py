"""Key batches resolved to slots of a :class:`~kvoffload.cache.keytable.SlotTable`, and the table's
memo of recent resolutions: the last :data:`MEMO_ENTRIES` key lists of at least :data:`MEMO_MIN_KEYS`
keys given to ``lookup_batch`` / ``touch``; a later call whose keys equal a slice of one (a scheduler
calls the manager on slices of a request's keys) reuses its slots while their generations
(``SlotTable.gen``) are unchanged; remembered absences are re-checked after any insertion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvoffload.core.base import OffloadKey

__all__ = ["KeyBatch", "Resolved", "StorePlan", "MemoBatch", "TranslationMemo"]

MEMO_ENTRIES = 16
MEMO_MIN_KEYS = 8


class KeyBatch(list):  # type: ignore[type-arg]
    """A ``list`` of keys resolved once (``CPUOffloadingManager.key_batch``): their ``slots`` (-1 = absent),
    whether they are ``unique``, the table (``owner``) and its ``epoch`` then. A manager takes the
    slots of a *current* batch (same table and epoch) as they are; any other is a list of keys."""

    __slots__ = ("slots", "unique", "owner", "epoch")

    slots: list[int]
    unique: bool
    owner: object  # the SlotTable (compared by identity)
    epoch: int


class StorePlan(NamedTuple):
    """A ``prepare_store`` decision: ``keys`` given pending ``slots`` (a list, or an ``int64``
    array for large calls), or ``slots=None`` when room could not be made (nothing changed;
    ``keys`` are those it would have stored); ``evicted``: the keys evicted, in order."""

    keys: list[OffloadKey]
    slots: list[int] | np.ndarray | None
    evicted: list[OffloadKey]


class MemoBatch:
    """A remembered key list: keys, their slots (-1 = absent) and the slots' generations."""

    __slots__ = ("keys", "slots", "gen", "pos", "has_dups", "insert_seen")

    keys: list[OffloadKey]
    slots: np.ndarray
    gen: np.ndarray
    pos: dict[bytes, int]
    has_dups: bool
    insert_seen: int


class Resolved(NamedTuple):
    """:meth:`SlotTable.resolve`'s result: the memo ``batch`` and ``offset`` the slots came from."""

    keys: list[OffloadKey]
    slots: np.ndarray
    unique: bool
    batch: MemoBatch | None
    offset: int


class TranslationMemo:
    """The remembered lists of one table; ``gen``: its slot generations, ``slots_of``: its
    uncached translation (``int64`` slot per key, -1 if absent)."""

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
        k0, n = lst[0], len(lst)
        try:
            for b in self._entries:
                off = b.pos.get(k0)
                if off is not None and b.keys[off : off + n] == lst:
                    return b, off
        except TypeError:  # unhashable first item: the caller's checks report it
            return None
        return None

    def slots(self, b: MemoBatch, off: int, n: int, insert_count: int) -> np.ndarray:
        """The current slots of ``b.keys[off:off+n]`` (a new array), refreshing stale entries."""
        end = off + n
        sl, gen = b.slots[off:end], self._gen
        if (gen[sl] != b.gen[off:end]).any():
            fresh = self._slots_of(b.keys[off:end])
            b.slots[off:end] = fresh
            b.gen[off:end] = gen[fresh]
        elif b.insert_seen != insert_count:
            a = (sl < 0).nonzero()[0]
            if len(a):
                found = self._slots_of([b.keys[off + i] for i in a.tolist()])
                if (found >= 0).any():
                    b.slots[off + a] = found
                    b.gen[off + a] = gen[found]
        return b.slots[off:end].copy()

    def remember(self, lst: list[OffloadKey], slots: np.ndarray, insert_count: int) -> MemoBatch:
        """Keep ``lst`` (owned by the memo from now on) and its translation ``slots``."""
        b = MemoBatch()
        n = len(lst)
        b.keys, b.slots, b.gen, b.insert_seen = lst, slots.copy(), self._gen[slots], insert_count
        b.pos = dict(zip(lst, range(n), strict=True))
        b.has_dups = len(b.pos) != n
        if b.has_dups:  # each key's first position
            b.pos = dict(zip(reversed(lst), range(n - 1, -1, -1), strict=True))
        self._entries.insert(0, b)
        del self._entries[MEMO_ENTRIES:]
        return b

    def note_insert(
        self, b: MemoBatch, idx: np.ndarray, slots: np.ndarray, count_before: int, count_after: int
    ) -> None:
        """Keys ``b.keys[idx]`` were just given ``slots`` by one allocation (the table's insert
        count went ``count_before`` -> ``count_after``)."""
        b.slots[idx] = slots
        b.gen[idx] = self._gen[slots]
        if b.insert_seen == count_before:
            b.insert_seen = count_after
