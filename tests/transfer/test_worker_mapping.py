"""JobMapper: the spec -> job table mapping, against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.transfer.job_mapping import GroupGeometry, JobArrays, JobMapper, slots_per_group


def map_job(gpu: GPULoadStoreSpec, cpu: CPULoadStoreSpec, geom: GroupGeometry, store: bool) -> JobArrays:
    return JobMapper(geom).arrays(gpu, cpu, store)


def _geom(record_bytes, num_blocks, factors, num_slots=50) -> GroupGeometry:
    rb = np.asarray(record_bytes, dtype=np.int64)
    f = np.asarray(factors, dtype=np.int64)
    return GroupGeometry(
        record_bytes=rb,
        num_gpu_blocks=np.asarray(num_blocks, dtype=np.int64),
        factors=f,
        slot_bytes=int((rb * f).max()),
        num_slots=num_slots,
    )


def _reference(gpu_ids, sizes, indices, cpu_ids, geom):
    """Walk the groups one block at a time, exactly as the docstring words it."""
    out = []
    gi = ci = 0
    for g, n in enumerate(sizes):
        f = int(geom.factors[g])
        skip = indices[g] % f
        used = 0 if n == 0 else -(-(skip + n) // f)
        slots = cpu_ids[ci : ci + used]
        for j in range(n):
            slot = slots[(skip + j) // f]
            pos = (skip + j) % f
            if geom.record_bytes[g] > 0:
                out.append((gpu_ids[gi + j], g, slot * geom.slot_bytes + pos * int(geom.record_bytes[g])))
        gi += n
        ci += used
    assert ci == len(cpu_ids)
    return out


def test_worked_example() -> None:
    # factor 3, group 0 starts at request block 4 (skip 1), 5 blocks -> slots [s0: pos1,2][s1: 0,1,2]
    geom = _geom([100, 40, 0], [20, 20, 0], [3, 1, 1])
    gpu = GPULoadStoreSpec([7, 2, 9, 11, 3, 5, 6], group_sizes=[5, 2, 0], block_indices=[4, 0, 0])
    cpu = CPULoadStoreSpec([10, 4, 8, 9])
    arr = map_job(gpu, cpu, geom, store=True)
    S = geom.slot_bytes
    assert S == 300
    assert arr.block_ids.tolist() == [7, 2, 9, 11, 3, 5, 6]
    assert arr.group_ids.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert arr.host_offsets.tolist() == [
        10 * S + 100,
        10 * S + 200,
        4 * S,
        4 * S + 100,
        4 * S + 200,
        8 * S,
        9 * S,
    ]
    assert arr.block_ids.dtype == np.int64 and arr.group_ids.dtype == np.int32
    assert arr.host_offsets.dtype == np.int64
    assert arr.transfer_size == 5 * 100 + 2 * 40


def test_random_against_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        G = int(rng.integers(1, 4))
        factors = rng.integers(1, 5, G)
        record = rng.integers(0, 3, G) * rng.integers(1, 64, G)
        nblocks = rng.integers(1, 40, G)
        geom = _geom(record, nblocks, factors, num_slots=200)
        sizes = [int(rng.integers(0, min(8, nb) + 1)) for nb in nblocks]
        indices = [int(rng.integers(0, 10)) for _ in range(G)]
        chosen = [rng.permutation(int(nb))[:s] for nb, s in zip(nblocks, sizes, strict=True)]
        gpu_ids = np.concatenate(chosen).astype(np.int64)
        need = int(slots_per_group(np.array(sizes), np.array(indices), factors).sum())
        cpu_ids = rng.permutation(200)[:need]
        store = bool(rng.integers(0, 2))
        arr = map_job(GPULoadStoreSpec(gpu_ids, sizes, indices), CPULoadStoreSpec(cpu_ids), geom, store=store)
        ref = _reference(gpu_ids.tolist(), sizes, indices, cpu_ids.tolist(), geom)
        got = list(zip(arr.block_ids.tolist(), arr.group_ids.tolist(), arr.host_offsets.tolist(), strict=True))
        assert got == ref
        assert arr.transfer_size == sum(int(geom.record_bytes[g]) for _, g, _ in ref)


def test_slots_per_group_zero_sized_group_uses_no_slot() -> None:
    assert slots_per_group(np.array([0, 1, 3, 4]), np.array([5, 5, 2, 0]), np.array([3, 3, 3, 3])).tolist() == [
        0,
        1,
        2,
        2,
    ]


def test_empty_job() -> None:
    geom = _geom([16], [4], [2])
    arr = map_job(GPULoadStoreSpec([], [0], [3]), CPULoadStoreSpec([]), geom, store=True)
    assert len(arr) == 0 and arr.transfer_size == 0


@pytest.mark.parametrize(
    "gpu, cpu, store, match",
    [
        (GPULoadStoreSpec([1, 2], [2], [0]), CPULoadStoreSpec([0, 1]), True, "slot ids"),  # 1 slot needed
        (GPULoadStoreSpec([1, 2, 3], [3], [2]), CPULoadStoreSpec([0]), True, "slot ids"),  # 2 needed
        (GPULoadStoreSpec([1, 2], [1, 1], [0, 0]), CPULoadStoreSpec([0]), True, "groups"),  # 2 groups vs 1
        (GPULoadStoreSpec([1, 2], [2], [0]), CPULoadStoreSpec([10]), True, "out of range"),  # slot
        (GPULoadStoreSpec([1, 8], [2], [0]), CPULoadStoreSpec([0]), True, "block id 8"),  # gpu block
        (GPULoadStoreSpec([1, 2, 3, 4], [4], [0]), CPULoadStoreSpec([3, 3]), True, "same slot"),
        (GPULoadStoreSpec([1, 1], [2], [0]), CPULoadStoreSpec([3]), False, "same GPU block"),
        # the worker's one check of the ids (the spec constructors only convert them)
        (GPULoadStoreSpec([1, -2], [2], [0]), CPULoadStoreSpec([0]), True, r"GPU spec: block_ids\[1\] must be non-neg"),
        (GPULoadStoreSpec([1, 2], [2], [-1]), CPULoadStoreSpec([0]), True, r"block_indices\[0\] must be non-neg"),
        (
            GPULoadStoreSpec([1, 2], [2], [0]),
            CPULoadStoreSpec([-3]),
            False,
            r"CPU spec: block_ids\[0\] must be non-neg",
        ),
    ],
)
def test_bad_specs(gpu: GPULoadStoreSpec, cpu: CPULoadStoreSpec, store: bool, match: str) -> None:
    geom = _geom([64], [8], [2], num_slots=10)
    with pytest.raises(InvalidArgumentError, match=match):
        map_job(gpu, cpu, geom, store=store)


def test_duplicates_allowed_where_harmless() -> None:
    geom = _geom([64], [8], [1], num_slots=10)
    # a store may read a GPU block twice; a load may read a slot twice
    map_job(GPULoadStoreSpec([1, 1], [2], [0]), CPULoadStoreSpec([3, 4]), geom, store=True)
    map_job(GPULoadStoreSpec([1, 2], [2], [0]), CPULoadStoreSpec([3, 3]), geom, store=False)


def test_empty_record_group_skips_range_check_but_consumes_slots() -> None:
    geom = _geom([64, 0], [8, 0], [1, 2], num_slots=10)
    arr = map_job(GPULoadStoreSpec([1, 500, 501], [1, 2], [0, 0]), CPULoadStoreSpec([3, 4]), geom, store=True)
    assert arr.block_ids.tolist() == [1] and arr.host_offsets.tolist() == [3 * geom.slot_bytes]


def test_wrong_spec_types() -> None:
    geom = _geom([64], [8], [1])
    with pytest.raises(InvalidTypeError, match="gpu_spec"):
        map_job(CPULoadStoreSpec([1]), CPULoadStoreSpec([1]), geom, store=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="cpu_spec"):
        map_job(GPULoadStoreSpec([1]), GPULoadStoreSpec([1]), geom, store=True)  # type: ignore[arg-type]
