"""Per-slot state of the CPU offloading manager, kept in flat arrays (no object per block).

Layout, for a pool of ``num_blocks`` slots (slot ``s`` = CPU block id ``s``):

* ``index``: ``dict[bytes, int]`` -- key -> slot, for the keys currently present (pending or
  ready). The only per-key Python structure; everything else is one machine word or less per
  slot.
* ``keys``: ``list[bytes | None]`` of length ``num_blocks`` -- slot -> key (``None`` when free).
* ``ref``: ``int32[num_blocks]`` -- the block state: :data:`FREE` (-2), :data:`PENDING` (-1,
  store in flight), or ``>= 0`` (ready; the value is the number of loads pinning it). It lives
  in an ``array('i')`` and ``ref_np`` is a numpy view of the same memory: single-slot reads use
  the array (a Python int, ~3x faster than numpy scalar indexing), batches use the view.
* slot allocation: ``num_allocated`` never-used slots are handed out first in increasing
  order, then ``free_list`` is used last-in-first-out.

Counters kept exact at every step: ``num_pending``, ``num_evictable`` (ready and ref 0) and
``num_pinned`` (ready and ref > 0).
"""

from __future__ import annotations

import logging
from array import array
from collections import deque
from collections.abc import Iterable
from itertools import repeat
from typing import NamedTuple

import numpy as np

from kvoffload.checks import check_int
from kvoffload.core.base import OffloadKey, check_key_batch, validate_keys
from kvoffload.errors import InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["FREE", "PENDING", "SlotTable", "Resolved", "as_key_list", "int_view"]

#: ``ref`` value of a free slot.
FREE = -2
#: ``ref`` value of a slot whose store is in flight.
PENDING = -1

_EMPTY_I64 = np.zeros(0, dtype=np.int64)


def int_view(buf: array, dtype: type) -> np.ndarray:
    """A numpy view sharing memory with ``buf`` (an empty array when ``buf`` is empty)."""
    if len(buf) == 0:
        return np.zeros(0, dtype=dtype)
    view: np.ndarray = np.frombuffer(buf, dtype=dtype)
    assert view.size == len(buf)
    return view


def as_key_list(keys: Iterable[OffloadKey], name: str = "keys", *, allow_duplicates: bool) -> list[OffloadKey]:
    """Validate a batch of keys with C-speed checks and return it as a new list.

    The fast path (every item exactly ``bytes``) costs two C loops; anything else goes
    through :func:`kvoffload.core.base.validate_keys`, which raises the typed error naming
    the bad item (``bytes`` subclasses such as ``numpy.bytes_`` included).
    """
    if keys.__class__ is not list:
        check_key_batch(keys, name)
    try:
        lst = list(keys)
    except TypeError as exc:
        raise InvalidTypeError(f"{name} must be an iterable of bytes keys, got {type(keys).__name__}") from exc
    if lst and set(map(type, lst)) != {bytes}:
        return validate_keys(lst, name, allow_duplicates=allow_duplicates)
    if not allow_duplicates and len(set(lst)) != len(lst):
        return validate_keys(lst, name, allow_duplicates=False)
    return lst


class _Batch:
    """A remembered key batch: keys, their slots (-1 = absent) and the slots' generations."""

    __slots__ = ("keys", "slots", "gen", "pos", "has_dups", "insert_seen")

    keys: list[OffloadKey]
    slots: np.ndarray
    gen: np.ndarray
    pos: dict[bytes, int]
    has_dups: bool
    insert_seen: int


class Resolved(NamedTuple):
    """Result of :meth:`SlotTable.resolve`."""

    keys: list[OffloadKey]
    slots: np.ndarray
    unique: bool
    batch: _Batch | None
    offset: int


#: How many recent key batches the translation memo keeps, and the smallest worth keeping.
MEMO_ENTRIES = 16
MEMO_MIN_KEYS = 8


