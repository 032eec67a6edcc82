"""A compact, bounded history of evicted keys: the last ``G`` of them, as 4-byte fingerprints.

An exact FIFO of ``G`` keys in Python (an ``OrderedDict``) costs ~100 bytes per key and keeps the
key objects alive; this keeps a ``uint32`` fingerprint and a ``uint32`` sequence number per entry.
Every added key gets the next sequence number; a key is remembered while fewer than ``G`` keys were
added after it -- a sharp window, like a FIFO of ``G`` keys (a key first seen again just inside the
window and one just outside are told apart, which matters to a policy sizing its history from
capacity). Entries live in ``B`` buckets of :data:`WAYS`, ``B`` the power of two at least
``2 * G / WAYS``; fingerprint ``f`` goes to bucket ``f & (B - 1)``, each bucket overwriting its
entries in turn (a cursor per bucket). With at least twice ``G`` entries, a key is overwritten
before it leaves the window only when :data:`WAYS` of the next ``G`` keys share its bucket
(about 0.4 % of keys at ``2 * G`` entries, Poisson); false positives need equal 32-bit fingerprints.

Rules (the reference model in the tests implements exactly these): an entry holds ``f | 1``
(``0``: empty) and its sequence number; :meth:`GhostKeys.contains_pop` reports, per fingerprint,
whether its bucket has an entry holding ``f | 1`` among the last ``G`` added, and empties
the first such entry; :meth:`GhostKeys.add` writes ``f | 1`` and the next sequence number at the
bucket's cursor and advances the cursor modulo :data:`WAYS`, in order.
Memory: ``8 * WAYS * B + B`` bytes, 16.1 to 32.2 bytes per remembered key.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["WAYS", "GhostKeys"]

#: entries per bucket
WAYS = 16


class GhostKeys:
    """The fingerprints of the last ``size`` keys added (module docstring).

    Args:
        size: ``G``, how many keys to remember (``1 <= size < 2**31``).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.buckets = 1 << max(0, (-(-2 * size // WAYS) - 1).bit_length())
        self.mask = self.buckets - 1
        self.fp = np.zeros((self.buckets, WAYS), dtype=np.uint32)
        self.seq = np.zeros((self.buckets, WAYS), dtype=np.uint32)
        self.cursor = np.zeros(self.buckets, dtype=np.uint8)
        self.added = 0  # sequence number of the next key (mod 2**32)
        self._fp = self.fp.reshape(-1).data
        self._seq = self.seq.reshape(-1).data
        self._cur = self.cursor.data

    def contains_pop(self, fp: np.ndarray) -> np.ndarray:
        """Boolean mask over ``fp`` (``uint32``): remembered; those entries are emptied."""
        if len(fp) == 0:
            return np.zeros(0, dtype=bool)
        b = fp & np.uint32(self.mask)
        match = self.fp[b] == (fp | np.uint32(1))[:, None]
        match &= (np.uint32(self.added) - self.seq[b]) <= np.uint32(self.size)  # among the last size added
        hit = match.any(axis=1)
        if hit.any():
            rows = hit.nonzero()[0]
            self.fp[b[rows], match[rows].argmax(axis=1)] = 0
        return hit

    def add(self, fp: list[int]) -> None:
        """Remember fingerprints (Python ints), in order."""
        fps, seqs, cur, mask = self._fp, self._seq, self._cur, self.mask
        n = self.added
        for f in fp:
            b = f & mask
            c = cur[b]
            i = b * WAYS + c
            fps[i] = f | 1
            seqs[i] = n
            n = (n + 1) & 0xFFFFFFFF
            cur[b] = (c + 1) % WAYS
        self.added = n

    def clear(self) -> None:
        self.fp[:] = 0
        self.seq[:] = 0
        self.cursor[:] = 0
        self.added = 0

    def nbytes(self) -> int:
        return self.fp.nbytes + self.seq.nbytes + self.cursor.nbytes
