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
from typing import Any

import numpy as np

from kvoffload.cache import memo as _memo
from kvoffload.cache.batch import KeyBatch, Resolved, as_key_list
from kvoffload.cache.memo import TranslationMemo
from kvoffload.checks import check_int
from kvoffload.core.base import OffloadKey, check_key_batch, validate_keys
from kvoffload.errors import InvalidTypeError, KeyStateError

logger = logging.getLogger(__name__)

__all__ = ["FREE", "PENDING", "SlotTable", "ClosedIndex", "int_view"]

#: ``ref`` value of a free slot.
FREE = -2
#: ``ref`` value of a slot whose store is in flight.
PENDING = -1

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
#: :meth:`SlotTable.key_batch` resolves a list of at most this many keys with scalar code
SMALL_KEY_BATCH = 32
_BYTES_ONLY = {bytes}


def int_view(buf: array, dtype: type) -> np.ndarray:
    """A numpy view sharing memory with ``buf`` (an empty array when ``buf`` is empty)."""
    if len(buf) == 0:
        return np.zeros(0, dtype=dtype)
    view: np.ndarray = np.frombuffer(buf, dtype=dtype)
    assert view.size == len(buf)
    return view


class ClosedIndex:
    """Stands in for the key index after ``shutdown``: every per-key lookup raises."""

    def get(self, key: object, default: object = None) -> object:
        raise KeyStateError("the CPUOffloadingManager has been shut down")

    def __contains__(self, key: object) -> bool:
        raise KeyStateError("the CPUOffloadingManager has been shut down")