class SlotTable:
    """Key index and per-slot state of a pool of ``num_blocks`` CPU slots.

    Besides the arrays of the module docstring it keeps ``gen`` (``uint32`` per slot,
    bumped each time the slot is freed) and a small *translation memo*: the key -> slot
    translation of the last :data:`MEMO_ENTRIES` key lists given to ``lookup_batch`` /
    ``touch``. A scheduler calls the manager several times per request on slices of the
    same key list (lookup, touch, load of the hit prefix, stores of the rest, completions);
    a later call whose keys equal a slice of a remembered list (one C-level list comparison)
    reuses the translation instead of probing the dict again. The memo is exact: a
    remembered slot is used only if the slot's generation is unchanged (it was not freed
    since, so it still holds that key), and remembered absences are re-checked whenever a
    key was inserted since.

    Args:
        num_blocks: number of slots (``>= 0``).
    """

    def __init__(self, num_blocks: int) -> None:
        num_blocks = check_int(num_blocks, "num_blocks", 0)
        if array("i").itemsize != 4:  # pragma: no cover - every mainstream platform
            raise RuntimeError("array('i') is not 32-bit on this platform")
        n = int(num_blocks)
        self.num_blocks: int = n
        self.index: dict[bytes, int] = {}
        self.keys: np.ndarray = np.full(n, None, dtype=object)
        self.ref_buf: array = array("i", [FREE]) * n
        self.ref: np.ndarray = int_view(self.ref_buf, np.int32)
        self.gen: np.ndarray = np.zeros(n, dtype=np.uint32)
        #: scratch mask of the keys named in the current ``prepare_store`` (1 = protected)
        self.prot_mark: np.ndarray = np.zeros(n, dtype=np.int8)
        # memoryviews of the same memory: single-slot reads/writes on the small-batch paths
        # (a Python int in ~30 ns, about twice as fast as numpy scalar indexing)
        self.gen_mv: memoryview = self.gen.data
        self.prot_mv: memoryview = self.prot_mark.data
        self.num_allocated: int = 0
        self.free_list: list[int] = []
        self.num_pending: int = 0
        self.num_evictable: int = 0
        self.num_pinned: int = 0
        self.insert_count: int = 0
        self._memo: list[_Batch] = []

    # ------------------------------------------------------------------ queries
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
        """Validate ``keys`` and translate them to slots (``-1`` = absent).

        Type checks: an unhashable item fails the dict probe, an absent item must be exactly
        ``bytes`` (a subclass such as ``numpy.bytes_``, whose value numpy may have truncated,
        is refused by :func:`validate_keys`); a present item compares equal to a stored
        ``bytes`` key, so it is that key. A numpy bytes array is refused as a whole. Repeats
        are rejected unless ``allow_duplicates``. Nothing is mutated except the memo.

        Returns:
            keys (a private list), slots (a private ``int64`` array), ``unique`` (True when
            the keys are known to be distinct), and the memo batch/offset they came from.
        """
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
        if self._memo:
            found = self._memo_find(lst)
            if found is not None and (allow_duplicates or not found[0].has_dups):
                b, off = found
                return Resolved(b.keys[off : off + n], self._memo_slots(b, off, n), not b.has_dups, b, off)
        try:
            slots = np.fromiter(map(self.index.get, lst, repeat(-1)), dtype=np.int64, count=n)
        except TypeError:
            validate_keys(lst, name, allow_duplicates=allow_duplicates)
            raise
        absent = slots < 0
        n_absent = int(np.count_nonzero(absent))
        akeys: list[OffloadKey] | None = None  # the absent keys, gathered only when needed
        # every absent item must be exactly bytes (present ones compare equal to a stored key):
        # one C pass over all items first, the absent ones only if that finds another type
        if n_absent and set(map(type, lst)) != {bytes}:
            akeys = lst if n_absent == n else [lst[i] for i in absent.nonzero()[0].tolist()]
            if set(map(type, akeys)) != {bytes}:
                validate_keys(lst, name, allow_duplicates=allow_duplicates)
        unique = False
        if not allow_duplicates:
            present = slots[~absent] if n_absent else slots
            if len(present) > 1:
                srt = np.sort(present)
                if (srt[1:] == srt[:-1]).any():
                    validate_keys(lst, name, allow_duplicates=False)
            if n_absent > 1:
                if akeys is None:
                    akeys = lst if n_absent == n else [lst[i] for i in absent.nonzero()[0].tolist()]
                if len(set(akeys)) != len(akeys):
                    validate_keys(lst, name, allow_duplicates=False)
            unique = True
        lst = list(lst)
        if remember and n >= MEMO_MIN_KEYS and self.num_blocks:
            b = self._remember(lst, slots)
            unique = unique or not b.has_dups
            return Resolved(lst, slots.copy(), unique, b, 0)
        return Resolved(lst, slots, unique, None, 0)

    # ------------------------------------------------------------------ memo
    def _memo_find(self, lst: list[OffloadKey]) -> tuple[_Batch, int] | None:
        k0 = lst[0]
        n = len(lst)
        try:
            for b in self._memo:
                off = b.pos.get(k0)
                if off is not None and b.keys[off : off + n] == lst:
                    return b, off
        except TypeError:  # unhashable first item: let the normal path report it
            return None
        return None

    def _memo_slots(self, b: _Batch, off: int, n: int) -> np.ndarray:
        end = off + n
        sl = b.slots[off:end]
        if (self.gen[sl] != b.gen[off:end]).any():
            fresh = self.slots_of(b.keys[off:end])
            b.slots[off:end] = fresh
            b.gen[off:end] = self.gen[fresh]
        elif b.insert_seen != self.insert_count:
            a = (sl < 0).nonzero()[0]
            if len(a):
                ks = b.keys
                found = self.slots_of([ks[off + i] for i in a.tolist()])
                if (found >= 0).any():
                    b.slots[off + a] = found
                    b.gen[off + a] = self.gen[found]
        return b.slots[off:end].copy()

    def _remember(self, lst: list[OffloadKey], slots: np.ndarray) -> _Batch:
        b = _Batch()
        n = len(lst)
        b.keys = lst
        b.slots = slots.copy()
        b.gen = self.gen[slots]
        b.pos = dict(zip(lst, range(n), strict=True))
        b.has_dups = len(b.pos) != n
        if b.has_dups:  # keep each key's first position
            b.pos = dict(zip(reversed(lst), range(n - 1, -1, -1), strict=True))
        b.insert_seen = self.insert_count
        memo = self._memo
        memo.insert(0, b)
        if len(memo) > MEMO_ENTRIES:
            memo.pop()
        return b

    def memo_note_insert(self, r: Resolved, positions: np.ndarray, slots: np.ndarray, count_before: int) -> None:
        """After :meth:`allocate` of keys that came from memo batch ``r``: record their slots."""
        b = r.batch
        if b is None:
            return
        idx = r.offset + positions
        b.slots[idx] = slots
        b.gen[idx] = self.gen[slots]
        if b.insert_seen == count_before:
            b.insert_seen = self.insert_count

    # ------------------------------------------------------------------ mutation
    def allocate(self, keys: list[OffloadKey]) -> np.ndarray:
        """Give each (absent, distinct) key a slot, mark it pending; return the slots.

        Never-used slots first in increasing order, then freed slots last-in-first-out.
        The caller has checked that ``len(keys) <= num_free``.
        """
        m = len(keys)
        if m == 0:
            return _EMPTY_I64
        fresh = min(m, self.num_blocks - self.num_allocated)
        start = self.num_allocated
        reused = m - fresh
        if reused:
            tail = self.free_list[-reused:]
            del self.free_list[-reused:]
            tail.reverse()
            slot_list = list(range(start, start + fresh)) + tail if fresh else tail
            slots = np.array(slot_list, dtype=np.int64)
        else:
            slots = np.arange(start, start + fresh, dtype=np.int64)
            slot_list = list(range(start, start + fresh))
        self.num_allocated += fresh
        self.index.update(zip(keys, slot_list, strict=True))
        self.keys[slots] = keys if m > 1 else keys[0]
        self.ref[slots] = PENDING
        self.num_pending += m
        self.insert_count += 1
        return slots

    def allocate_list(self, keys: list[OffloadKey]) -> list[int]:
        """:meth:`allocate` for a few keys, with scalar operations; returns the slots as a list."""
        m = len(keys)
        start = self.num_allocated
        fresh = min(m, self.num_blocks - start)
        if fresh == m:
            slots = list(range(start, start + m))
        else:
            reused = m - fresh
            tail = self.free_list[-reused:]
            del self.free_list[-reused:]
            tail.reverse()
            slots = list(range(start, start + fresh)) + tail if fresh else tail
        self.num_allocated = start + fresh
        index, karr, ref = self.index, self.keys, self.ref_buf
        for k, s in zip(keys, slots, strict=True):
            index[k] = s
            karr[s] = k
            ref[s] = PENDING
        self.num_pending += m
        self.insert_count += 1
        return slots

    def release_list(self, slots: list[int]) -> list[OffloadKey]:
        """:meth:`release` for a few slots (a list), with scalar operations."""
        index, karr, ref, gen = self.index, self.keys, self.ref_buf, self.gen_mv
        out: list[OffloadKey] = []
        n_pending = 0
        for s in slots:
            k = karr[s]
            out.append(k)
            del index[k]
            karr[s] = None
            gen[s] = (gen[s] + 1) & 0xFFFFFFFF
            if ref[s] == PENDING:
                n_pending += 1
            ref[s] = FREE
        self.num_pending -= n_pending
        self.num_evictable -= len(slots) - n_pending
        self.free_list.extend(slots)
        return out

    def release(self, slots: np.ndarray, ready: bool = False) -> list[OffloadKey]:
        """Free ``slots`` (in that order onto the free list); return their keys.

        Updates ``num_pending``/``num_evictable`` from the slots' current state (``ready``:
        the caller knows they are all ready with ref count 0, i.e. eviction victims); the
        caller never releases pinned slots.
        """
        if len(slots) == 0:
            return []
        keys: list[OffloadKey] = self.keys[slots].tolist()
        deque(map(self.index.__delitem__, keys), maxlen=0)
        self.keys[slots] = None
        self.gen[slots] += 1
        if ready:
            n_pending = 0
        else:
            n_pending = int(np.count_nonzero(self.ref[slots] == PENDING))
        self.num_pending -= n_pending
        self.num_evictable -= len(slots) - n_pending
        self.ref[slots] = FREE
        self.free_list.extend(slots.tolist())
        return keys

    def clear(self) -> None:
        """Forget every key and return every slot to the never-used state."""
        self.index.clear()
        self.keys[:] = None
        if self.num_blocks:
            self.ref[:] = FREE
            self.gen += 1
        self.num_allocated = 0
        self.free_list.clear()
        self.num_pending = 0
        self.num_evictable = 0
        self.num_pinned = 0
        self.insert_count += 1
        self._memo.clear()

    def metadata_nbytes(self) -> int:
        """Bytes held by the fixed per-slot arrays (not the dict / key objects)."""
        return self.ref.nbytes + self.keys.nbytes + self.gen.nbytes + self.prot_mark.nbytes
