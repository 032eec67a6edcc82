"""Direct, staged and copy-engine-only paths: byte-exact for every layout, dtype and page size.

On CPU the copy engine is a plain copy and the HBM scatter/gather is the backend's kernel (the
torch reference, or the Triton kernel through the interpreter with tiny shapes), so the path
logic -- record ordering, coalescing, the staging ring and its pieces -- is the code that runs
on a GPU. Expected bytes come from :mod:`kvoffload.testing` (plain tensor indexing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.config import LaunchConfig
from kvoffload.kernels.copy_engine import CopyList, TorchCopies, coalesce
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.paths import DataPath
from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.kernels.triton_backend import TritonBackend, job_alignment
from kvoffload.testing.cases import DTYPES, PAGE_LAYOUTS, Case, build_page_case
from kvoffload.testing.checks import Job, check_pack, check_roundtrip, check_unpack, make_host

PAGE_BYTES = [16, 33, 48, 1000, 4096, 65536]  # 16 B .. 64 KiB, odd sizes included
PATHS = ["direct", "staged", "dma"]
# a ring far smaller than a job: several pieces per job, every segment reused
SMALL_RING = LaunchConfig(staging_bytes=256, staging_segments=2)


class _PathAsBackend(KernelBackend):
    """Lets the conformance checks drive a :class:`DataPath` through the backend signature."""

    name = "path-under-test"

    def __init__(self, inner: KernelBackend, path: str, copies: Any = None) -> None:
        self.inner, self.path, self.copies_ = inner, path, copies
        self.taken: list[str] = []

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        return True

    def _dp(self, table: KVCacheTable) -> DataPath:
        return DataPath(self.inner, table, self.path, config=SMALL_RING, copies=self.copies_)

    def pack(self, table: Any, host: Any, block_ids: Any, group_ids: Any, host_offsets: Any) -> None:
        self.taken.append(self._dp(table).pack(host, block_ids, group_ids, host_offsets))

    def unpack(self, table: Any, host: Any, block_ids: Any, group_ids: Any, host_offsets: Any) -> None:
        self.taken.append(self._dp(table).unpack(host, block_ids, group_ids, host_offsets))

    def _copy(self, job: Any, to_host: bool) -> None:  # pragma: no cover - pack/unpack overridden
        raise AssertionError


def _job(case: Case, seed: int, contiguous: bool) -> Job:
    """4 random blocks of each group; records in consecutive slots (``contiguous``) or scattered with gaps."""
    rng = np.random.default_rng(seed)
    table = case.table()
    bids, gids = [], []
    for g in range(table.num_groups):
        bids += rng.choice(table.groups[g].num_blocks, size=4, replace=False).tolist()
        gids += [g] * 4
    n = len(bids)
    slot = max(table.record_bytes)
    if contiguous:
        offsets = 8 + np.arange(n) * slot
        host_bytes = 8 + n * slot + 8
    else:
        slot += 24
        offsets = 16 + rng.permutation(n + 3)[:n] * slot
        host_bytes = 16 + (n + 3) * slot
    order = rng.permutation(n)
    return Job(
        np.asarray(bids, dtype=np.int64)[order],
        np.asarray(gids, dtype=np.int32)[order],
        offsets.astype(np.int64)[order],
        int(host_bytes),
    )


@pytest.mark.parametrize("page_bytes", PAGE_BYTES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", PAGE_LAYOUTS)
@pytest.mark.parametrize("path", PATHS)
def test_path_byte_exact_torch(path: str, layout: str, dtype: str, page_bytes: int) -> None:
    be = _PathAsBackend(TorchBackend(), path)
    case = build_page_case(layout, dtype, page_bytes, seed=page_bytes)
    for contiguous in (False, True):
        job = _job(case, seed=page_bytes + 1, contiguous=contiguous)
        check_pack(be, case, job)
        check_unpack(be, case, job)
    check_roundtrip(be, case, build_page_case(layout, dtype, page_bytes, seed=page_bytes + 7), job)
    assert set(be.taken) == {path}


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("layout", "dtype", "page_bytes"),
    [("flash_attn", "fp16", 16), ("flashinfer", "fp8", 33), ("mla", "bf16", 4096), ("generic", "fp32", 1000)],
)
@pytest.mark.parametrize("path", ["direct", "staged"])
def test_path_byte_exact_triton_interpreted(path: str, layout: str, dtype: str, page_bytes: int) -> None:
    be = _PathAsBackend(TritonBackend(), path)
    case = build_page_case(layout, dtype, page_bytes, seed=3, num_blocks=4)
    job = _job(case, seed=4, contiguous=page_bytes % 2 == 0)
    check_pack(be, case, job)
    check_unpack(be, case, job)


class _CountingCopies(TorchCopies):
    def __init__(self) -> None:
        self.calls: list[int] = []

    def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
        self.calls.append(len(copies))
        super().run(spaces, copies)


def test_contiguous_records_become_one_copy_per_piece() -> None:
    """Staged pack/unpack of records packed back to back: one DMA for the whole job when it fits
    a segment, one per piece when it does not."""
    case = build_page_case("flash_attn", "fp16", 4096, seed=5)
    table = case.table()
    rng = np.random.default_rng(6)
    gids = np.repeat(np.arange(2, dtype=np.int32), 4)
    bids = np.concatenate([rng.choice(6, 4, replace=False), rng.choice(7, 4, replace=False)]).astype(np.int64)
    rb = np.array(table.record_bytes, dtype=np.int64)[gids]
    offs = np.cumsum(rb) - rb
    perm = rng.permutation(8)
    host = torch.zeros(int(rb.sum()), dtype=torch.uint8)
    for ring, expected in ((1 << 20, [1, 1]), (int(rb.max()) * 2, None)):
        counting = _CountingCopies()
        dp = DataPath(TorchBackend(), table, "staged", config=LaunchConfig(staging_bytes=ring), copies=counting)
        dp.pack(host, bids[perm], gids[perm], offs[perm])
        dp.unpack(host, bids[perm], gids[perm], offs[perm])
        if expected is not None:
            assert counting.calls == expected
        else:  # segments of one large record: several pieces, each one copy
            assert set(counting.calls) == {1} and len(counting.calls) >= 2 * 4
    ref = torch.zeros_like(host)
    TorchBackend().pack(table, ref, bids, gids, offs)
    assert torch.equal(host, ref)


def test_dma_path_coalesces_adjacent_pages() -> None:
    """One flashinfer layer: pages of consecutive blocks are adjacent in memory, and so are their
    records in consecutive slots -- the copy-engine path moves them in one copy."""
    case = build_page_case("flashinfer", "bf16", 512, seed=8)
    table = KVCacheTable.from_tensors([[case.groups[0][0]]], "flashinfer")
    bids = np.array([1, 2, 3, 4], dtype=np.int64)
    gids = np.zeros(4, dtype=np.int32)
    rb = table.groups[0].record_bytes
    offs = np.arange(4, dtype=np.int64) * rb
    counting = _CountingCopies()
    dp = DataPath(TorchBackend(), table, "dma", copies=counting)
    host = torch.zeros(4 * rb, dtype=torch.uint8)
    dp.pack(host, bids, gids, offs)
    ref = torch.zeros_like(host)
    TorchBackend().pack(table, ref, bids, gids, offs)
    assert torch.equal(host, ref)
    dp.unpack(host, bids[::-1].copy(), gids, offs)  # reversed: no two neighbours stay adjacent
    assert counting.calls == [1, 4]


def test_coalesce_matches_elementwise_copies() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 30))
        size = rng.integers(1, 9, n)
        dst_off = np.cumsum(size + rng.integers(0, 2, n) * 3) - size
        src_off = np.cumsum(size + rng.integers(0, 2, n)) - size
        perm = rng.permutation(n)
        zeros = np.zeros(n, dtype=np.int64)
        cl = coalesce(zeros, dst_off[perm], zeros + 1, src_off[perm], size[perm])
        assert cl.nbytes == int(size.sum()) and len(cl) <= n
        src = torch.randint(0, 256, (int(src_off.max() + 10),), dtype=torch.uint8)
        a = torch.zeros(int(dst_off.max() + 10), dtype=torch.uint8)
        b = a.clone()
        TorchCopies().run([a, src], cl)
        for d, s, k in zip(dst_off, src_off, size, strict=True):
            b[d : d + k] = src[s : s + k]
        assert torch.equal(a, b)


def test_auto_choice_follows_crossovers() -> None:
    case = build_page_case("mla", "fp16", 64, seed=9)
    cfg = LaunchConfig(pack_staged_min_bytes=-1, unpack_staged_min_bytes=1000, staging_bytes=4096)
    dp = DataPath(TorchBackend(), case.table(), "auto", config=cfg)
    assert dp.choose(True, 10**9) == "direct"
    assert dp.choose(False, 999) == "direct" and dp.choose(False, 1000) == "staged"
    assert DataPath(TorchBackend(), case.table(), "dma", config=cfg).choose(False, 10**9) == "dma"
    forced = DataPath(TorchBackend(), case.table(), "auto", config=LaunchConfig(pack_path="dma"))
    assert forced.choose(True, 1) == "dma" and forced.staging_bytes == 0  # nothing can stage: no ring
    with pytest.raises(InvalidArgumentError, match="path"):
        DataPath(TorchBackend(), case.table(), "fast")
    with pytest.raises(InvalidTypeError, match="path"):
        DataPath(TorchBackend(), case.table(), 3)  # type: ignore[arg-type]


def test_choice_logged_once_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    case = build_page_case("mla", "fp16", 64, seed=10)
    table = case.table()
    job = _job(case, seed=11, contiguous=True)
    dp = DataPath(TorchBackend(), table, "staged", config=SMALL_RING)
    host = torch.zeros(job.host_bytes, dtype=torch.uint8)
    with caplog.at_level("INFO", logger="kvoffload.kernels.paths"):
        for _ in range(3):
            dp.pack(host, job.block_ids, job.group_ids, job.host_offsets)
    assert sum("staged path" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("page_bytes", [33, 4096, 65536])
@pytest.mark.parametrize("layout", PAGE_LAYOUTS)
@pytest.mark.parametrize("path", PATHS)
def test_path_byte_exact_cuda(path: str, layout: str, page_bytes: int) -> None:
    be = _PathAsBackend(TritonBackend(), path)
    case = build_page_case(layout, "bf16", page_bytes, "cuda", seed=page_bytes)
    for contiguous in (False, True):
        job = _job(case, seed=page_bytes + 2, contiguous=contiguous)
        check_pack(be, case, job)
        check_unpack(be, case, job)


def test_fallback_copies_switch_once_and_reissue(caplog: pytest.LogCaptureFixture) -> None:
    from kvoffload.kernels.copy_engine import FallbackCopies

    class Broken:
        name = "broken"
        calls = 0

        def run(self, spaces: list[torch.Tensor], copies: CopyList) -> None:
            Broken.calls += 1
            raise TypeError("unexpected signature")

    fb = FallbackCopies(Broken(), TorchCopies())
    src = torch.arange(16, dtype=torch.uint8)
    dst = torch.zeros(16, dtype=torch.uint8)
    one = np.array([0], dtype=np.int64)
    cl = coalesce(one * 0, one + 2, one + 1, one + 4, one + 8)
    with caplog.at_level("WARNING"):
        fb.run([dst, src], cl)
        fb.run([dst, src], cl)
    assert Broken.calls == 1 and fb.name == "torch" and torch.equal(dst[2:10], src[4:12])
    assert sum("broken copies failed" in r.getMessage() for r in caplog.records) == 1


def test_backend_overriding_pack_gets_the_direct_path() -> None:
    """An out-of-tree backend that overrides pack/unpack has no kernel to point at a staging buffer."""
    case = build_page_case("mla", "fp16", 64, seed=12)
    be = _PathAsBackend(TorchBackend(), "direct")
    dp = DataPath(be, case.table(), "staged", config=SMALL_RING)
    assert dp.choose(True, 1 << 20) == "direct" and dp.choose(False, 1) == "direct"
    auto = DataPath(be, case.table(), "auto", config=LaunchConfig(unpack_staged_min_bytes=0))
    assert auto.choose(False, 1 << 20) == "direct"


@pytest.mark.interpreter
def test_prepared_word_width_is_reused_for_better_aligned_jobs() -> None:
    """After prepare(table, 1), a 4-byte aligned job runs with the prepared 1-byte variant: no new
    device tables (nor a compile) at submit time."""
    case = build_page_case("flash_attn", "fp32", 64, seed=13)
    table = case.table()
    be = TritonBackend()
    be.prepare(table, 1)
    keys = set(table.cache)
    job = _job(case, seed=14, contiguous=True)
    slot = -(-max(table.record_bytes) // 16) * 16
    job.host_offsets = 16 + slot * np.random.default_rng(15).permutation(job.host_offsets.size).astype(np.int64)
    job.host_bytes = int(job.host_offsets.max()) + slot + 16
    host = make_host(job.host_bytes, table.device)
    assert job_alignment(table, host, job.host_offsets) == 4  # wider than the prepared 1
    check_pack(be, case, job)
    check_unpack(be, case, job)
    assert set(table.cache) == keys
