"""Turn a (GPU spec, CPU spec) pair into the job table one kernel launch consumes.

Pure numpy, no torch: the transfer worker's :class:`JobMapper` checks each job once and maps it to
the rows ``(GPU block id, group id, host offset in units)`` of the kernels' job table (see
:data:`~kvoffload.kernels.backend.JOB_TABLE_COLUMNS`), which it writes into the table a launch
reads.

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
from typing import NamedTuple

import numpy as np

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["JobArrays", "GroupGeometry", "JobMapper", "MappedJob", "slots_per_group"]


class MappedJob(NamedTuple):
    """A checked job as :meth:`JobMapper.map` returns it: one entry per row of its job table
    (blocks of groups without pages left out), arrays ``int64``.

    Attributes:
        ids: GPU block ids.
        groups: group ids, None when all are group 0.
        slots: the host slot of each row; ``offsets``: each row's host offset in units, None when
            it is ``slots * (slot bytes / unit)`` (one group, one GPU block per slot).
        dst: what the job writes: its slots (a store) or its GPU blocks, offset per group (a load).
        nbytes: bytes moved.
    """

    ids: np.ndarray
    groups: np.ndarray | None
    slots: np.ndarray
    offsets: np.ndarray | None
    dst: np.ndarray
    nbytes: int


_U64 = np.dtype(np.uint64)


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
    """Per-block arrays of one job, in GPU-spec order, empty groups left out (what the kernel
    backends' :meth:`~kvoffload.kernels.backend.KernelBackend.pack` takes).

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


def _check_types(gpu_spec: object, cpu_spec: object) -> None:
    if not isinstance(gpu_spec, GPULoadStoreSpec):
        raise InvalidTypeError(f"gpu_spec must be a GPULoadStoreSpec, got {type(gpu_spec).__name__}")
    if not isinstance(cpu_spec, CPULoadStoreSpec):
        raise InvalidTypeError(f"cpu_spec must be a CPULoadStoreSpec, got {type(cpu_spec).__name__}")


class JobMapper:
    """Checks jobs and writes their job tables, for one worker's groups and host pool.

    Args:
        geometry: the groups' and pool's geometry.
        unit: host offsets are written in units of this many bytes (must divide the slot size
            and every group's record size).

    Everything fixed for the worker's lifetime (offsets in units, per-group limits, the marks
    used to find duplicate destinations) is resolved here; a job costs a few numpy calls.
    """

    def __init__(self, geometry: GroupGeometry, unit: int = 1) -> None:
        g = geometry
        if g.slot_bytes % unit or np.any(g.record_bytes % unit):
            raise InvalidArgumentError(f"unit {unit} must divide the slot size and every record size")
        self.geometry = g
        self.unit = unit
        self._groups = g.num_groups
        self._slot_units = g.slot_bytes // unit
        self._rec_units = g.record_bytes // unit
        # one group with pages: the common case, mapped without the per-group arrays
        self._single = self._groups == 1 and int(g.record_bytes[0]) > 0
        self._num_slots = g.num_slots
        self._f0 = int(g.factors[0])
        self._rec0 = int(g.record_bytes[0])
        self._rec0_units = int(self._rec_units[0])
        self._blocks0 = int(g.num_gpu_blocks[0])
        # duplicate destinations: write i at each destination, read back; a mismatch is a repeat
        self._slot_marks = np.zeros(g.num_slots, dtype=np.int64)
        self._block_base = np.cumsum(g.num_gpu_blocks) - g.num_gpu_blocks
        self._block_marks = np.zeros(int(g.num_gpu_blocks.sum()), dtype=np.int64)
        # positions for the repeat check: a job naming more entries than exist repeats one
        self._seq = np.arange(max(g.num_slots, self._block_marks.size), dtype=np.int64)

    def _arange(self, stop: int) -> np.ndarray:
        if stop > self._seq.size:
            self._seq = np.arange(max(stop, 2 * self._seq.size), dtype=np.int64)
        return self._seq[:stop]

    def map(self, gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> MappedJob:
        """Check a job (specs of these classes: the caller checked) and map it to its rows (see
        :data:`MappedJob`).

        ``store``: GPU -> CPU (destinations = host slots, must be distinct), else CPU -> GPU
        (destinations = GPU blocks, distinct per group).

        Raises:
            InvalidArgumentError: group count, slot count, slot or block id out of range,
                duplicate destinations.
        """
        if not self._single:
            return self._map_groups(gpu_spec, cpu_spec, store)
        ids, slots = gpu_spec.block_ids, cpu_spec.block_ids
        n = ids.size
        if gpu_spec.group_sizes.size != 1 or (index := int(gpu_spec.block_indices[0])) < 0:
            self._reject(gpu_spec, cpu_spec, store)
        f = self._f0
        skip = index % f
        if slots.size != ((skip + n + f - 1) // f if n else 0):
            self._reject(gpu_spec, cpu_spec, store)
        if n == 0:
            return MappedJob(ids, None, slots, None, slots, 0)
        # negative ids are huge as uint64, so the largest checks both ends of a range (argmax and
        # one item: a third of a ufunc reduction's cost on a job's small arrays)
        us, ui = slots.view(_U64), ids.view(_U64)
        if us[us.argmax()] >= self._num_slots or ui[ui.argmax()] >= self._blocks0:
            self._reject(gpu_spec, cpu_spec, store)
        dst = slots if store else ids
        m = dst.size
        if m > 1:  # a repeat: write each position at its entry, read back, a mismatch
            if m > self._seq.size:  # more entries than there are ids
                self._reject(gpu_spec, cpu_spec, store)
            seq = self._seq[:m]
            marks = self._slot_marks if store else self._block_marks
            marks[dst] = seq
            ne = marks[dst] != seq
            if ne[ne.argmax()]:
                self._reject(gpu_spec, cpu_spec, store)
        if f == 1:
            return MappedJob(ids, None, slots, None, dst, n * self._rec0)
        q = self._arange(skip + n)[skip:]
        row_slots = slots[q // f]
        offsets = row_slots * self._slot_units + (q % f) * self._rec0_units
        return MappedJob(ids, None, row_slots, offsets, dst, n * self._rec0)

    def conflict(self, dsts: list[np.ndarray], store: bool) -> int | None:
        """The first job of ``dsts`` (destinations of jobs of one direction, as :meth:`map` returns
        them) that names a destination an earlier one names, or None: such jobs cannot share a
        launch (the order of their writes would be undefined)."""
        if len(dsts) < 2:
            return None
        marks = self._slot_marks if store else self._block_marks
        d = np.concatenate(dsts)
        seq = self._arange(d.size)
        marks[d] = seq
        ne = marks[d] != seq
        if not ne[ne.argmax()]:
            return None
        # a job names each destination once (checked by map): any later naming is another job's
        _, first = np.unique(d, return_index=True)
        later = np.ones(d.size, dtype=bool)
        later[first] = False
        ends = np.cumsum([x.size for x in dsts])
        return int(np.searchsorted(ends, int(np.argmax(later)), side="right"))

    def _map_groups(self, gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> MappedJob:
        """Several groups, or a group without pages: checked in the explaining order, then mapped."""
        self._explain(gpu_spec, cpu_spec, store)
        g = self.geometry
        sizes, indices = gpu_spec.group_sizes, gpu_spec.block_indices
        gpu_ids, cpu_ids = gpu_spec.block_ids, cpu_spec.block_ids
        n = gpu_ids.size
        f = g.factors
        n_slots = slots_per_group(sizes, indices, f)
        grp = np.repeat(np.arange(self._groups, dtype=np.int64), sizes)
        j = self._arange(n) - (np.cumsum(sizes) - sizes)[grp]
        q = (indices % f)[grp] + j
        fg = f[grp]
        slot = cpu_ids[(np.cumsum(n_slots) - n_slots)[grp] + q // fg] if n else cpu_ids[:0]
        rec = self._rec_units[grp]
        keep = rec > 0
        ids, grp = gpu_ids[keep], grp[keep]
        offsets = (slot * self._slot_units + (q % fg) * rec)[keep]
        dst = cpu_ids if store else self._block_base[grp] + ids
        return MappedJob(ids, grp, slot[keep], offsets, dst, int(g.record_bytes[grp].sum()))

    def write(self, rows: np.ndarray, jobs: list[MappedJob]) -> None:
        """The rows of ``jobs``, one job after another, into ``rows`` (``int64[total rows, 3]``)."""
        if len(jobs) == 1:
            ids, groups, slots, offsets, _, _ = jobs[0]
            rows[:, 0] = ids
            rows[:, 1] = 0 if groups is None else groups
            if offsets is None:
                np.multiply(slots, self._slot_units, out=rows[:, 2])
            else:
                rows[:, 2] = offsets
            return
        np.concatenate([j.ids for j in jobs], out=rows[:, 0])
        if all(j.groups is None for j in jobs):
            rows[:, 1] = 0
        else:
            np.concatenate(
                [np.zeros(j.ids.size, np.int64) if j.groups is None else j.groups for j in jobs], out=rows[:, 1]
            )
        if all(j.offsets is None for j in jobs):
            column = rows[:, 2]
            np.concatenate([j.slots for j in jobs], out=column)
            np.multiply(column, self._slot_units, out=column)
        else:
            parts = [j.slots * self._slot_units if j.offsets is None else j.offsets for j in jobs]
            np.concatenate(parts, out=rows[:, 2])

    def arrays(self, gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> JobArrays:
        """:meth:`map` as the per-block arrays :class:`JobArrays` (the spec classes checked too)."""
        _check_types(gpu_spec, cpu_spec)
        return self.to_arrays(self.map(gpu_spec, cpu_spec, store))

    def to_arrays(self, job: MappedJob) -> JobArrays:
        """A mapped job as :class:`JobArrays` (host offsets in bytes): what a backend without a
        bound kernel takes."""
        ids, groups, slots, offsets, _, nbytes = job
        groups32 = np.zeros(ids.size, dtype=np.int32) if groups is None else groups.astype(np.int32)
        units = slots * self._slot_units if offsets is None else offsets
        return JobArrays(
            block_ids=np.ascontiguousarray(ids, dtype=np.int64),
            group_ids=groups32,
            host_offsets=units * self.unit,
            record_bytes=self.geometry.record_bytes[groups32],
            transfer_size=nbytes,
        )

    def _reject(self, gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> None:
        """Raise the error that :meth:`_explain` finds for a job the fast checks refused."""
        self._explain(gpu_spec, cpu_spec, store)
        raise InvalidArgumentError("job refused by the worker's checks")  # a fast check without its explanation

    def _explain(self, gpu_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> None:
        """Every check in order, raising the first that fails (the fast path's checks only tell
        *that* a job is bad)."""
        g = self.geometry
        G = self._groups
        sizes, indices = gpu_spec.group_sizes, gpu_spec.block_indices
        if sizes.size != G:
            raise InvalidArgumentError(f"GPU spec: group_sizes has {sizes.size} entries, the KV cache has {G} groups")
        gpu_ids, cpu_ids = gpu_spec.block_ids, cpu_spec.block_ids
        for what, arr in (
            ("GPU spec: block_ids", gpu_ids),
            ("GPU spec: group_sizes", sizes),
            ("GPU spec: block_indices", indices),
            ("CPU spec: block_ids", cpu_ids),
        ):
            if arr.size and int(arr.min()) < 0:
                i = int(np.argmax(arr < 0))
                raise InvalidArgumentError(f"{what}[{i}] must be non-negative, got {int(arr[i])}")
        f = g.factors
        n_slots = slots_per_group(sizes, indices, f)
        if int(n_slots.sum()) != cpu_ids.size:
            raise InvalidArgumentError(
                f"CPU spec has {cpu_ids.size} slot ids, the GPU spec needs {int(n_slots.sum())} "
                f"(per group {n_slots.tolist()} for group_sizes={sizes.tolist()}, "
                f"block_indices={indices.tolist()}, block_size_factors={f.tolist()})"
            )
        if cpu_ids.size and int(cpu_ids.max()) >= g.num_slots:
            bad = int(cpu_ids[np.argmax(cpu_ids >= g.num_slots)])
            raise InvalidArgumentError(f"CPU spec: slot id {bad} out of range (num_cpu_blocks={g.num_slots})")
        if store and cpu_ids.size > 1 and np.unique(cpu_ids).size != cpu_ids.size:
            raise InvalidArgumentError(f"CPU spec: a store names the same slot twice ({cpu_ids.tolist()})")
        grp = np.repeat(np.arange(G, dtype=np.int64), sizes)
        keep = g.record_bytes[grp] > 0
        grp, ids = grp[keep], gpu_ids[keep]
        if ids.size:
            limit = g.num_gpu_blocks[grp]
            over = ids >= limit
            if over.any():
                i = int(np.argmax(over))
                raise InvalidArgumentError(
                    f"GPU spec: block id {int(ids[i])} of group {int(grp[i])} out of range "
                    f"(the group has {int(limit[i])} GPU blocks)"
                )
            if not store and ids.size > 1:
                combined = self._block_base[grp] + ids
                if np.unique(combined).size != combined.size:
                    raise InvalidArgumentError("GPU spec: a load writes the same GPU block of a group twice")
