"""The Triton backend, byte-exact: interpreted on CPU tensors (CI), compiled on CUDA (``gpu`` marker).

Every layout x dtype, random distinct blocks, groups of which one is empty, aliased tensors;
compared against the expected bytes and against the torch reference backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels import triton_backend
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.page_loop_backend import PageLoopBackend
from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.kernels.triton_backend import TritonBackend, job_alignment
from kvoffload.testing.cases import DTYPES, build_case, case_names
from kvoffload.testing.checks import (
    assert_bytes_equal,
    check_pack,
    check_roundtrip,
    check_unpack,
    make_host,
    make_job,
    snapshot,
)

KINDS = case_names()


def _compare_with_torch(kind: str, dtype: str, device: str, seed: int) -> None:
    """Same job through triton and torch: identical host bytes after pack, identical caches after unpack."""
    case_a = build_case(kind, dtype, device, seed=seed)
    case_b = build_case(kind, dtype, device, seed=seed)
    ta, tb = case_a.table(), case_b.table()
    job = make_job(case_a, ta, seed=seed)
    host_a = make_host(job.host_bytes, ta.device, seed=seed)
    host_b = host_a.clone().pin_memory() if ta.device.type == "cuda" else host_a.clone()
    TritonBackend().pack(ta, host_a, job.block_ids, job.group_ids, job.host_offsets)
    TorchBackend().pack(tb, host_b, job.block_ids, job.group_ids, job.host_offsets)
    if ta.device.type == "cuda":
        torch.cuda.synchronize()
    assert_bytes_equal(host_a, host_b, f"{kind}-{dtype}: triton vs torch pack")
    src = make_host(job.host_bytes, ta.device, seed=seed + 1)
    TritonBackend().unpack(ta, src, job.block_ids, job.group_ids, job.host_offsets)
    TorchBackend().unpack(tb, src, job.block_ids, job.group_ids, job.host_offsets)
    if ta.device.type == "cuda":
        torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(snapshot(case_a), snapshot(case_b), strict=True)):
        assert_bytes_equal(a, b, f"{kind}-{dtype}: triton vs torch unpack, buffer {i}")


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_interpreted_byte_exact(kind: str, dtype: str) -> None:
    be = TritonBackend()
    case = build_case(kind, dtype, seed=31)
    job = make_job(case, case.table(), seed=7)
    check_pack(be, case, job)
    check_unpack(be, case, job)
    check_roundtrip(be, case, build_case(kind, dtype, seed=32), job)


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_interpreted_matches_torch_reference(kind: str) -> None:
    _compare_with_torch(kind, "fp8", "cpu", seed=41)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("kind", "dtype", "base", "pad", "expected"),
    [
        ("flashinfer", "fp32", 0, 16, 16),
        ("flashinfer", "fp32", 8, 8, 8),
        ("flashinfer", "fp16", 4, 4, 4),
        ("mla", "fp16", 16, 16, 2),
        ("mla", "fp8", 16, 16, 1),
        ("flashinfer", "fp32", 3, 16, 1),
    ],
)
def test_word_width_follows_alignment(kind: str, dtype: str, base: int, pad: int, expected: int) -> None:
    case = build_case(kind, dtype, seed=33)
    table = case.table()
    job = make_job(case, table, seed=8, base=base, slot_pad=pad)
    host = make_host(job.host_bytes, table.device)
    assert host.data_ptr() % 16 == 0
    assert job_alignment(table, host, job.host_offsets) == expected
    check_pack(TritonBackend(), case, job)
    check_unpack(TritonBackend(), case, job)


@pytest.mark.interpreter
@pytest.mark.parametrize(("programs", "block_bytes"), [(1, 16), (3, 32), (16, 65536)])
def test_program_cap_and_chunking(programs: int, block_bytes: int) -> None:
    """Few programs looping over many pages, pages split into many small chunks: still exact."""
    be = TritonBackend(num_programs=programs, block_bytes=block_bytes)
    case = build_case("mixed", "bf16", seed=34, num_blocks=8)
    job = make_job(case, case.table(), seed=9, per_group=8)
    check_pack(be, case, job)
    check_unpack(be, case, job)


class _Spy:
    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        self.grids.append(grid)
        return self.kernel[grid]  # type: ignore[index]


@pytest.mark.interpreter
def test_one_launch_per_job_with_capped_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, interpreted = triton_backend.kernels()
    spy = _Spy(interpreted)
    monkeypatch.setattr(triton_backend, "kernels", lambda: (compiled, spy))
    case = build_case("flash_attn", "fp16", seed=35)
    job = make_job(case, case.table(), seed=10, per_group=6)
    be = TritonBackend(num_programs=5, block_bytes=16)  # one page per tile: more tiles than programs
    check_pack(be, case, job)
    check_unpack(be, case, job)
    assert spy.grids == [(5,), (5,)]
    assert TritonBackend().config(torch.device("cpu")).num_programs <= 16


def test_bad_launch_overrides() -> None:
    with pytest.raises(InvalidArgumentError):
        TritonBackend(block_bytes=100)
    with pytest.raises(InvalidArgumentError):
        TritonBackend(num_programs=0)
    with pytest.raises(InvalidTypeError):
        TritonBackend(num_warps=True)  # type: ignore[arg-type]


def test_page_loop_backend_is_cuda_only() -> None:
    assert not PageLoopBackend.is_available(torch.device("cpu"))


# ----------------------------------------------------------------------------- compiled, on CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend_cls", [TritonBackend, TorchBackend, PageLoopBackend])
def test_cuda_byte_exact(backend_cls: type, kind: str, dtype: str) -> None:
    be = backend_cls()
    case = build_case(kind, dtype, "cuda", seed=51)
    job = make_job(case, case.table(), seed=11)
    check_pack(be, case, job)
    check_unpack(be, case, job)
    check_roundtrip(be, case, build_case(kind, dtype, "cuda", seed=52), job)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_triton_matches_torch_reference(kind: str) -> None:
    _compare_with_torch(kind, "bf16", "cuda", seed=53)


@pytest.mark.gpu
def test_cuda_pack_runs_on_current_stream() -> None:
    """Enqueued on the caller's stream: ordered after work already queued there."""
    case = build_case("flash_attn", "fp16", "cuda", seed=54, num_blocks=64)
    table = case.table()
    job = make_job(case, table, seed=12, per_group=8)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # keep the stream busy so a wrong stream would race
        for buf in case.buffers:
            buf.add_(1)  # queued before pack on the same stream
        host = make_host(job.host_bytes, table.device)
        expected_src = [b.clone() for b in case.buffers]
        TritonBackend().pack(table, host, job.block_ids, job.group_ids, job.host_offsets)
    stream.synchronize()
    ref = make_host(job.host_bytes, table.device, seed=99)
    ref.copy_(host)
    for b, e in zip(case.buffers, expected_src, strict=True):
        assert torch.equal(b, e)
    TorchBackend().pack(table, ref, job.block_ids, job.group_ids, job.host_offsets)
    torch.cuda.synchronize()
    assert torch.equal(ref, host)


