"""Raw Triton kernel moving packed block records between paged KV-cache views and a host buffer.

Only ``@triton.jit`` code lives here; validation, table building and launching are in
:mod:`kvoffload.kernels.triton_backend`. The kernel is flat (no calls to other jit functions) so
that it also runs through ``triton.runtime.interpreter.InterpretedFunction`` on CPU tensors.

Memory model. All addresses are in *units* of ``VEC`` words (``VEC`` words = the job's common
alignment ``a`` in bytes, ``a`` in {1, 2, 4, 8, 16}); the kernel multiplies unit counts by the
constexpr ``VEC`` so the compiler can prove every access starts on an ``a``-byte boundary and
emit wide vector loads/stores. Different cache tensors have unrelated addresses, so the cache
side is addressed from one *anchor* pointer (``cache_ptr``, the first view's block 0) plus a
signed int64 delta per view; the host side from ``host_ptr`` (the pinned host buffer, read and
written directly by the GPU through unified virtual addressing -- no bounce buffer).

Tables (int64, on the cache's device):

* ``views_ptr``  ``[num_views, 4]``: ``(delta, block_stride, page, record_offset)`` in units;
  the views of group ``g`` are rows ``first[g] .. first[g] + count[g] - 1``.
* ``groups_ptr`` ``[num_groups, 2]``: ``(first, count)``.
* ``job_ptr``    ``[3, n]``: ``block_ids``, ``group_ids``, ``host_offsets`` (in units) -- per block
  only; the kernel derives every (block x view) address itself.

Work: ``n * max_views`` units (one page each; units past a group's view count are skipped),
distributed over a capped number of persistent programs in a grid-stride loop; each program
copies a page in ``BLOCK``-word chunks. All offsets are 64-bit. ``n_job``/``max_views`` are not
specialised (a job of one block must not compile a new kernel, nor turn them into constexprs).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["copy_records_kernel", "interpreter_probe_kernel"]


@triton.jit(do_not_specialize=["n_job", "max_views"])
def copy_records_kernel(
    cache_ptr,
    host_ptr,
    views_ptr,
    groups_ptr,
    job_ptr,
    n_job,
    max_views,
    TO_HOST: tl.constexpr,
    VEC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0).to(tl.int64)
    n = n_job.to(tl.int64)
    mv = max_views.to(tl.int64)
    total = n * mv
    for unit in range(pid, total, nprog):
        i = unit // mv
        v = unit - i * mv
        g = tl.load(job_ptr + n + i)
        first = tl.load(groups_ptr + 2 * g)
        count = tl.load(groups_ptr + 2 * g + 1)
        if v < count:
            row = views_ptr + 4 * (first + v)
            delta = tl.load(row)
            stride = tl.load(row + 1)
            page = tl.load(row + 2) * VEC
            rec = tl.load(row + 3)
            blk = tl.load(job_ptr + i)
            hoff = tl.load(job_ptr + 2 * n + i)
            cache_base = (delta + blk * stride) * VEC
            host_base = (hoff + rec) * VEC
            nchunks = (page + BLOCK - 1) // BLOCK
            for k in range(0, nchunks):
                idx = k * BLOCK + tl.arange(0, BLOCK)
                mask = idx < page
                if TO_HOST:
                    x = tl.load(cache_ptr + cache_base + idx, mask=mask)
                    tl.store(host_ptr + host_base + idx, x, mask=mask)
                else:
                    x = tl.load(host_ptr + host_base + idx, mask=mask)
                    tl.store(cache_ptr + cache_base + idx, x, mask=mask)


@triton.jit
def interpreter_probe_kernel(out_ptr, n):
    """Counts to ``n`` in a loop with a run-time bound: what :func:`copy_records_kernel` needs
    from Triton's interpreter (Triton <= 3.6 cannot do it under NumPy >= 2.4)."""
    acc = 0
    for _ in range(0, n):
        acc += 1
    tl.store(out_ptr, acc)
