"""A compact, bounded history of evicted keys: the last ``G`` of them, as 4-byte fingerprints.

An exact FIFO of ``G`` keys in Python (an ``OrderedDict``) costs ~100 bytes per key and keeps the
key objects alive; this keeps a ``uint32`` fingerprint and a ``uint32`` sequence number per entry.
Every added key gets the next sequence number; a key is remembered while fewer than ``G`` keys were
added after it -- a sharp window, like a FIFO of ``G`` keys (a key first seen again just inside the
window and one just outside are told apart, which matters to a policy sizing its history from
capacity). Entries live in ``B`` buckets of :data:`WAYS`, ``B`` the power of two at least
``2 * G / WAYS``; fingerprint ``f`` goes to bucket ``f & (B - 1)``, each bucket overwriting its
entries in turn (a cursor per bucket). With at least twice ``G`` entries, a key is overwritten
before it leaves the window only when :data:`WAYS` of the next ``G`` keys share its bucket (about 0.4 % of keys at
``2 * G`` entries, Poisson); false positives need equal 32-bit fingerprints.

Rules (the reference model in the tests implements exactly these): an entry holds ``f | 1``
(``0``: empty) and its sequence number; :meth:`GhostKeys.contains_pop` reports, per fingerprint,
whether its bucket has an entry holding ``f | 1`` among the last ``G`` added, and empties the
first such entry; :meth:`GhostKeys.add` gives the ``i``-th fingerprint of a call the sequence
number ``added + i`` and writes ``f | 1`` for each bucket's fingerprints of the call at the
bucket's cursor, *latest first*, advancing the cursor modulo :data:`WAYS` after each (one
vectorised write per round; the keys of a call beyond the latest :data:`WAYS` of one bucket are
not written).
Batched writes: :meth:`GhostKeys.queue` holds fingerprints back until at least ``batch`` are
queued, then adds the whole queue (:meth:`~GhostKeys.add`, in order): one vectorised write per
batch; queued keys are not found until then.
Memory: ``8 * WAYS * B + B`` bytes, 16.1 to 32.2 bytes per remembered key, plus the queue (4 bytes
per queued key).
"""

from __future__ import annotations

import logging
from array import array

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["WAYS", "GhostKeys"]

#: entries per bucket
WAYS = 16


_NEXT = ((np.arange(WAYS) + 1) % WAYS).astype(np.uint8)  # a bucket's next cursor


