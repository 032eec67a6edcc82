"""TransferWorker: byte-exact store/load round trips, reporting, failures and bad input.

Every KV-cache tensor is a strided view over a random uint8 *base* buffer we own, so "every
other byte unchanged" is checked over whole bases (padding between blocks included): the
expected base is built by an independent page-by-page reference and compared in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import KernelBackend
from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.transfer.worker import LOAD, STORE, TransferResult, TransferWorker

# ----------------------------------------------------------------------------- cache builder


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements (padding allowed between blocks)
    offset: int  # storage offset in elements


@dataclass(frozen=True)
class GroupSpec:
    layout: str
    tensors: tuple[TensorSpec, ...]
    layers: tuple[int, ...]  # layer -> tensor index (repeats = aliased layers)


def _contig(dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> TensorSpec:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return TensorSpec(dtype, shape, tuple(strides), offset)


def _fp8() -> torch.dtype:
    return getattr(torch, "float8_e4m3fn", torch.uint8)


def groups_three(nb: tuple[int, int, int], third: str) -> list[GroupSpec]:
    """g0 flash-attn fp16 (two tensors, one aliased layer), g1 MLA bf16 with padded block stride
    plus an fp8 MLA layer, g2 either empty (no tensors) or flashinfer fp32."""
    g0 = GroupSpec(
        "flash_attn",
        (_contig(torch.float16, (2, nb[0], 2, 2, 4)), _contig(torch.float16, (2, nb[0], 2, 2, 4), offset=8)),
        (0, 1, 0),
    )
    pad = 3 * 8 + 5  # 5 elements of padding after every block
    g1 = GroupSpec(
        "mla",
        (TensorSpec(torch.bfloat16, (nb[1], 3, 8), (pad, 8, 1), 4), _contig(_fp8(), (nb[1], 3, 8), offset=16)),
        (0, 1),
    )
    if third == "empty":
        g2 = GroupSpec("mla", (), ())
    else:
        g2 = GroupSpec("flashinfer", (_contig(torch.float32, (nb[2], 2, 1, 1, 4)),), (0,))
    return [g0, g1, g2]


def _nbytes(ts: TensorSpec) -> int:
    esize = torch.empty(0, dtype=ts.dtype).element_size()
    extent = ts.offset + 1 + sum((s - 1) * st for s, st in zip(ts.shape, ts.strides, strict=True))
    return (extent + 7) * esize  # a few trailing bytes past the end


class Cache:
    """KV-cache tensors over random bases; ``tensor(g, t, base)`` rebuilds a view over any base."""

    def __init__(self, specs: list[GroupSpec], seed: int, device: str = "cpu") -> None:
        self.specs = specs
        gen = torch.Generator().manual_seed(seed)
        self.bases = [
            [torch.randint(0, 256, (_nbytes(ts),), dtype=torch.uint8, generator=gen).to(device) for ts in g.tensors]
            for g in specs
        ]
        self.tensors = [[self.view(g, t, self.bases[g][t]) for t in range(len(s.tensors))] for g, s in enumerate(specs)]

    def view(self, g: int, t: int, base: torch.Tensor) -> torch.Tensor:
        ts = self.specs[g].tensors[t]
        return base.view(ts.dtype).as_strided(ts.shape, ts.strides, ts.offset)

    def table(self) -> KVCacheTable:
        groups = [[self.tensors[g][t] for t in s.layers] for g, s in enumerate(self.specs)]
        return KVCacheTable.from_tensors(groups, [s.layout for s in self.specs])

    def pages(self, g: int, block: int, bases: list[list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
        """Independent reference of one record: the uint8 pages of ``block``, record order
        (first occurrence of each tensor, K then V for flash-attn)."""
        spec = self.specs[g]
        out = []
        seen: list[int] = []
        for t in spec.layers:
            if t in seen:
                continue
            seen.append(t)
            x = self.view(g, t, (bases or self.bases)[g][t])
            if spec.layout == "flash_attn":
                out += [x[0, block], x[1, block]]
            else:
                out.append(x[block])
        return out

    def record_bytes(self, g: int) -> int:
        return sum(p.numel() * p.element_size() for p in self.pages(g, 0)) if self.specs[g].tensors else 0

    def clone_bases(self) -> list[list[torch.Tensor]]:
        return [[b.clone() for b in bs] for bs in self.bases]


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8).flatten().cpu()


# ----------------------------------------------------------------------------- job builder


def make_job(
    rng: np.random.Generator, cache: Cache, sizes: list[int], indices: list[int], factors: list[int], num_slots: int
) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec, list[list[int]]]:
    ids, per_group = [], []
    for g, n in enumerate(sizes):
        nblocks = (
            cache.specs[g].tensors[0].shape[1 if cache.specs[g].layout == "flash_attn" else 0]
            if cache.specs[g].tensors
            else 50
        )
        chosen = rng.permutation(nblocks)[:n].tolist()
        per_group.append(chosen)
        ids += chosen
    need = sum(0 if n == 0 else math.ceil((i % f + n) / f) for n, i, f in zip(sizes, indices, factors, strict=True))
    slots = rng.permutation(num_slots)[:need]
    return GPULoadStoreSpec(ids, sizes, indices), CPULoadStoreSpec(slots), per_group


def reference_offsets(
    per_group: list[list[int]],
    indices: list[int],
    factors: list[int],
    slots: list[int],
    slot_bytes: int,
    record_bytes: list[int],
) -> list[tuple[int, int, int]]:
    """(group, block, host offset) of every mapped block, from the documented formula (blocks of
    groups without pages move nothing and are left out)."""
    out, c = [], 0
    for g, blocks in enumerate(per_group):
        f, skip = factors[g], indices[g] % factors[g]
        used = 0 if not blocks else math.ceil((skip + len(blocks)) / f)
        for j, b in enumerate(blocks):
            slot = slots[c + (skip + j) // f]
            if record_bytes[g]:
                out.append((g, b, slot * slot_bytes + ((skip + j) % f) * record_bytes[g]))
        c += used
    return out


BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.interpreter)]


def _backend_or_skip(name: str, device: str) -> str:
    from kvoffload.kernels.registry import available_backends

    if name not in available_backends(device):
        pytest.skip(f"backend {name} not available on {device}")
    return name


def run_round_trip(
    backend: str,
    factors: list[int],
    third: str,
    sizes: list[int],
    indices: list[int],
    seed: int,
    device: str = "cpu",
    num_slots: int = 12,
    path: str = "auto",
    staging_bytes: int | None = None,
) -> None:
    rng = np.random.default_rng(seed)
    nb = (9, 7, 5)
    src = Cache(groups_three(nb, third), seed, device)
    dst = Cache(groups_three(nb, third), seed + 1000, device)
    kw = {"backend": backend, "path": path, "staging_bytes": staging_bytes}
    worker_a = TransferWorker(src.table(), num_slots, factors, **kw)  # type: ignore[arg-type]
    worker_b = TransferWorker(dst.table(), num_slots, factors, **kw)  # type: ignore[arg-type]
    rb = [src.record_bytes(g) for g in range(3)]
    slot_bytes = max(f * r for f, r in zip(factors, rb, strict=True))
    assert worker_a.host_pool.slot_bytes == slot_bytes and worker_a.host_pool.nbytes == num_slots * slot_bytes
    assert tuple(rb) == src.table().record_bytes

    pool = worker_a.host_pool.buffer
    pool.copy_(torch.randint(0, 256, (pool.numel(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    pool_before = pool.clone()
    src_before = src.clone_bases()

    gpu, cpu, per_group = make_job(rng, src, sizes, indices, factors, num_slots)
    mapped = reference_offsets(per_group, indices, factors, cpu.block_ids.tolist(), slot_bytes, rb)
    page_bytes = sum(rb[g] for g, _, _ in mapped)

    # ---- store A -> pool
    assert worker_a.transfer_async(7, (gpu, cpu)) is True
    worker_a.wait([7])
    res = worker_a.get_finished()
    assert [(r.job_id, r.success, r.transfer_size, r.transfer_type) for r in res] == [(7, True, page_bytes, STORE)]
    assert res[0].transfer_time >= 0.0
    assert worker_a.get_finished() == []
    expected_pool = pool_before.clone()
    for g, b, off in mapped:
        rec = torch.cat([as_bytes(p) for p in src.pages(g, b)])
        expected_pool[off : off + rb[g]] = rec
    assert torch.equal(pool, expected_pool)
    for g in range(3):
        for t, base in enumerate(src.bases[g]):
            assert torch.equal(base.cpu(), src_before[g][t].cpu()), "store modified its source"

    # ---- load pool -> B, into other (random, distinct) GPU blocks of the same group sizes
    worker_b.host_pool.buffer.copy_(pool)
    dst_ids, dst_per_group = [], []
    for g, blocks in enumerate(per_group):
        nblocks = nb[g] if dst.specs[g].tensors else 50
        chosen = rng.permutation(nblocks)[: len(blocks)].tolist()
        dst_per_group.append(chosen)
        dst_ids += chosen
    load_gpu = GPULoadStoreSpec(dst_ids, sizes, indices)
    dst_before = dst.clone_bases()
    expected_dst = dst.clone_bases()
    for g in range(3):
        if not dst.specs[g].tensors:
            continue
        for sb, db in zip(per_group[g], dst_per_group[g], strict=True):
            for want, page in zip(src.pages(g, sb), dst.pages(g, db, expected_dst), strict=True):
                page.copy_(want)
    pool_b_before = worker_b.host_pool.buffer.clone()
    assert worker_b.transfer_async(8, (cpu, load_gpu)) is True
    worker_b.wait([8])
    res = worker_b.get_finished()
    assert [(r.job_id, r.success, r.transfer_size, r.transfer_type) for r in res] == [(8, True, page_bytes, LOAD)]
    for g in range(3):
        for t, base in enumerate(dst.bases[g]):
            assert torch.equal(base.cpu(), expected_dst[g][t].cpu()), f"group {g} tensor {t} differs after load"
    assert torch.equal(worker_b.host_pool.buffer, pool_b_before), "load modified the host pool"
    changed = [not torch.equal(a, b) for a, b in zip(sum(dst.bases, []), sum(dst_before, []), strict=True)]
    assert any(changed) or page_bytes == 0
    worker_a.shutdown()
    worker_b.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "factors, third, sizes, indices",
    [
        ([1, 1, 1], "empty", [4, 3, 2], [0, 0, 0]),
        ([3, 3, 3], "empty", [5, 4, 3], [4, 2, 0]),  # unaligned first blocks; empty table group
        ([3, 1, 2], "flashinfer", [7, 3, 0], [1, 5, 3]),  # mixed factors, one group empty in the spec
        ([2, 3, 1], "flashinfer", [0, 4, 5], [0, 8, 2]),
    ],
)
def test_round_trip(backend: str, factors: list[int], third: str, sizes: list[int], indices: list[int]) -> None:
    run_round_trip(_backend_or_skip(backend, "cpu"), factors, third, sizes, indices, seed=sum(sizes) + len(backend))


def test_round_trip_random_torch() -> None:
    rng = np.random.default_rng(1)
    for seed in range(6):
        factors = rng.integers(1, 4, 3).tolist()
        sizes = [int(rng.integers(0, 6)) for _ in range(2)] + [int(rng.integers(0, 5))]
        indices = rng.integers(0, 9, 3).tolist()
        run_round_trip("torch", factors, ["empty", "flashinfer"][seed % 2], sizes, indices, seed, num_slots=20)


# ----------------------------------------------------------------------------- reporting


def _worker(
    backend: str | KernelBackend = "torch", factors: list[int] | int = 1, num_slots: int = 6, third: str = "flashinfer"
) -> tuple[TransferWorker, Cache]:
    cache = Cache(groups_three((9, 7, 5), third), 3)
    return TransferWorker(cache.table(), num_slots, factors, backend=backend), cache


def _simple_store(
    worker: TransferWorker, slots: tuple[int, ...] = (0, 1, 2)
) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec]:
    return GPULoadStoreSpec([3, 1, 4], [1, 1, 1]), CPULoadStoreSpec(list(slots))


def test_results_reported_once_in_order_and_ids_reusable() -> None:
    w, _ = _worker()
    gpu, cpu = _simple_store(w)
    for jid in (5, 2, 9):
        assert w.transfer_async(jid, (gpu, cpu))
    assert w.num_in_flight == 3
    with pytest.raises(InvalidArgumentError, match="job_id 2"):
        w.transfer_async(2, (gpu, cpu))
    res = w.get_finished()
    assert [r.job_id for r in res] == [5, 2, 9] and all(isinstance(r, TransferResult) for r in res)
    assert w.get_finished() == [] and w.num_in_flight == 0
    assert w.transfer_async(2, (cpu, gpu))  # reported ids may be reused
    assert [(r.job_id, r.transfer_type) for r in w.get_finished()] == [(2, LOAD)]


def test_empty_job_succeeds_without_launch() -> None:
    class Boom(TorchBackend):
        def _copy(self, job, to_host):  # type: ignore[no-untyped-def]
            raise AssertionError("no launch expected")

    w, _ = _worker(backend=Boom())
    assert w.transfer_async(1, (GPULoadStoreSpec([], [0, 0, 0], [2, 0, 1]), CPULoadStoreSpec([])))
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(1, True, 0)]


def test_wait_unknown_and_finished_ids_is_noop() -> None:
    w, _ = _worker()
    w.wait([])
    w.wait([123, 456])
    w.wait({1, 2})
    gpu, cpu = _simple_store(w)
    w.transfer_async(1, (gpu, cpu))
    w.wait([1, 99])
    assert [r.job_id for r in w.get_finished()] == [1]  # wait does not consume results
    w.wait([1])


@pytest.mark.parametrize("bad", ["12", b"12", 5, None, [1, True], [1.0]])
def test_wait_bad_ids(bad: object) -> None:
    w, _ = _worker()
    with pytest.raises(InvalidTypeError):
        w.wait(bad)  # type: ignore[arg-type]


class RaisingBackend(TorchBackend):
    """Raises inside the launch (after validation), like a kernel failing."""

    name = "raising"

    def _copy(self, job, to_host):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulated launch failure")


def test_backend_exception_is_reported_as_failure() -> None:
    w, cache = _worker(backend=RaisingBackend())
    gpu, cpu = _simple_store(w)
    assert w.transfer_async(3, (gpu, cpu)) is True
    assert w.transfer_async(4, (cpu, gpu)) is True
    res = w.get_finished()
    assert [(r.job_id, r.success, r.transfer_size, r.transfer_time, r.transfer_type) for r in res] == [
        (3, False, 0, 0.0, STORE),
        (4, False, 0, 0.0, LOAD),
    ]
    assert w.get_finished() == []


def test_shutdown_then_submit_returns_false_and_results_survive() -> None:
    w, _ = _worker()
    gpu, cpu = _simple_store(w)
    w.transfer_async(1, (gpu, cpu))
    w.shutdown()
    w.shutdown()
    assert w.host_pool.is_shutdown
    assert w.transfer_async(2, (gpu, cpu)) is False
    assert [r.job_id for r in w.get_finished()] == [1]
