"""Turn a (GPU spec, CPU spec) pair into the flat per-block arrays one kernel launch consumes.

Pure numpy, no torch: the transfer worker calls :func:`map_job` once per job and hands the three
arrays to ONE ``backend.pack`` / ``backend.unpack`` call.

Mapping (the scheduler builds specs this way)::

    GPU spec: block ids ordered by group, group_sizes[g] of them for group g, and
              block_indices[g] = index within the request of group g's first GPU block.
    CPU spec: slot ids ordered by group the same way; group g uses
              ceil((skip_g + group_sizes[g]) / factor_g) slots (0 if group_sizes[g] == 0),
              where skip_g = block_indices[g] % factor_g.
    GPU block j of group g (0-based within the group) <-> slot cpu_ids_g[(skip_g + j) // factor_g],
              record position (skip_g + j) % factor_g, i.e. host byte offset
              slot * slot_bytes + ((skip_g + j) % factor_g) * record_bytes_g.

Groups whose record is empty (``record_bytes_g == 0``: no layer of that group lives on this
worker, e.g. under pipeline parallelism) still consume their slots in the CPU spec, but their GPU
blocks are neither range-checked nor moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["JobArrays", "GroupGeometry", "map_job", "slots_per_group"]


@dataclass(frozen=True)
class GroupGeometry:
    """What the mapping needs to know about the KV-cache groups and the host pool.

    Attributes:
        record_bytes: ``int64[G]``, bytes of one GPU block's record per group (0 = empty group).
        num_gpu_blocks: ``int64[G]``, GPU blocks per group (ids must be below it).
        factors: ``int64[G]``, GPU blocks per offloaded block per group (``>= 1``).
        slot_bytes: bytes of one host slot (``>= max(factors * record_bytes)``).
        num_slots: number of host slots.
    """

    record_bytes: np.ndarray
    num_gpu_blocks: np.ndarray
    factors: np.ndarray
    slot_bytes: int
    num_slots: int

    @property
    def num_groups(self) -> int:
        return int(self.record_bytes.size)


@dataclass(frozen=True)
class JobArrays:
    """Per-block arrays of one job, in GPU-spec order, empty groups left out.

    Attributes:
        block_ids: ``int64[N]`` GPU block ids.
        group_ids: ``int32[N]`` KV-cache group of each block.
        host_offsets: ``int64[N]`` byte offset of each block's record in the host pool.
        record_bytes: ``int64[N]`` bytes of each block's record.
        transfer_size: bytes moved (sum of the records' bytes).
    """

    block_ids: np.ndarray
    group_ids: np.ndarray
    host_offsets: np.ndarray
    record_bytes: np.ndarray
    transfer_size: int

    def __len__(self) -> int:
        return int(self.block_ids.size)


def slots_per_group(group_sizes: np.ndarray, block_indices: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """``int64[G]``: host slots each group of a job uses (see the module docstring)."""
    skips = block_indices % factors
    return np.where(group_sizes > 0, (skips + group_sizes + factors - 1) // factors, 0).astype(np.int64)


def map_job(gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, geom: GroupGeometry, *, store: bool) -> JobArrays:
    """Validate a job and build its per-block arrays: the worker's one check of a job's ids (the
    specs' constructors only convert them), so the kernels take the result without checking again.

    Args:
        gpu_spec: the GPU side (block ids by group, group sizes, block indices).
        cpu_spec: the host side (slot ids by group).
        geom: the groups' and pool's geometry.
        store: True for GPU -> CPU (destinations = host records, must be distinct slots),
            False for CPU -> GPU (destinations = GPU blocks, must be distinct per group).

    Raises:
        InvalidTypeError: a spec of the wrong class.
        InvalidArgumentError: group count, slot count, slot or block id out of range, duplicate
            destinations. Raised before anything is moved.
    """
    if not isinstance(gpu_spec, GPULoadStoreSpec):
        raise InvalidTypeError(f"gpu_spec must be a GPULoadStoreSpec, got {type(gpu_spec).__name__}")
    if not isinstance(cpu_spec, CPULoadStoreSpec):
        raise InvalidTypeError(f"cpu_spec must be a CPULoadStoreSpec, got {type(cpu_spec).__name__}")
    G = geom.num_groups
    sizes = np.asarray(gpu_spec.group_sizes, dtype=np.int64)
    indices = np.asarray(gpu_spec.block_indices, dtype=np.int64)
    if sizes.size != G:
        raise InvalidArgumentError(f"GPU spec: group_sizes has {sizes.size} entries, the KV cache has {G} groups")
    gpu_ids = np.asarray(gpu_spec.block_ids, dtype=np.int64)
    cpu_ids = np.asarray(cpu_spec.block_ids, dtype=np.int64)
    for what, arr in (
        ("GPU spec: block_ids", gpu_ids),
        ("GPU spec: group_sizes", sizes),
        ("GPU spec: block_indices", indices),
        ("CPU spec: block_ids", cpu_ids),
    ):
        if arr.size and int(arr.min()) < 0:
            i = int(np.argmax(arr < 0))
            raise InvalidArgumentError(f"{what}[{i}] must be non-negative, got {int(arr[i])}")
    f = geom.factors
    n_slots = slots_per_group(sizes, indices, f)
    if int(n_slots.sum()) != cpu_ids.size:
        raise InvalidArgumentError(
            f"CPU spec has {cpu_ids.size} slot ids, the GPU spec needs {int(n_slots.sum())} "
            f"(per group {n_slots.tolist()} for group_sizes={sizes.tolist()}, "
            f"block_indices={indices.tolist()}, block_size_factors={f.tolist()})"
        )
    if cpu_ids.size and int(cpu_ids.max()) >= geom.num_slots:
        bad = int(cpu_ids[np.argmax(cpu_ids >= geom.num_slots)])
        raise InvalidArgumentError(f"CPU spec: slot id {bad} out of range (num_cpu_blocks={geom.num_slots})")
    if store and cpu_ids.size > 1 and np.unique(cpu_ids).size != cpu_ids.size:
        raise InvalidArgumentError(f"CPU spec: a store names the same slot twice ({cpu_ids.tolist()})")

    n = gpu_ids.size
    grp = np.repeat(np.arange(G, dtype=np.int64), sizes)
    starts = np.cumsum(sizes) - sizes
    j = np.arange(n, dtype=np.int64) - starts[grp]
    q = (indices % f)[grp] + j
    fg = f[grp]
    cpu_starts = np.cumsum(n_slots) - n_slots
    slot = cpu_ids[cpu_starts[grp] + q // fg] if n else np.zeros(0, dtype=np.int64)
    rec = geom.record_bytes[grp]
    host_offsets = slot * geom.slot_bytes + (q % fg) * rec

    keep = rec > 0
    if not keep.all():
        grp, gpu_ids, host_offsets, rec = grp[keep], gpu_ids[keep], host_offsets[keep], rec[keep]
    if gpu_ids.size:
        limit = geom.num_gpu_blocks[grp]
        out = gpu_ids >= limit
        if out.any():
            i = int(np.argmax(out))
            raise InvalidArgumentError(
                f"GPU spec: block id {int(gpu_ids[i])} of group {int(grp[i])} out of range "
                f"(the group has {int(limit[i])} GPU blocks)"
            )
        if not store and gpu_ids.size > 1:
            combined = gpu_ids * max(G, 1) + grp
            if np.unique(combined).size != combined.size:
                raise InvalidArgumentError("GPU spec: a load writes the same GPU block of a group twice")
    return JobArrays(
        block_ids=np.ascontiguousarray(gpu_ids, dtype=np.int64),
        group_ids=grp.astype(np.int32),
        host_offsets=np.ascontiguousarray(host_offsets, dtype=np.int64),
        record_bytes=rec,
        transfer_size=int(rec.sum()),
    )
