"""A disk tier deletes a rejected value's file only if it is still the file it read: another
engine sharing the directory may have renamed a new value over it meanwhile (real files)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import DiskTier
from kvoffload.tiers.disk.io import open_value, unlink_if_same
from kvoffload.tiers.record import ValueRejected
from tests.tiers.conftest import NS, make_records
from tests.tiers.disk.test_disk_tier import _independent_o_direct_check

RB = 2 * 4096 + 123


def _replace_as_another_writer(path: Path, data: bytes) -> None:
    """What another engine's store does: write a temporary file beside ``path``, rename it over."""
    tmp = path.with_name(".tmp-other-writer")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _open(path: Path) -> int:
    return open_value(str(path), False)


def test_unlink_if_same_deletes_the_file_it_read(tmp_path: Path) -> None:
    path = tmp_path / "v.kv"
    path.write_bytes(b"read and rejected")
    fd = _open(path)
    try:
        assert unlink_if_same(str(path), fd) is True
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


def test_unlink_if_same_keeps_a_file_renamed_over_it(tmp_path: Path) -> None:
    path = tmp_path / "v.kv"
    path.write_bytes(b"read and rejected")
    fd = _open(path)
    try:
        _replace_as_another_writer(path, b"another engine's new value")
        assert unlink_if_same(str(path), fd) is False
    finally:
        os.close(fd)
    assert path.read_bytes() == b"another engine's new value"
    assert [p.name for p in tmp_path.iterdir()] == ["v.kv"]  # no temporary file left behind


def test_unlink_if_same_on_a_file_removed_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "v.kv"
    path.write_bytes(b"read and rejected")
    fd = _open(path)
    try:
        path.unlink()
        assert unlink_if_same(str(path), fd) is False
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("o_direct", [True, False], ids=["o_direct", "buffered"])
def test_a_value_replaced_between_the_read_and_the_delete_is_kept(tmp_path: Path, o_direct: bool) -> None:
    if o_direct and not _independent_o_direct_check(tmp_path):
        pytest.skip(f"{tmp_path} does not accept O_DIRECT")
    src = make_records(4, RB, seed=37)
    keys = make_keys(2)
    with DiskTier(src, NS, tmp_path, o_direct=o_direct) as t:
        run_job(t, "store", 1, keys, [0, 1])
        paths = [Path(t.value_path(k)) for k in keys]
        good = [p.read_bytes() for p in paths]
        for p, g in zip(paths, good, strict=True):
            flipped = bytearray(g)
            flipped[4096 + 10] ^= 0xFF  # a payload byte in either layout
            p.write_bytes(bytes(flipped))  # both values corrupt on disk
        check = t.codec.check_parts

        def check_then_replaced(key: bytes, header: object, payload: object) -> None:
            try:
                check(key, header, payload)  # type: ignore[arg-type]
            except ValueRejected:
                if key == keys[0]:  # another engine renames a new value over the first file now
                    _replace_as_another_writer(paths[0], good[0])
                raise

        t.codec.check_parts = check_then_replaced  # type: ignore[method-assign]
        assert run_job(t, "load", 2, keys, [2, 3]) == (False, False)
        st = t.stats()
        assert (st.corrupt, st.deleted_values) == (2, 1)
        assert paths[0].read_bytes() == good[0] and not paths[1].exists()
        assert sorted(p.name for p in paths[0].parent.iterdir()) == [paths[0].name]  # no temp file left
        t.codec.check_parts = check  # type: ignore[method-assign]
        assert run_job(t, "load", 3, keys[:1], [3]) == (True,)
        np.testing.assert_array_equal(src[3], src[0])


def _value_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.suffix == ".kv"]


def test_a_kept_value_still_counts_in_the_budget(tmp_path: Path) -> None:
    """A rejected value whose file another writer replaced meanwhile is kept, and the budget
    (``max_bytes``) still counts it: the files on disk never exceed the budget afterwards."""
    src = make_records(4, RB, seed=41)
    keys = make_keys(3, b"budget")
    with DiskTier(src, NS, tmp_path, o_direct=False) as probe:
        size = probe.file_bytes(keys[0])
    with DiskTier(src, NS, tmp_path, o_direct=False, max_bytes=2 * size) as t:
        run_job(t, "store", 1, keys[:2], [0, 1])
        path = Path(t.value_path(keys[0]))
        good = path.read_bytes()
        flipped = bytearray(good)
        flipped[-1] ^= 0xFF  # a payload byte
        path.write_bytes(bytes(flipped))
        check = t.codec.check_parts

        def check_then_replaced(key: bytes, header: object, payload: object) -> None:
            try:
                check(key, header, payload)  # type: ignore[arg-type]
            except ValueRejected:
                _replace_as_another_writer(path, good)  # another engine's value of the same key
                raise

        t.codec.check_parts = check_then_replaced  # type: ignore[method-assign]
        assert run_job(t, "load", 2, keys[:1], [2]) == (False,)
        t.codec.check_parts = check  # type: ignore[method-assign]
        assert path.read_bytes() == good and t.stats().deleted_values == 0
        on_disk = _value_files(tmp_path)
        assert t.index.total_bytes == sum(p.stat().st_size for p in on_disk) == 2 * size
        run_job(t, "store", 3, keys[2:], [3])  # over the budget: the least recently used file goes
        on_disk = _value_files(tmp_path)
        assert len(on_disk) == 2 and sum(p.stat().st_size for p in on_disk) <= t.max_bytes
        assert t.index.total_bytes == sum(p.stat().st_size for p in on_disk)


def test_a_file_another_writer_stored_counts_in_the_budget(tmp_path: Path) -> None:
    """A store that finds the key's file already written by another process counts that file."""
    src = make_records(3, RB, seed=43)
    keys = make_keys(3, b"other")
    with DiskTier(src, NS, tmp_path / "a", o_direct=False) as other:
        run_job(other, "store", 1, keys[:1], [0])
        size = other.file_bytes(keys[0])
    shared = tmp_path / "a"
    with DiskTier(src, NS, shared, o_direct=False, max_bytes=2 * size) as t:
        Path(t.value_path(keys[1])).parent.mkdir(parents=True, exist_ok=True)
        with DiskTier(src, NS, shared, o_direct=False) as writer:  # writes after t's start-up scan
            run_job(writer, "store", 2, keys[1:2], [1])
        assert run_job(t, "store", 3, keys[1:2], [1]) == (True,)  # present: left as it is, counted
        run_job(t, "store", 4, keys[2:], [2])
        on_disk = _value_files(shared)
        assert sum(p.stat().st_size for p in on_disk) <= 2 * size
        assert t.index.total_bytes == sum(p.stat().st_size for p in on_disk)
