"""Per-slot state of the CPU offloading manager, in flat arrays (no object per block).

For ``num_blocks`` slots (slot ``s`` = CPU block id ``s``): ``index`` (key -> slot of every present
key: the only per-key Python structure), ``keys`` (slot -> key, ``None`` when free), ``ref``
(``int32``: :data:`FREE`, :data:`PENDING` (store in flight), or ``>= 0``: ready, pinned that many
times; ``ref_buf``: the same memory as an ``array('i')``), ``gen`` (``uint32``, bumped whenever the
slot is freed while the memo remembers a list: the memo's check). Never-used slots are allocated
first in increasing order, then freed ones last-in-first-out. ``num_pending``, ``num_evictable``
(ready, ref 0) and ``num_pinned`` are exact at every step.

The per-call paths of the manager (here, ``stores``, ``requests``) zip lists whose lengths are equal
by construction without ``strict=`` (``noqa: B905``): the keyword takes zip off its fast call path,
about 0.1 us more per call on calls that cost a few microseconds.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import repeat
from typing import Any

import numpy as np

from kvoffload.cache import batch as _batch
from kvoffload.cache.batch import KeyBatch, Resolved, TranslationMemo
from kvoffload.checks import check_int
from kvoffload.core.base import OffloadKey, check_key_batch, validate_keys
from kvoffload.errors import InvalidTypeError

__all__ = ["BYTES_ONLY", "FREE", "PENDING", "SlotTable", "any_below"]

FREE = -2
PENDING = -1

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
#: the set of types of a key list whose items are all exactly ``bytes``
BYTES_ONLY = {bytes}


def any_below(pos: memoryview | array, slots: list[int], limit: int) -> bool:
    """Whether some slot of ``slots`` has ``pos[s] < limit`` (``pos``: a per-slot buffer); a loop
    that stops at the first, about twice as fast as ``min(map(pos.__getitem__, slots))`` on a few."""
    for s in slots:
        if pos[s] < limit:
            return True
    return False


class SlotTable:
    """Key index and per-slot state of a pool of ``num_blocks`` (``>= 0``) CPU slots."""

    def __init__(self, num_blocks: int) -> None:
        n = check_int(num_blocks, "num_blocks", 0)
        self.num_blocks: int = n
        self.index: dict[bytes, int] = {}
        self.keys: np.ndarray = np.full(n, None, dtype=object)
        self.ref_buf: array = array("i", [FREE]) * n
        self.ref: np.ndarray = np.frombuffer(self.ref_buf, dtype=np.int32) if n else np.zeros(0, dtype=np.int32)
        self.gen: np.ndarray = np.zeros(n, dtype=np.uint32)
        #: 1 for the slots of the keys named in the current ``prepare_store`` (protected from eviction)
        self.prot_mark: np.ndarray = np.zeros(n, dtype=np.int8)
        self.gen_mv: memoryview = self.gen.data  # single-slot access on the scalar paths
        self.prot_mv: memoryview = self.prot_mark.data
        self.num_allocated: int = 0
        self.free_list: list[int] = []
        self.num_pending = self.num_evictable = self.num_pinned = 0
        self.insert_count: int = 0
        #: bumped whenever a key is inserted or a slot freed (a :class:`KeyBatch` is current until then)
        self.epoch: int = 0
        self.memo = TranslationMemo(self.gen, self.slots_of)

    @property
    def num_free(self) -> int:
        """Slots that can be allocated without evicting."""
        return self.num_blocks - self.num_allocated + len(self.free_list)

    @property
    def num_used(self) -> int:
        """Slots holding a key (pending or ready)."""
        return len(self.index)

    def slots_of(self, keys: list[OffloadKey]) -> np.ndarray:
        """``int64`` slot of each key, ``-1`` for absent keys."""
        if not keys:
            return _EMPTY_I64
        return np.fromiter(map(self.index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))

    def resolve(
        self, keys: Iterable[OffloadKey], name: str = "keys", *, allow_duplicates: bool, remember: bool
    ) -> Resolved:
        """Validate ``keys`` and translate them to slots (``-1`` = absent; the caller's to keep);
        ``remember``: the memo keeps them. An absent key must be exactly ``bytes``, a present one
        equals a stored key. Repeats raise unless ``allow_duplicates``."""
        distinct = keys.__class__ is set or keys.__class__ is frozenset  # no repeat to look for
        if keys.__class__ is list:
            lst: list[OffloadKey] = keys  # type: ignore[assignment]
        else:
            check_key_batch(keys, name)
            try:
                lst = list(keys)
            except TypeError as exc:
                raise InvalidTypeError(f"{name} must be an iterable of bytes keys, got {type(keys).__name__}") from exc
        n = len(lst)
        if n == 0:
            return Resolved([], _EMPTY_I64, True, None, 0)
        if keys.__class__ is KeyBatch and keys.owner is self and keys.epoch == self.epoch:  # type: ignore[attr-defined]
            if allow_duplicates or keys.unique:  # type: ignore[attr-defined]
                return Resolved(lst, np.array(keys.slots, dtype=np.int64), keys.unique, None, 0)  # type: ignore[attr-defined]
        memo = self.memo
        if memo:
            found = memo.find(lst)
            if found is not None and (allow_duplicates or not found[0].has_dups):
                b, off = found
                return Resolved(b.keys[off : off + n], memo.slots(b, off, n, self.insert_count), not b.has_dups, b, off)
        try:
            slots = self.slots_of(lst)
        except TypeError:
            validate_keys(lst, name, allow_duplicates=allow_duplicates)
            raise
        if set(map(type, lst)) != BYTES_ONLY:  # an absent key must be exactly bytes
            if {type(lst[i]) for i in np.flatnonzero(slots < 0).tolist()} - BYTES_ONLY:
                validate_keys(lst, name, allow_duplicates=allow_duplicates)  # raises
        unique = not allow_duplicates or distinct
        if not allow_duplicates and not distinct and n > 1 and len(set(lst)) != n:
            validate_keys(lst, name, allow_duplicates=False)  # raises: repeats
        if lst is keys:  # the caller's list: the keys returned are a copy
            lst = list(lst)
        if remember and n >= _batch.MEMO_MIN_KEYS and self.num_blocks:
            b = memo.remember(lst, slots, self.insert_count)
            unique = unique or not b.has_dups
            return Resolved(lst, slots.copy(), unique, b, 0)
        return Resolved(lst, slots, unique, None, 0)

    # ------------------------------------------------------------------ mutation
    def allocate(self, keys: list[OffloadKey], as_list: bool = False) -> Any:
        """Give each (absent, distinct) key a pending slot (``len(keys) <= num_free``); the slots, an
        ``int64`` array or with ``as_list`` a list (scalar code)."""
        m = len(keys)
        start = self.num_allocated
        fresh = min(m, self.num_blocks - start)
        if fresh == m:
            slot_list = list(range(start, start + m))
        else:
            reused = m - fresh
            tail = self.free_list[-reused:]
            del self.free_list[-reused:]
            tail.reverse()
            slot_list = list(range(start, start + fresh)) + tail if fresh else tail
        self.num_allocated = start + fresh
        self.num_pending += m
        self.insert_count += 1
        self.epoch += 1
        self.index.update(zip(keys, slot_list))  # noqa: B905 (hot: see keytable)
        if as_list:
            karr, ref = self.keys, self.ref_buf
            for k, s in zip(keys, slot_list):  # noqa: B905 (hot: see keytable)
                karr[s] = k
                ref[s] = PENDING
            return slot_list
        slots = np.arange(start, start + m, dtype=np.int64) if fresh == m else np.array(slot_list, dtype=np.int64)
        if m:
            self.keys[slots] = keys if m > 1 else keys[0]
            self.ref[slots] = PENDING
        return slots

    def release(self, slots: np.ndarray | list[int], ready: bool = False) -> list[OffloadKey]:
        """Free the unpinned ``slots`` (onto the free list in that order; a list: scalar code); their
        keys. ``ready``: the caller knows they are all ready (eviction victims)."""
        if len(slots) == 0:
            return []
        if slots.__class__ is list:
            index, karr, ref = self.index, self.keys, self.ref_buf
            keys: list[OffloadKey] = []
            n_pending = 0 if ready else [ref[s] for s in slots].count(PENDING)
            for s in slots:
                k = karr[s]
                keys.append(k)
                del index[k]
                karr[s] = None
                ref[s] = FREE
            if self.memo:  # only the memo reads generations: one remembered since it must see the change
                gen = self.gen_mv
                for s in slots:
                    gen[s] = (gen[s] + 1) & 0xFFFFFFFF
            self.free_list.extend(slots)
        else:
            keys = self.keys[slots].tolist()
            # pop (cheaper than the slot wrapper __delitem__) hands back the slots' own int objects: the
            # free list takes them as they are (no new ints made, no old ones freed)
            freed = list(map(self.index.pop, keys))
            self.keys[slots] = None
            if self.memo:  # only the memo reads generations: one remembered since it must see the change
                self.gen[slots] += 1
            n_pending = 0 if ready else int(np.count_nonzero(self.ref[slots] == PENDING))
            self.ref[slots] = FREE
            self.free_list.extend(freed)
        self.num_pending -= n_pending
        self.num_evictable -= len(slots) - n_pending
        self.epoch += 1
        return keys

    def clear(self) -> None:
        """Forget every key and return every slot to the never-used state."""
        self.index.clear()
        self.keys[:] = None
        self.ref[:] = FREE
        self.gen += 1
        self.num_allocated = 0
        self.free_list.clear()
        self.num_pending = self.num_evictable = self.num_pinned = 0
        self.insert_count += 1
        self.epoch += 1
        self.memo.clear()
