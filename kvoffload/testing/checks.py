"""Byte-exact checks of a backend's ``pack``/``unpack`` against the expected bytes of a :class:`Case`.

Each check fills the destination with random sentinel bytes first and then verifies, byte by
byte, that exactly the mapped records/pages changed: every host record equals the expected
packed bytes (pack), every mapped page equals its host record bytes (unpack), the source is
unchanged, and every byte outside the written records/pages (gaps, padding, other blocks) kept
its sentinel value. Failures raise ``AssertionError`` with the first differing position. A
backend that binds its kernel (:meth:`KernelBackend.bind`) is checked through that entry as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kvoffload.kernels.backend import JOB_TABLE_COLUMNS
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import KernelBackend
from kvoffload.testing.cases import Case, expected_record, page_locations

__all__ = [
    "Job",
    "make_job",
    "make_host",
    "check_pack",
    "check_unpack",
    "bound_move",
    "assert_bytes_equal",
    "snapshot",
]


@dataclass
class Job:
    block_ids: np.ndarray  # int64
    group_ids: np.ndarray  # int32
    host_offsets: np.ndarray  # int64
    host_bytes: int  # size of the host buffer the job fits in


def make_job(
    case: Case, table: KVCacheTable, seed: int = 0, per_group: int = 3, base: int = 16, slot_pad: int = 16
) -> Job:
    """Random distinct blocks of every group (incl. entries of empty groups), random slots.

    Records sit at ``base + slot * slot_bytes`` with ``slot_bytes = max_record + slot_pad``
    (gaps between records catch overruns); the entry order is shuffled.
    """
    rng = np.random.default_rng(seed)
    bids: list[int] = []
    gids: list[int] = []
    for g in range(len(case.groups)):
        nb = case.num_blocks(g)
        if nb == 0:
            bids += rng.integers(0, 100, size=2).tolist()  # empty group: any id, nothing moves
            gids += [g, g]
            continue
        k = min(per_group, nb)
        bids += rng.choice(nb, size=k, replace=False).tolist()
        gids += [g] * k
    n = len(bids)
    order = rng.permutation(n)
    max_rec = max(table.record_bytes)
    slot_bytes = max_rec + slot_pad
    slots = rng.permutation(n + 2)[:n]
    offsets = base + slots * slot_bytes
    host_bytes = base + (n + 2) * slot_bytes + 8
    return Job(
        np.asarray(bids, dtype=np.int64)[order],
        np.asarray(gids, dtype=np.int32)[order],
        offsets.astype(np.int64),
        host_bytes,
    )


def make_host(nbytes: int, device: torch.device, seed: int = 1) -> torch.Tensor:
    """Sentinel-filled host buffer (pinned when the cache is on CUDA)."""
    gen = torch.Generator().manual_seed(seed)
    host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    if device.type == "cuda":
        host = host.pin_memory()
    return host


def snapshot(case: Case) -> list[torch.Tensor]:
    """CPU copies of every byte buffer behind the case's tensors."""
    return [b.detach().cpu().clone() for b in case.buffers]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Byte-wise equality of two flat uint8 tensors, reporting the first difference."""
    a, e = actual.cpu(), expected.cpu()
    if a.shape != e.shape:
        raise AssertionError(f"{what}: {a.numel()} bytes, expected {e.numel()}")
    diff = torch.nonzero(a != e)
    if diff.numel():
        i = int(diff[0, 0])
        raise AssertionError(
            f"{what}: {diff.shape[0]} bytes differ, first at byte {i}: got {int(a[i])}, expected {int(e[i])}"
        )


def bound_move(backend: KernelBackend, table: KVCacheTable, host: torch.Tensor, job: Job, to_host: bool) -> bool:
    """Move ``job`` through the backend's bound kernel (:meth:`KernelBackend.bind`) the way the
    transfer worker does: its moving rows in a job table (pinned on CUDA), one launch. False when
    the backend binds no kernel."""
    bits = int(np.bitwise_or.reduce(job.host_offsets)) | 16
    kernel = backend.bind(table, host, bits & -bits)
    if kernel is None:
        return False
    moving = np.array([table.groups[g].record_bytes > 0 for g in job.group_ids.tolist()], dtype=bool)
    n = int(moving.sum())
    rows = torch.empty((max(n, 1), JOB_TABLE_COLUMNS), dtype=torch.int64, pin_memory=table.device.type == "cuda")
    view = rows.numpy()
    view[:n, 0] = job.block_ids[moving]
    view[:n, 1] = job.group_ids[moving]
    view[:n, 2] = job.host_offsets[moving] // kernel.unit
    if n:
        kernel.launch(view, rows.data_ptr(), n, to_host)
    _sync(table.device)
    return True


def check_pack(backend: KernelBackend, case: Case, job: Job, seed: int = 1, bound: bool = False) -> None:
    """pack (``bound``: through the backend's bound kernel, skipped without one) then verify every
    host byte and that the cache did not change."""
    table = case.table()
    host = make_host(job.host_bytes, table.device, seed)
    expected = host.clone()
    for b, g, o in zip(job.block_ids.tolist(), job.group_ids.tolist(), job.host_offsets.tolist(), strict=True):
        rec = expected_record(case, g, b)
        expected[o : o + rec.numel()] = rec
    before = snapshot(case)
    if not bound:
        backend.pack(table, host, job.block_ids, job.group_ids, job.host_offsets)
    elif not bound_move(backend, table, host, job, to_host=True):
        pytest.skip(f"backend {backend.name!r} binds no kernel")
    _sync(table.device)
    assert_bytes_equal(host, expected, f"{case.name}: host after pack")
    for i, (buf, old) in enumerate(zip(case.buffers, before, strict=True)):
        assert_bytes_equal(buf, old, f"{case.name}: cache buffer {i} after pack (source must not change)")


def check_unpack(backend: KernelBackend, case: Case, job: Job, seed: int = 2, bound: bool = False) -> None:
    """unpack random host records (``bound``: as :func:`check_pack`) and verify every cache byte
    and that the host did not change."""
    table = case.table()
    host = make_host(job.host_bytes, table.device, seed)
    host_before = host.clone()
    expected = snapshot(case)
    for b, g, o in zip(job.block_ids.tolist(), job.group_ids.tolist(), job.host_offsets.tolist(), strict=True):
        pos = o
        for bi, start, nbytes in page_locations(case, g, b):
            expected[bi][start : start + nbytes] = host[pos : pos + nbytes]
            pos += nbytes
    if not bound:
        backend.unpack(table, host, job.block_ids, job.group_ids, job.host_offsets)
    elif not bound_move(backend, table, host, job, to_host=False):
        pytest.skip(f"backend {backend.name!r} binds no kernel")
    _sync(table.device)
    assert_bytes_equal(host, host_before, f"{case.name}: host after unpack (source must not change)")
    for i, (buf, exp) in enumerate(zip(case.buffers, expected, strict=True)):
        assert_bytes_equal(buf, exp, f"{case.name}: cache buffer {i} after unpack")


def check_roundtrip(backend: KernelBackend, src: Case, dst: Case, job: Job) -> None:
    """pack from ``src`` then unpack into ``dst`` (same structure): mapped pages equal the source's."""
    t_src, t_dst = src.table(), dst.table()
    host = make_host(job.host_bytes, t_src.device)
    backend.pack(t_src, host, job.block_ids, job.group_ids, job.host_offsets)
    expected = snapshot(dst)
    for b, g in zip(job.block_ids.tolist(), job.group_ids.tolist(), strict=True):
        rec = expected_record(src, g, b)
        pos = 0
        for bi, start, nbytes in page_locations(dst, g, b):
            expected[bi][start : start + nbytes] = rec[pos : pos + nbytes]
            pos += nbytes
    backend.unpack(t_dst, host, job.block_ids, job.group_ids, job.host_offsets)
    _sync(t_dst.device)
    for i, (buf, exp) in enumerate(zip(dst.buffers, expected, strict=True)):
        assert_bytes_equal(buf, exp, f"{dst.name}: cache buffer {i} after round trip")