@pytest.mark.gpu
def test_cuda_large_offsets_are_64_bit() -> None:
    """A host record beyond 4 GiB: offsets must not wrap at 32 bits."""
    nbytes = (1 << 32) + (1 << 20)
    try:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:
        pytest.skip("cannot pin 4 GiB of host memory")
    case = build_case("mla", "fp16", "cuda", seed=55)
    table = case.table()
    rb = table.groups[1].record_bytes
    off = (1 << 32) + 4096
    bids = np.array([2], dtype=np.int64)
    gids = np.array([1], dtype=np.int32)
    offs = np.array([off], dtype=np.int64)
    host[:8192].fill_(7)
    host[off - 64 : off + rb + 64].fill_(7)
    TritonBackend().pack(table, host, bids, gids, offs)
    torch.cuda.synchronize()
    exp = torch.cat([t[2].contiguous().view(torch.uint8).reshape(-1).cpu() for t in case.groups[1]])
    assert torch.equal(host[off : off + rb], exp)
    assert bool((host[:8192] == 7).all()) and bool((host[off - 64 : off] == 7).all())
    assert bool((host[off + rb : off + rb + 64] == 7).all())


@pytest.mark.interpreter
def test_single_block_single_view_job() -> None:
    """n_job == 1 and max_views == 1 (values Triton would otherwise specialise)."""
    case = build_case("mla", "fp16", seed=36)
    table = KVCacheTable.from_tensors([case.groups[2]], "mla")
    t = case.groups[2][0]
    host = make_host(256, table.device)
    before = host.clone()
    TritonBackend().pack(table, host, np.array([4]), np.array([0], dtype=np.int32), np.array([32]))
    exp = t[4].contiguous().view(torch.uint8).reshape(-1)
    assert torch.equal(host[32 : 32 + exp.numel()], exp)
    assert torch.equal(host[:32], before[:32]) and torch.equal(host[32 + exp.numel() :], before[32 + exp.numel() :])
