"""Raw Triton kernel moving packed block records between paged KV-cache views and a flat buffer.

Only ``@triton.jit`` code lives here; validation, table building and launching are in
:mod:`kvoffload.kernels.triton_backend`. The kernel is flat (no calls to other jit functions) so
that it also runs through ``triton.runtime.interpreter.InterpretedFunction`` on CPU tensors.

The *buffer* is either the pinned host pool (read/written by the SMs directly through unified
virtual addressing: the direct path) or a staging buffer in GPU memory (the copy-engine paths,
see :mod:`kvoffload.kernels.paths`); ``BUF_ON_HOST`` only picks the cache hints.

Memory model. All addresses are in *units* of ``VEC`` words (``VEC`` words = the job's common
alignment ``a`` in bytes, ``a`` in {1, 2, 4, 8, 16}); the kernel multiplies unit counts by the
constexpr ``VEC`` so the compiler can prove every access starts on an ``a``-byte boundary and
emit wide vector loads/stores. Different cache tensors have unrelated addresses, so the cache
side is addressed from one *anchor* pointer (``cache_ptr``) plus a signed int64 delta per view.

Tables (int64, on the cache's device, built once per table):

* ``views_ptr``  ``[num_views, 4]``: ``(delta, block_stride, page, record_offset)`` in units;
  the views of group ``g`` are rows ``first[g] .. first[g] + count[g] - 1``.
* ``groups_ptr`` ``[num_groups, 2]``: ``(first, count)``.
* ``job_ptr``    ``[n, 3]``: one row per block, ``(block_id, group_id, buffer offset in units)``
  -- per block only; the kernel derives every (block x view) address itself. Rows of several
  jobs appended one after another are one job (a merged launch). On the direct path the table
  may be pinned host memory that the host refills between launches (the transfer worker's job
  tables): it is loaded with ``.cv`` (fetched again, never served from a cache).

Work. ``n * max_views`` *pages* (units past a group's view count are skipped) are cut into tiles
of ``PAGES`` pages; persistent programs (a capped grid) take tiles in a grid-stride loop. A tile
is copied as a ``[PAGES, CHUNK]`` block of words, ``CHUNK`` words per page per step (pages longer
than ``CHUNK`` take several steps), so small pages still keep many bytes in flight per program
and every thread moves whole 16-byte vectors where the alignment allows. The metadata of a
program's *next* tile is loaded before the current tile's data moves (loaded ahead), so the
dependent metadata loads do not serialise with the copy. Every tile takes
``ceil(max_page / CHUNK)`` steps (``max_page``: the table's largest page, in units; shorter pages
are masked). All offsets are 64-bit. ``n_job``/``max_views``/``max_page`` are not specialised (a
job of one block must not compile a new kernel).

Cache hints: the GPU side of a pack is read with ``evict_first`` (each page is read once), host
stores are streaming (``.cs``), host loads bypass L1 (``.cg``). ``.cg`` and ``evict_first`` are
never combined: Triton 3.6 emits PTX for that pair that ptxas rejects.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["copy_pages_kernel", "interpreter_probe_kernel"]


@triton.jit(do_not_specialize=["n_job", "max_views", "max_page"])
def copy_pages_kernel(
    cache_ptr,
    buf_ptr,
    views_ptr,
    groups_ptr,
    job_ptr,
    n_job,
    max_views,
    max_page,
    TO_BUF: tl.constexpr,
    BUF_ON_HOST: tl.constexpr,
    VEC: tl.constexpr,
    PAGES: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    n = n_job.to(tl.int64)
    mv = max_views.to(tl.int64)
    total = n * mv
    ntiles = (total + PAGES - 1) // PAGES
    rows = tl.arange(0, PAGES).to(tl.int64)
    cols = tl.arange(0, CHUNK).to(tl.int64)
    steps = (max_page.to(tl.int64) * VEC + CHUNK - 1) // CHUNK
    # the job table may be pinned host memory refilled between launches: never served from a cache
    JOB_CACHE: tl.constexpr = ".cv" if BUF_ON_HOST else ""

    # metadata of this program's first tile
    u = pid * PAGES + rows
    ok = u < total
    i = u // mv
    v = u - i * mv
    g = tl.load(job_ptr + 3 * i + 1, mask=ok, other=0, cache_modifier=JOB_CACHE)
    first = tl.load(groups_ptr + 2 * g, mask=ok, other=0)
    count = tl.load(groups_ptr + 2 * g + 1, mask=ok, other=0)
    ok = ok & (v < count)
    row = views_ptr + 4 * (first + v)
    delta = tl.load(row, mask=ok, other=0)
    stride = tl.load(row + 1, mask=ok, other=0)
    page = tl.load(row + 2, mask=ok, other=0) * VEC
    rec = tl.load(row + 3, mask=ok, other=0)
    blk = tl.load(job_ptr + 3 * i, mask=ok, other=0, cache_modifier=JOB_CACHE)
    boff = tl.load(job_ptr + 3 * i + 2, mask=ok, other=0, cache_modifier=JOB_CACHE)
    cache_base = (delta + blk * stride) * VEC
    buf_base = (boff + rec) * VEC

    for tile in range(pid, ntiles, nprog):
        # metadata of the next tile, loaded ahead of this tile's data
        nu = (tile + nprog) * PAGES + rows
        nok = nu < total
        ni = nu // mv
        nv = nu - ni * mv
        ng = tl.load(job_ptr + 3 * ni + 1, mask=nok, other=0, cache_modifier=JOB_CACHE)
        nfirst = tl.load(groups_ptr + 2 * ng, mask=nok, other=0)
        ncount = tl.load(groups_ptr + 2 * ng + 1, mask=nok, other=0)
        nok = nok & (nv < ncount)
        nrow = views_ptr + 4 * (nfirst + nv)
        ndelta = tl.load(nrow, mask=nok, other=0)
        nstride = tl.load(nrow + 1, mask=nok, other=0)
        npage = tl.load(nrow + 2, mask=nok, other=0) * VEC
        nrec = tl.load(nrow + 3, mask=nok, other=0)
        nblk = tl.load(job_ptr + 3 * ni, mask=nok, other=0, cache_modifier=JOB_CACHE)
        nboff = tl.load(job_ptr + 3 * ni + 2, mask=nok, other=0, cache_modifier=JOB_CACHE)

        for k in range(0, steps):
            idx = k * CHUNK + cols[None, :]
            mask = idx < page[:, None]
            c_off = cache_base[:, None] + idx
            b_off = buf_base[:, None] + idx
            if TO_BUF:
                x = tl.load(cache_ptr + c_off, mask=mask, eviction_policy="evict_first")
                if BUF_ON_HOST:
                    tl.store(buf_ptr + b_off, x, mask=mask, cache_modifier=".cs")
                else:
                    tl.store(buf_ptr + b_off, x, mask=mask)
            else:
                if BUF_ON_HOST:
                    x = tl.load(buf_ptr + b_off, mask=mask, cache_modifier=".cg")
                else:
                    x = tl.load(buf_ptr + b_off, mask=mask, eviction_policy="evict_first")
                tl.store(cache_ptr + c_off, x, mask=mask)

        page = npage
        cache_base = (ndelta + nblk * nstride) * VEC
        buf_base = (nboff + nrec) * VEC


@triton.jit
def interpreter_probe_kernel(out_ptr, n):
    """Counts to ``n`` in a loop with a run-time bound: what :func:`copy_pages_kernel` needs
    from Triton's interpreter (Triton <= 3.6 cannot do it under NumPy >= 2.4)."""
    acc = 0
    for _ in range(0, n):
        acc += 1
    tl.store(out_ptr, acc)
