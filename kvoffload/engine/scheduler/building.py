"""Building transfer jobs for one request.

* :func:`build_store_job`: the newly full offloaded blocks of all groups, one ``prepare_store``.
* :func:`build_load_job`: the blocks a load offer covers, one ``prepare_load`` (pins them).

GPU blocks the request no longer holds (:data:`~kvoffload.engine.scheduler.state.FREED`: freed by the
engine, or its null block) are never read nor written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec, OffloadKey
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import TransferJob
from kvoffload.engine.scheduler.state import FREED, LoadOffer, RequestOffloadState
from kvoffload.errors import InvalidArgumentError, KeyStateError

__all__ = ["build_store_job", "build_load_job", "load_targets"]


def build_store_job(
    st: RequestOffloadState,
    config: OffloadingSchedulerConfig,
    manager: Any,
    num_tokens: int,
    job_id: int,
) -> TransferJob | None:
    """Prepare the store of every offloaded block of ``st`` that is full within ``num_tokens``.

    ``num_tokens`` are the request's computed tokens after this step. The blocks from each
    group's ``next_store_block`` up to the last full one (within the hashed tokens and the
    ``max_offload_tokens`` cap) go to one ``manager.prepare_store`` call. None from the manager:
    nothing changes, the same blocks are offered again next step. Otherwise the store progress
    advances and, when ``keys_to_store`` is not empty, a store job carrying exactly those keys is
    returned (GPU blocks ordered by group, ``block_indices[g]`` = index of group g's first GPU
    block in the request; the CPU spec is the manager's, slot ``i`` for ``keys_to_store[i]``).
    """
    tokens = st.offloadable_tokens(num_tokens)
    if tokens < st.next_store_tokens:
        return None
    st.update_keys(tokens)
    groups = config.groups
    full = [tokens // g.offloaded_block_size for g in groups]
    # offloaded block indices offered per group: a block with a freed (or null) GPU block is
    # skipped -- its bytes are gone, it is simply not offloaded
    candidates: list[range | list[int]] = []
    keys: list[OffloadKey] = []
    for gcfg, gs, n in zip(groups, st.groups, full, strict=False):
        cand: range | list[int] = range(gs.next_store_block, n) if n > gs.next_store_block else range(0)
        if gs.has_holes and cand:
            f, t = gcfg.block_size_factor, gs.block_ids
            cand = [i for i in cand if FREED not in t[i * f : (i + 1) * f]]
        candidates.append(cand)
        keys.extend(gs.keys[cand.start : cand.stop] if isinstance(cand, range) else [gs.keys[i] for i in cand])
    if not keys:
        st.advance_store_progress(full)
        return None
    out = manager.prepare_store(keys, st.req_context)
    if out is None:
        return None
    st.advance_store_progress(full)
    to_store = list(out.keys_to_store)
    if not to_store:
        return None
    if len(out.store_spec.block_ids) != len(to_store):
        raise KeyStateError(
            f"manager.prepare_store returned {len(out.store_spec.block_ids)} slots for {len(to_store)} keys"
        )
    # offloaded block indices selected per group
    selected: Sequence[range | list[int]]
    if len(to_store) == len(keys):
        selected = candidates
    else:
        where: dict[bytes, tuple[int, int]] = {}
        for g, (gs, cand) in enumerate(zip(st.groups, candidates, strict=False)):
            for i in cand:
                where[gs.keys[i]] = (g, i)
        sel: list[list[int]] = [[] for _ in groups]
        for k in to_store:
            g, i = where[k]
            sel[g].append(i)
        selected = sel
    gpu_ids: list[int] = []
    sizes: list[int] = []
    first_idx: list[int] = []
    offsets: list[np.ndarray] = []
    for gcfg, gs, blocks in zip(groups, st.groups, selected, strict=False):
        f = gcfg.block_size_factor
        table = gs.block_ids
        n0 = len(gpu_ids)
        if isinstance(blocks, range) and f == 1:
            gpu_ids.extend(table[blocks.start : blocks.stop])
            offs = np.arange(blocks.start, blocks.stop, dtype=np.int64)
        else:
            idx = [i * f + j for i in blocks for j in range(f)]
            gpu_ids.extend(table[i] for i in idx)
            offs = np.asarray(idx, dtype=np.int64)
        sizes.append(len(gpu_ids) - n0)
        first_idx.append(int(offs[0]) if offs.size else 0)
        offsets.append(offs)
    gpu_spec = GPULoadStoreSpec(
        np.array(gpu_ids, dtype=np.int64), np.array(sizes, dtype=np.int64), np.array(first_idx, dtype=np.int64)
    )
    return TransferJob(job_id, st.req_id, True, (gpu_spec, out.store_spec), to_store, tuple(offsets))


def load_targets(offer: LoadOffer, tables: list[list[int]]) -> tuple[tuple[int, int], ...]:
    """``offer.gpu_ranges`` without the leading :data:`FREED` entries of each group's range.

    The engine holds no block there (a sliding-window group keeps fewer blocks than the load's
    window covers), so nothing is loaded there. A hole after a block of the range is an error
    (the request's blocks are written contiguously).
    """
    out = []
    for g, ((first, last), t) in enumerate(zip(offer.gpu_ranges, tables, strict=False)):
        while first < last and t[first] == FREED:
            first += 1
        if FREED in t[first:last]:
            raise InvalidArgumentError(
                f"block_ids_per_group[{g}][{t.index(FREED, first)}] is the null block, but the load of "
                f"blocks {first}..{last - 1} writes it"
            )
        out.append((first, last))
    return tuple(out)


def build_load_job(
    st: RequestOffloadState,
    config: OffloadingSchedulerConfig,
    manager: Any,
    ranges: tuple[tuple[int, int], ...],
    tables: list[list[int]],
    job_id: int,
) -> TransferJob:
    """The load job writing GPU blocks ``ranges``: ``prepare_load`` pins the keys; nothing else changes.

    Group g writes GPU blocks ``tables[g][first:last]`` (``ranges[g]``, see :func:`load_targets`)
    from the offloaded blocks ``first // factor .. last // factor``; ``block_indices[g] = first``,
    so the worker skips ``first % factor`` GPU blocks of the first offloaded block.
    """
    keys: list[OffloadKey] = []
    gpu_ids: list[int] = []
    sizes: list[int] = []
    for gcfg, gs, (first, last), t in zip(config.groups, st.groups, ranges, tables, strict=False):
        f = gcfg.block_size_factor
        if last > first:
            keys.extend(gs.keys[first // f : -(-last // f)])
        gpu_ids.extend(t[first:last])
        sizes.append(last - first)
    cpu_spec = manager.prepare_load(keys, st.req_context)
    if not isinstance(cpu_spec, CPULoadStoreSpec) or len(cpu_spec.block_ids) != len(keys):
        raise KeyStateError(f"manager.prepare_load returned {cpu_spec!r} for {len(keys)} keys")
    gpu_spec = GPULoadStoreSpec(gpu_ids, sizes, [r[0] for r in ranges])
    offsets = tuple(np.arange(first, last, dtype=np.int64) for first, last in ranges)
    return TransferJob(job_id, st.req_id, False, (cpu_spec, gpu_spec), keys, offsets)
