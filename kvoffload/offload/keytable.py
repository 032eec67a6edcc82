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

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.offload.base import validate_keys

logger = logging.getLogger(__name__)

__all__ = ["FREE", "PENDING", "SlotTable", "as_key_list", "int_view"]

#: ``ref`` value of a free slot.
FREE = -2
#: ``ref`` value of a slot whose store is in flight.
PENDING = -1

_EMPTY_I64 = np.zeros(0, dtype=np.int64)


def int_view(buf: array, dtype: type) -> np.ndarray:
    """A numpy view sharing memory with ``buf`` (an empty array when ``buf`` is empty)."""
    if len(buf) == 0:
        return np.zeros(0, dtype=dtype)
    view = np.frombuffer(buf, dtype=dtype)
    assert view.size == len(buf)
    return view


def as_key_list(keys: Iterable[bytes], name: str = "keys", *, allow_duplicates: bool) -> list[bytes]:
    """Validate a batch of keys with C-speed checks and return it as a new list.

    The fast path (every item exactly ``bytes``) costs two C loops; anything else goes
    through :func:`kvoffload.offload.base.validate_keys`, which accepts ``bytes`` subclasses
    and raises the typed error naming the bad item.
    """
    if isinstance(keys, (bytes, str, bytearray, memoryview)) or keys is None:
        return validate_keys(keys, name, allow_duplicates=allow_duplicates)  # type: ignore[arg-type]
    try:
        lst = list(keys)
    except TypeError as exc:
        raise InvalidTypeError(f"{name} must be an iterable of bytes keys, got {type(keys).__name__}") from exc
    if lst and set(map(type, lst)) != {bytes}:
        return validate_keys(lst, name, allow_duplicates=allow_duplicates)
    if not allow_duplicates and len(set(lst)) != len(lst):
        return validate_keys(lst, name, allow_duplicates=False)
    return lst


class SlotTable:
    """Key index and per-slot state of a pool of ``num_blocks`` CPU slots.

    Args:
        num_blocks: number of slots (``>= 0``).
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, (int, np.integer)):
            raise InvalidTypeError(f"num_blocks must be an int, got {type(num_blocks).__name__} {num_blocks!r}")
        if num_blocks < 0:
            raise InvalidArgumentError(f"num_blocks must be >= 0, got {num_blocks}")
        if array("i").itemsize != 4:  # pragma: no cover - every mainstream platform
            raise RuntimeError("array('i') is not 32-bit on this platform")
        n = int(num_blocks)
        self.num_blocks: int = n
        self.index: dict[bytes, int] = {}
        self.keys: list[bytes | None] = [None] * n
        self.ref_buf: array = array("i", [FREE]) * n
        self.ref: np.ndarray = int_view(self.ref_buf, np.int32)
        self.num_allocated: int = 0
        self.free_list: list[int] = []
        self.num_pending: int = 0
        self.num_evictable: int = 0
        self.num_pinned: int = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        """Slots that can be allocated without evicting."""
        return self.num_blocks - self.num_allocated + len(self.free_list)

    @property
    def num_used(self) -> int:
        """Slots holding a key (pending or ready)."""
        return len(self.index)

    def slots_of(self, keys: list[bytes]) -> np.ndarray:
        """``int64`` slot of each key, ``-1`` for absent keys."""
        if not keys:
            return _EMPTY_I64
        return np.fromiter(map(self.index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))

    # ------------------------------------------------------------------ mutation
    def allocate(self, keys: list[bytes]) -> np.ndarray:
        """Give each (absent, distinct) key a slot, mark it pending; return the slots.

        Never-used slots first in increasing order, then freed slots last-in-first-out.
        The caller has checked that ``len(keys) <= num_free``.
        """
        m = len(keys)
        fresh = min(m, self.num_blocks - self.num_allocated)
        start = self.num_allocated
        slot_list = list(range(start, start + fresh))
        self.num_allocated += fresh
        if fresh:
            self.keys[start : start + fresh] = keys[:fresh]
        reused = m - fresh
        if reused:
            tail = self.free_list[-reused:]
            del self.free_list[-reused:]
            tail.reverse()
            for s, k in zip(tail, keys[fresh:]):
                self.keys[s] = k
            slot_list += tail
        self.index.update(zip(keys, slot_list))
        slots = np.array(slot_list, dtype=np.int64) if m else _EMPTY_I64
        self.ref[slots] = PENDING
        self.num_pending += m
        return slots

    def release(self, slots: np.ndarray) -> list[bytes]:
        """Free ``slots`` (in that order onto the free list); return their keys.

        Updates ``num_pending``/``num_evictable`` from the slots' current state; the caller
        never releases pinned slots.
        """
        sl: list[int] = slots.tolist()
        if not sl:
            return []
        keys: list[bytes] = [self.keys[s] for s in sl]  # type: ignore[misc]
        deque(map(self.index.__delitem__, keys), maxlen=0)
        for s in sl:
            self.keys[s] = None
        states = self.ref[slots]
        n_pending = int(np.count_nonzero(states == PENDING))
        self.num_pending -= n_pending
        self.num_evictable -= len(sl) - n_pending
        self.ref[slots] = FREE
        self.free_list.extend(sl)
        return keys

    def clear(self) -> None:
        """Forget every key and return every slot to the never-used state."""
        self.index.clear()
        self.keys = [None] * self.num_blocks
        if self.num_blocks:
            self.ref[:] = FREE
        self.num_allocated = 0
        self.free_list.clear()
        self.num_pending = 0
        self.num_evictable = 0
        self.num_pinned = 0

    def metadata_nbytes(self) -> int:
        """Bytes held by the fixed per-slot arrays (not the dict / key objects)."""
        return self.ref.nbytes + 8 * len(self.keys)