class GhostKeys:
    """The fingerprints of the last ``size`` keys added (module docstring).

    Args:
        size: ``G``, how many keys to remember (``1 <= size < 2**31``).
        batch: how many fingerprints :meth:`queue` holds back before adding them (``>= 1``).
    """

    def __init__(self, size: int, batch: int = 1) -> None:
        self.size = size
        self.batch = batch
        self._queued = array("I")  # fingerprints (uint32) queued, not added yet
        self.buckets = 1 << max(0, (-(-2 * size // WAYS) - 1).bit_length())
        self.mask = np.uint32(self.buckets - 1)  # a fingerprint's bucket: its low bits
        # written now (np.full, not np.zeros' lazily mapped pages): the first evictions after start
        # would otherwise pay a page fault per bucket row they reach (~1 us each, at every capacity)
        self.fp = np.full((self.buckets, WAYS), 0, dtype=np.uint32)  # a fingerprint per entry (0: empty)
        self.seq = np.full((self.buckets, WAYS), 0, dtype=np.uint32)  # its sequence number
        self.cursor = np.full(self.buckets, 0, dtype=np.uint8)
        self._fp_flat = self.fp.reshape(-1)  # views of the same entries, entry ``b * WAYS + way``
        self._seq_flat = self.seq.reshape(-1)
        self._fp_mv = self._fp_flat.data  # memoryviews for the scalar path (a few fingerprints)
        self._seq_mv = self._seq_flat.data
        self.added = 0  # sequence number of the next key (mod 2**32)
        self.empty = True  # nothing added since the start or the last clear
        self._steps = np.zeros(0, dtype=np.uint32)  # 0, 1, 2, ... (grown on demand)

    def contains_pop(self, fp: np.ndarray | list[int]) -> np.ndarray | list[bool] | None:
        """Boolean mask over ``fp`` (``uint32``): remembered; those entries are emptied. None: none is.
        ``fp`` a list of ints (a few fingerprints): the mask is a list."""
        if self.empty:  # (before the first eviction)
            return None
        if fp.__class__ is list:
            return self._contains_pop_list(fp)  # type: ignore[arg-type]
        b = fp & self.mask
        match = self.fp.take(b, axis=0) == (fp | np.uint32(1))[:, None]  # take: cheaper than fp[b]
        if not np.count_nonzero(match):  # the common case: one cheap test instead of the index search
            return None
        rows, ways = match.nonzero()  # row-major: rows ascending
        live = (np.uint32(self.added) - self.seq[b[rows], ways]) <= np.uint32(self.size)  # among the last size
        rows, ways = rows[live], ways[live]
        if len(rows) == 0:
            return None
        if len(rows) > 1 and (rows[1:] == rows[:-1]).any():  # a key matching twice: its first entry
            rows, first = np.unique(rows, return_index=True)
            ways = ways[first]
        self.fp[b[rows], ways] = 0
        hit = np.zeros(len(fp), dtype=bool)
        hit[rows] = True
        return hit

    def _contains_pop_list(self, fp: list[int]) -> list[bool] | None:
        """:meth:`contains_pop` by scalar steps: every lookup before any entry is emptied."""
        fpm, seqm, mask = self._fp_mv, self._seq_mv, int(self.mask)
        found = []
        for i, f in enumerate(fp):
            b = (f & mask) * WAYS
            row = fpm[b : b + WAYS].tolist()
            f1 = f | 1
            if f1 in row:
                found.append((i, b, row, f1))
        if not found:  # the common case
            return None
        added, size = self.added, self.size
        hit = [False] * len(fp)
        emptied = []
        for i, b, row, f1 in found:
            for w, g in enumerate(row):
                if g == f1 and ((added - seqm[b + w]) & 0xFFFFFFFF) <= size:  # among the last size
                    hit[i] = True
                    emptied.append(b + w)
                    break
        if not emptied:
            return None
        for e in emptied:
            fpm[e] = 0
        return hit

    def add(self, fp: np.ndarray) -> None:
        """Remember fingerprints (``uint32``), in order (see the module's rules for keys of one call
        that share a bucket)."""
        k = len(fp)
        if k == 0:
            return
        self.empty = False
        if len(self._steps) < k:
            self._steps = np.arange(max(k, 256), dtype=np.uint32)
        seq = self._steps[:k] + np.uint32(self.added)  # mod 2**32
        self.added = (self.added + k) & 0xFFFFFFFF
        b = (fp & self.mask).astype(np.intp)
        fp = fp | np.uint32(1)
        fp_flat, seq_flat, cursor = self._fp_flat, self._seq_flat, self.cursor
        for _ in range(WAYS):  # a round per key sharing a bucket with later keys of the call (rare)
            way = cursor[b]
            i = b * WAYS + way  # the entry's index in the flat arrays (cheaper than 2-d indexing)
            fp_flat[i] = fp  # a repeated bucket: the last key of the call wins (numpy's order)
            seq_flat[i] = seq
            cursor[b] = _NEXT[way]
            lost = seq_flat[i] != seq
            if not np.count_nonzero(lost):
                return
            b, fp, seq = b[lost], fp[lost], seq[lost]

    def queue(self, fp: np.ndarray | list[int]) -> None:
        """Remember fingerprints (``uint32``, or a list of ints), in order, once ``batch`` are queued
        (module docstring)."""
        if fp.__class__ is list:
            self._queued.extend(fp)  # type: ignore[arg-type]
        else:
            self._queued.frombytes(fp.tobytes())  # type: ignore[union-attr]
        if len(self._queued) >= self.batch:
            self.add(np.frombuffer(self._queued, dtype=np.uint32))
            self._queued = array("I")

    def clear(self) -> None:
        self._queued = array("I")
        self.fp[:] = 0
        self.seq[:] = 0
        self.cursor[:] = 0
        self.added = 0
        self.empty = True

    def nbytes(self) -> int:
        return self.fp.nbytes + self.seq.nbytes + self.cursor.nbytes + len(self._queued) * 4