class SlotTable:
    """Key index and per-slot state of a pool of ``num_blocks`` CPU slots.

    Besides the arrays of the module docstring it keeps ``gen`` (``uint32`` per slot, bumped
    each time the slot is freed) for its :class:`~kvoffload.cache.memo.TranslationMemo`.

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
        #: bumped whenever a key is inserted or a slot freed (a :class:`KeyBatch` stays current until then)
        self.epoch: int = 0
        self.memo = TranslationMemo(self.gen, self.slots_of)

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
        if remember and n >= _memo.MEMO_MIN_KEYS and self.num_blocks:
            b = memo.remember(lst, slots, self.insert_count)
            unique = unique or not b.has_dups
            return Resolved(lst, slots.copy(), unique, b, 0)
        return Resolved(lst, slots, unique, None, 0)

    def memo_note_insert(self, r: Resolved, positions: np.ndarray, slots: np.ndarray, count_before: int) -> None:
        """After :meth:`allocate` of keys that came from memo batch ``r``: record their slots."""
        if r.batch is not None:
            self.memo.note_insert(r.batch, r.offset + positions, slots, count_before, self.insert_count)

    def small_slots(self, keys: Iterable[OffloadKey], limit: int) -> list[int] | None:
        """Slot (-1 = absent) per key of a current :class:`KeyBatch`, or of a plain ``list`` of at
        most ``limit`` exact ``bytes``, with scalar code (the list is not kept); None otherwise."""
        if keys.__class__ is KeyBatch:
            if keys.owner is self and keys.epoch == self.epoch and len(keys) <= limit:  # type: ignore[attr-defined]
                return keys.slots  # type: ignore[attr-defined,no-any-return]
            return None
        if keys.__class__ is not list or len(keys) > limit:  # type: ignore[arg-type]
            return None
        if keys and set(map(type, keys)) != _BYTES_ONLY:  # C-level passes, no per-key bytecode
            return None
        return list(map(self.index.get, keys, repeat(-1)))

    def key_batch(
        self,
        keys: Iterable[OffloadKey],
        name: str = "keys",
        *,
        dedup: bool,
        limit: int = SMALL_KEY_BATCH,
        distinct: bool = False,
    ) -> KeyBatch:
        """Validate ``keys`` and resolve them to slots once, for the layers inside to reuse.

        ``dedup``: repeated keys are reduced to their first occurrence (else kept as given). A
        ``list`` of at most ``limit`` keys is resolved with scalar code. Same checks and errors as
        :meth:`resolve`; ``distinct`` (the caller knows there are no repeats) skips the repeat test.
        """
        if keys.__class__ is KeyBatch and keys.owner is self and keys.epoch == self.epoch:  # type: ignore[attr-defined]
            if keys.unique or not dedup:  # type: ignore[attr-defined]
                return keys  # type: ignore[return-value]
        slots = self.small_slots(keys, limit) if keys.__class__ is list else None
        if slots is not None:
            out = KeyBatch(keys)
            out.unique = True
            if not distinct and len(out) > 1 and len(set(out)) != len(out):
                out.unique = dedup
                if dedup:
                    first: dict[OffloadKey, int] = {}
                    for k, s in zip(keys, slots, strict=True):
                        first.setdefault(k, s)
                    out, slots = KeyBatch(first), list(first.values())
                    out.unique = True
        else:
            lst = list(keys) if keys.__class__ is KeyBatch else keys
            if dedup:
                lst = as_key_list(lst, name, allow_duplicates=True)
                if len(set(lst)) != len(lst):
                    lst = list(dict.fromkeys(lst))
            r = self.resolve(lst, name, allow_duplicates=not dedup, remember=False)
            out, slots = KeyBatch(r.keys), r.slots.tolist()
            out.unique = r.unique
        out.slots, out.owner, out.epoch = slots, self, self.epoch
        return out

    # ------------------------------------------------------------------ mutation
    def allocate(self, keys: list[OffloadKey], as_list: bool = False) -> Any:
        """Give each (absent, distinct) key a slot, mark it pending; return the slots (an ``int64``
        array, or with ``as_list`` a list, set with scalar operations: a few keys).

        Never-used slots first in increasing order, then freed slots last-in-first-out.
        The caller has checked that ``len(keys) <= num_free``.
        """
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
        if as_list:
            index, karr, ref = self.index, self.keys, self.ref_buf
            for k, s in zip(keys, slot_list, strict=True):
                index[k] = s
                karr[s] = k
                ref[s] = PENDING
            return slot_list
        slots = np.arange(start, start + m, dtype=np.int64) if fresh == m else np.array(slot_list, dtype=np.int64)
        self.index.update(zip(keys, slot_list, strict=True))
        if m:
            self.keys[slots] = keys if m > 1 else keys[0]
            self.ref[slots] = PENDING
        return slots

    def release(self, slots: np.ndarray | list[int], ready: bool = False) -> list[OffloadKey]:
        """Free ``slots`` (in that order onto the free list); return their keys.

        Updates ``num_pending``/``num_evictable`` from the slots' current state (``ready``:
        the caller knows they are all ready with ref count 0, i.e. eviction victims); the
        caller never releases pinned slots. A list of slots takes scalar operations.
        """
        if len(slots) == 0:
            return []
        if slots.__class__ is list:
            index, karr, ref, gen = self.index, self.keys, self.ref_buf, self.gen_mv
            keys: list[OffloadKey] = []
            n_pending = 0
            for s in slots:
                k = karr[s]
                keys.append(k)
                del index[k]
                karr[s] = None
                gen[s] = (gen[s] + 1) & 0xFFFFFFFF
                n_pending += ref[s] == PENDING
                ref[s] = FREE
            self.free_list.extend(slots)
        else:
            keys = self.keys[slots].tolist()
            deque(map(self.index.__delitem__, keys), maxlen=0)
            self.keys[slots] = None
            self.gen[slots] += 1
            n_pending = 0 if ready else int(np.count_nonzero(self.ref[slots] == PENDING))
            self.ref[slots] = FREE
            self.free_list.extend(slots.tolist())  # type: ignore[union-attr]
        self.num_pending -= n_pending
        self.num_evictable -= len(slots) - n_pending
        self.epoch += 1
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
        self.epoch += 1
        self.memo.clear()

    def metadata_nbytes(self) -> int:
        """Bytes held by the fixed per-slot arrays (not the dict / key objects)."""
        return self.ref.nbytes + self.keys.nbytes + self.gen.nbytes + self.prot_mark.nbytes
