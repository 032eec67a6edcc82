"""DiskTier file layouts: paged (O_DIRECT, records read and written in place) and packed (buffered).

Page-aligned host records (the host pool's) move straight between the record and the file; the
files are checked byte for byte against the layout built here, both layouts are readable
whatever the reader's mode, and every byte of a paged file (payload, header, padding) is checked.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import DiskTier
from kvoffload.tiers.disk.io import is_page_aligned
from tests.tiers.conftest import NS, make_records
from tests.tiers.disk.test_disk_tier import _independent_o_direct_check

PAGE = 4096
RB = 2 * PAGE  # whole pages: rows of a page-aligned array are page aligned


def _aligned_records(n: int, seed: int) -> tuple[np.ndarray, mmap.mmap]:
    mm = mmap.mmap(-1, n * RB)
    arr = np.frombuffer(mm, dtype=np.uint8).reshape(n, RB)
    arr[:] = make_records(n, RB, seed)
    return arr, mm


def _unaligned_records(n: int) -> np.ndarray:
    """``n`` zeroed rows whose first byte is 8 bytes past a page boundary (never page-aligned)."""
    buf = np.zeros(n * RB + 2 * PAGE, dtype=np.uint8)
    start = (-buf.ctypes.data) % PAGE + 8
    return buf[start : start + n * RB].reshape(n, RB)


def _need_o_direct(d: Path) -> None:
    if not _independent_o_direct_check(d):
        pytest.skip(f"{d} does not accept O_DIRECT")


def test_paged_files_written_in_place_and_readable_by_both_modes(tmp_path: Path) -> None:
    _need_o_direct(tmp_path)
    src, _m1 = _aligned_records(6, seed=41)
    keys = make_keys(4)
    with DiskTier(src, NS, tmp_path, o_direct=True) as t:
        assert is_page_aligned(t.records) and t._in_place
        assert run_job(t, "store", 1, keys, [0, 1, 2, 3]) == (True,) * 4
        hb = t.codec.header_bytes(keys[0])
        for i, k in enumerate(keys):
            data = Path(t.value_path(k)).read_bytes()
            assert len(data) == PAGE + RB == t.file_bytes(k)
            assert data[:4] == b"KVOT" and data[hb - len(k) : hb] == k
            assert not any(data[hb:PAGE])  # header padding
            assert data[PAGE:] == src[i].tobytes()
    dst, _m2 = _aligned_records(6, seed=0)
    dst[:] = 0
    with DiskTier(dst, NS, tmp_path, o_direct=True) as t:  # in place
        assert run_job(t, "load", 2, keys, [5, 4, 3, 2]) == (True,) * 4
    np.testing.assert_array_equal(dst[[5, 4, 3, 2]], src[:4])
    assert not dst[:2].any()
    plain = np.zeros((6, RB), dtype=np.uint8)
    with DiskTier(plain, NS, tmp_path, o_direct=False) as t:  # a buffered reader of paged files
        assert run_job(t, "load", 3, keys, [0, 1, 2, 3]) == (True,) * 4
    np.testing.assert_array_equal(plain[:4], src[:4])
    assert not plain[4:].any()


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_packed_files_readable_with_o_direct(tmp_path: Path, aligned: bool) -> None:
    _need_o_direct(tmp_path)
    src = make_records(4, RB, seed=42)
    keys = make_keys(3)
    with DiskTier(src, NS, tmp_path, o_direct=False) as t:
        assert run_job(t, "store", 1, keys, [0, 1, 2]) == (True,) * 3
        data = Path(t.value_path(keys[1])).read_bytes()
        hb = t.codec.header_bytes(keys[1])
        assert len(data) == hb + RB and data[hb:] == src[1].tobytes()
    dst, _m = _aligned_records(4, seed=0) if aligned else (_unaligned_records(4), None)
    dst[:] = 0
    with DiskTier(dst, NS, tmp_path, o_direct=True) as t:
        assert t._in_place is aligned
        assert run_job(t, "load", 2, keys, [3, 2, 1]) == (True,) * 3
    np.testing.assert_array_equal(dst[[3, 2, 1]], src[:3])
    assert not dst[0].any()


def test_every_byte_of_a_paged_file_is_checked(tmp_path: Path) -> None:
    _need_o_direct(tmp_path)
    src, _m1 = _aligned_records(10, seed=43)
    keys = make_keys(5)
    with DiskTier(src, NS, tmp_path, o_direct=True) as t:
        run_job(t, "store", 1, keys, [0, 1, 2, 3, 4])
        paths = [Path(t.value_path(k)) for k in keys]
        edits = [PAGE + 10, 3000, 40]  # a payload byte, a header padding byte, a header byte
        for p, off in zip(paths[:3], edits, strict=True):
            fd = os.open(p, os.O_RDWR)
            try:
                byte = os.pread(fd, 1, off)
                os.pwrite(fd, bytes([byte[0] ^ 0x5A]), off)
            finally:
                os.close(fd)
        os.truncate(paths[3], PAGE + RB - PAGE)  # truncated by a page
        before = src.copy()
        assert run_job(t, "load", 2, keys, [5, 6, 7, 8, 9]) == (False, False, False, False, True)
        np.testing.assert_array_equal(src[9], before[4])
        np.testing.assert_array_equal(src[:5], before[:5])  # the stored records are untouched
        assert t.stats().rejected_values == 4
        assert [p.exists() for p in paths] == [False, False, False, False, True]
        assert t.contains(keys) == [False, False, False, False, True]
