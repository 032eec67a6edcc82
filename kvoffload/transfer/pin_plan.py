"""Where a host pool is page-locked: the ``cudaHostRegister`` ranges of a pool of strided rows.

A pool is ``num_rows`` rows (host slots) ``stride`` bytes apart from address ``base``; its user
touches only the first ``used`` bytes of each row (all of it, or one worker's area of a row of
vLLM's shared offload region, whose other areas belong to other processes). The pool ends at
``end`` (the last row may be short). :func:`plan_registrations` picks the ranges to register, in
ascending address order, all page aligned (the driver pins whole pages, and two registrations of
one process must not share a page):

* **per row** -- when the rows hold more than what the user touches and leaving the rest
  unregistered saves at least ``max(OS page, MIN_SAVED_BYTES_PER_ROW)`` bytes per row (the rule
  vLLM 0.33 applies to its shared region), each row's used range, rounded out to whole pages, is
  its own registration. Such ranges never share a page (the gap between two is at least a page),
  and no two records of different rows are contiguous, so no copy can cross from one to the next.
* **whole rows** -- otherwise, row-aligned chunks: from the page holding the first row's start to
  the page holding the last used byte, split before some rows ``r`` into registrations of at
  most ``max_bytes`` bytes. A split point is the page boundary at or below row ``r``'s start, and
  only where that boundary lies in the unused tail of row ``r - 1`` or exactly at row ``r``'s start,
  so no record straddles two registrations. A chunk is cut at the last such row within the bound;
  where there is none (one row larger than the bound, or rows whose starts miss page boundaries
  for longer than the bound) it ends at the first one after, so only then exceeds the bound.

The registrations are grouped into chunks of at most ``max_bytes`` bytes (a chunk holds at
least one registration): the first chunk is what a pool pins before it serves
(:class:`~kvoffload.transfer.host_pool.HostPool`), each registration after it makes the next rows
usable. Pure arithmetic (numpy), nothing registered here.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["MAX_REGISTER_BYTES", "MIN_SAVED_BYTES_PER_ROW", "RegisterPlan", "plan_registrations", "row_pages"]

#: Largest ``cudaHostRegister`` call by default (vLLM 0.33's bound; a single registration of
#: >= 512 GiB fails, vLLM issues #51080/#51081).
MAX_REGISTER_BYTES = 64 << 30
#: Registering each row's used range alone must save at least this many bytes per row (and at
#: least an OS page), else whole rows are registered (vLLM 0.33's threshold).
MIN_SAVED_BYTES_PER_ROW = 3 << 20


@dataclass(frozen=True)
class RegisterPlan:
    """The registrations of one pool, in ascending address order.

    Attributes:
        starts: ``int64[n]`` absolute start address of each registration (page aligned).
        sizes: ``int64[n]`` bytes of each registration (whole pages).
        rows: ``int64[n]`` rows ``[0, rows[i])`` are wholly registered once registrations
            ``0..i`` are (ascending; ``rows[-1]`` is the number of rows).
        first_chunk: how many registrations form the first chunk (``>= 1``).
        cuts: ``int64[m]`` sorted byte offsets, relative to row 0's start, at which one
            registration ends and the next begins between two rows that touch: a copy of pool
            bytes must not run across one (empty when no two used ranges of different
            registrations are contiguous).
        per_row: whether each row's used range is registered alone.
    """

    starts: np.ndarray
    sizes: np.ndarray
    rows: np.ndarray
    first_chunk: int
    cuts: np.ndarray
    per_row: bool

    def __len__(self) -> int:
        return int(self.starts.size)

    @property
    def nbytes(self) -> int:
        """Bytes registered in all."""
        return int(self.sizes.sum())

    def describe(self) -> str:
        """One line for logs: how much, in how many registrations, which layout."""
        how = "each row's used range alone" if self.per_row else "whole rows"
        return f"{self.nbytes} bytes in {len(self)} registration(s) of <= {int(self.sizes.max())} bytes ({how})"


def _warn_oversized(sizes: np.ndarray, max_bytes: int, stride: int) -> None:
    big = int(sizes.max())
    if big > max_bytes:
        logger.warning(
            "host pool: a registration of %d bytes exceeds the bound of %d bytes (rows of %d bytes: no "
            "page-aligned row boundary within the bound)",
            big,
            max_bytes,
            stride,
        )


def row_pages(
    base: int, num_rows: int, stride: int, used: int, end: int, page: int = mmap.PAGESIZE
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's used range (its first ``used`` bytes, up to ``end``) rounded out to whole pages:
    ``(starts, sizes)``, ``int64[num_rows]`` each (what a row registers, or binds to a NUMA node, alone)."""
    row_start = base + np.arange(num_rows, dtype=np.int64) * stride
    starts = row_start // page * page
    return starts, -(-np.minimum(row_start + used, end) // page) * page - starts


def plan_registrations(
    base: int,
    num_rows: int,
    stride: int,
    used: int,
    end: int,
    max_bytes: int = MAX_REGISTER_BYTES,
    page: int = mmap.PAGESIZE,
) -> RegisterPlan:
    """The registrations of a pool (see the module docstring); arguments as named there.

    The caller checked them: ``num_rows >= 1``, ``1 <= used <= stride``, ``max_bytes >= 1``,
    ``page`` a power of two, and ``base + (num_rows - 1) * stride < end``.
    """
    n = num_rows
    row_start = base + np.arange(n, dtype=np.int64) * stride
    used_end = np.minimum(row_start + used, end)
    if used < stride and stride - used >= max(page, MIN_SAVED_BYTES_PER_ROW):
        starts, sizes = row_pages(base, n, stride, used, end, page)
        chunk = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))
        _warn_oversized(sizes, max_bytes, stride)
        return RegisterPlan(
            starts=starts,
            sizes=sizes,
            rows=np.arange(1, n + 1, dtype=np.int64),
            first_chunk=max(1, chunk),
            cuts=np.zeros(0, dtype=np.int64),
            per_row=True,
        )
    # whole rows: the rows r (1..n-1) before which a registration may end, and where
    split = row_start[1:] // page * page
    ok = split >= used_end[:-1]
    cut_rows = np.flatnonzero(ok) + 1
    cut_at = split[ok]
    lo, hi = base // page * page, -(-int(used_end[-1]) // page) * page
    starts_l, rows_l = [lo], []
    k = 0  # the next usable entry of cut_rows
    while hi - starts_l[-1] > max_bytes and k < cut_rows.size:
        last = int(np.searchsorted(cut_at, starts_l[-1] + max_bytes, side="right")) - 1
        last = max(last, k)  # none within the bound: the first one after it
        rows_l.append(int(cut_rows[last]))
        starts_l.append(int(cut_at[last]))
        k = last + 1
    rows_l.append(n)
    starts = np.array(starts_l, dtype=np.int64)
    sizes = np.diff(np.append(starts, hi))
    inner = np.array(rows_l[:-1], dtype=np.int64)
    # a copy can only run from one registration into the next where the rows touch
    touching = inner[used_end[inner - 1] == row_start[inner]] if inner.size else inner
    _warn_oversized(sizes, max_bytes, stride)
    return RegisterPlan(
        starts=starts,
        sizes=sizes,
        rows=np.array(rows_l, dtype=np.int64),
        first_chunk=1,
        cuts=(touching * stride).astype(np.int64),
        per_row=False,
    )
