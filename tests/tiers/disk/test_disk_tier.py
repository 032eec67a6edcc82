"""DiskTier on real directories: O_DIRECT and buffered, restart, budget, crash leftovers, ENOSPC, EACCES."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import DiskTier, open_tier
from kvoffload.tiers.disk.io import probe_o_direct, temp_name
from tests.tiers.conftest import NS, make_records

RB = 2 * 4096 + 123
ROOT = Path(__file__).resolve().parents[3]


def _independent_o_direct_check(directory: Path) -> bool:
    """Whether an aligned O_DIRECT write works in ``directory`` (the test's own check)."""
    import mmap

    p = directory / "odirect-check"
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, buf)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        p.unlink()


@pytest.fixture(params=[True, False], ids=["o_direct", "buffered"])
def o_direct(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    """Both I/O paths; the O_DIRECT one is skipped where the test's directory refuses O_DIRECT."""
    if request.param and not _independent_o_direct_check(tmp_path):
        pytest.skip(f"{tmp_path} does not accept O_DIRECT")
    return bool(request.param)


def test_roundtrip_restart_keeps_cache(tmp_path: Path, o_direct: bool) -> None:
    src = make_records(8, RB, seed=31)
    keys = make_keys(6)
    with DiskTier(src, NS, tmp_path, o_direct=o_direct) as a:
        assert a.o_direct is o_direct
        assert (settle(a, keys) == LOOKUP_MISS).all()
        assert run_job(a, "store", 1, keys, [0, 1, 2, 3, 4, 5]) == (True,) * 6
        assert run_job(a, "store", 2, keys[:2], [7, 7]) == (True, True)
        assert a.stats().writes_skipped == 2
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == 6 and all(f.endswith(".kv") for f in files)  # no temporary file left
    dst = np.zeros_like(src)
    with DiskTier(dst, NS, tmp_path, o_direct=o_direct) as b:  # a restart: index from the scan
        assert len(b.index) == 6
        assert (settle(b, keys) == LOOKUP_HIT).all()
        assert run_job(b, "load", 3, keys, [5, 4, 3, 2, 1, 0]) == (True,) * 6
        np.testing.assert_array_equal(dst[[5, 4, 3, 2, 1, 0]], src[:6])
        assert not dst[6:].any()


def test_probe_agrees_with_an_independent_check(tmp_path: Path) -> None:
    for d in (tmp_path, Path("/dev/shm")):
        if d.is_dir() and os.access(d, os.W_OK):
            sub = Path(d) / f"probe-{os.getpid()}"
            sub.mkdir(exist_ok=True)
            try:
                assert probe_o_direct(str(sub)) == _independent_o_direct_check(sub)
                assert DiskTier(make_records(1, 64, 0), NS, sub).o_direct == probe_o_direct(str(sub))
            finally:
                for p in sorted(sub.rglob("*"), reverse=True):
                    p.rmdir() if p.is_dir() else p.unlink()
                sub.rmdir()


def test_budget_evicts_least_recently_used(tmp_path: Path) -> None:
    src = make_records(10, RB, seed=32)
    keys = make_keys(10)
    with DiskTier(src, NS, tmp_path, o_direct=False, max_bytes=4 * (RB + 104) + 50) as t:  # 4 values fit
        vb = t.file_bytes(keys[0])
        run_job(t, "store", 1, keys[:4], [0, 1, 2, 3])
        run_job(t, "load", 2, keys[:1], [9])  # keys[0] becomes most recently used
        run_job(t, "store", 3, keys[4:6], [4, 5])
        assert t.index.total_bytes <= t.max_bytes and t.stats().evictions == 2
        assert t.contains(keys[:6]) == [True, False, False, True, True, True]
        assert len(list(tmp_path.rglob("*.kv"))) == 4 and t.index.total_bytes == 4 * vb


def test_corrupt_files_are_counted_misses_and_deleted(tmp_path: Path, o_direct: bool) -> None:
    src = make_records(6, RB, seed=35)
    keys = make_keys(4)
    with DiskTier(src, NS, tmp_path, o_direct=o_direct) as t:
        run_job(t, "store", 1, keys, [0, 1, 2, 3])
        paths = [Path(t.value_path(k)) for k in keys]
        good = paths[0].read_bytes()
        paths[0].write_bytes(good[: len(good) // 2])  # truncated
        flipped = bytearray(paths[1].read_bytes())
        flipped[200] ^= 0xFF
        paths[1].write_bytes(bytes(flipped))  # a flipped payload byte
        paths[2].write_bytes(good)  # another key's value under this name
        assert run_job(t, "load", 2, keys, [4, 5, 4, 5]) == (False, False, False, True)
        np.testing.assert_array_equal(src[5], src[3])
        assert t.stats().rejected_values == 3
        assert [p.exists() for p in paths] == [False, False, False, True]
        assert t.contains(keys) == [False, False, False, True]


def test_stale_temp_files_cleaned_at_start_and_never_visible(tmp_path: Path) -> None:
    src = make_records(2, RB, seed=33)
    key = make_keys(1)
    with DiskTier(src, NS, tmp_path) as t:
        run_job(t, "store", 1, key, [0])
        sub = Path(t.value_path(key[0])).parent
    # a process that crashed while writing: its pid is gone, its temp file half written
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    crashed = sub / temp_name().replace(f"-{os.getpid()}-", f"-{pid}-")
    crashed.write_bytes(b"KVOT half a value")
    live = sub / temp_name()  # this (live) process's own temp file is left alone
    live.write_bytes(b"in progress")
    with DiskTier(src, NS, tmp_path) as t2:
        assert t2.temp_files_removed == 1 and not crashed.exists() and live.exists()
        assert len(t2.index) == 1 and t2.contains(key) == [True]
    live.unlink()


def _store_in_child(path: Path, fsize_limit: int | None, uid: int | None) -> dict:
    """Store 4 records in a child process (optionally with RLIMIT_FSIZE, or as ``uid`` once imports are done)."""
    code = (
        "import json,os,sys; from tests.tiers.conftest import NS,make_records;"
        "from kvoffload.testing.tier_steps import make_keys,run_job;"
        f"from kvoffload.tiers import DiskTier; r=make_records(4,{RB},34); k=make_keys(4);"
        + (f"os.setgid({uid}); os.setuid({uid});" if uid is not None else "")
        + f"t=DiskTier(r,NS,{str(path)!r},o_direct=False);"
        "ok=run_job(t,'store',1,k,[0,1,2,3]); s=t.stats(); t.close();"
        "print(json.dumps({'ok':ok,'errors':s.errors,'failures':s.write_failures}))"
    )

    def limit() -> None:
        if fsize_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, preexec_fn=limit, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tiny_fs(tmp_path: Path) -> Path | None:
    """A 20 KiB tmpfs (two values fit, not four) (real ENOSPC), or None where mounting is not allowed."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20k", "tmpfs", str(mnt)], capture_output=True)
    return mnt if r.returncode == 0 else None


def test_disk_full_fails_the_stores_and_leaves_no_temp_file(tmp_path: Path) -> None:
    mnt = _tiny_fs(tmp_path)
    try:
        target = mnt if mnt is not None else tmp_path / "limited"
        # ENOSPC on a full tmpfs; where mount is refused, EFBIG from RLIMIT_FSIZE (every write fails midway)
        res = _store_in_child(target, None if mnt is not None else RB + 50, None)  # a value is RB + 104 bytes
        assert res["ok"].count(False) >= 1 and res["errors"] == res["failures"] == res["ok"].count(False)
        names = [p.name for p in target.rglob("*") if p.is_file()]
        assert all(n.endswith(".kv") for n in names) and len(names) == res["ok"].count(True)  # no temp file
        dst = make_records(4, RB, seed=0)
        with DiskTier(dst, NS, target, o_direct=False) as t:
            stored = [i for i, ok in enumerate(res["ok"]) if ok]
            assert run_job(t, "load", 1, make_keys(4), [0, 1, 2, 3]) == tuple(i in stored for i in range(4))
            src = make_records(4, RB, 34)
            for i in stored:
                np.testing.assert_array_equal(dst[i], src[i])
    finally:
        if mnt is not None:
            subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_permission_denied_fails_the_stores_counted() -> None:
    d = Path(tempfile.mkdtemp(prefix="kvoffload-eacces-"))  # outside pytest's 0700 tree: nobody can enter
    try:
        os.chmod(d, 0o755)
        DiskTier(make_records(1, RB, 0), NS, d).close()  # root creates the tier directory
        res = _store_in_child(d, None, 65534)  # nobody: may read, may not write
        assert res == {"ok": [False] * 4, "errors": 4, "failures": 4}
        assert not [p for p in d.rglob("*") if p.is_file()]
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize(
    "spec, kw, err, needle",
    [
        ("disk:", {}, ValueError, "directory"),
        ("disk:/tmp/x?max_bytes=lots", {}, ValueError, "max_bytes"),
        ("disk:/tmp/x?o_direct=maybe", {}, ValueError, "o_direct"),
        ("disk:/tmp/x?colour=red", {}, ValueError, "colour"),
        ("disk:/tmp/x", {"max_bytes": 0}, ValueError, "max_bytes"),
        ("disk:/tmp/x", {"o_direct": "yes"}, TypeError, "o_direct"),
        ("s3://bucket", {}, ValueError, "unknown scheme .s3.; expected one of disk:, redis:"),
    ],
)
def test_bad_specs_and_options_raise_typed_errors(spec: str, kw: dict, err: type, needle: str) -> None:
    with pytest.raises(err, match=needle):
        open_tier(spec, make_records(1, 64, 0), NS, **kw)


def test_empty_jobs_finish_at_once(tmp_path: Path) -> None:
    with DiskTier(make_records(2, 64, 0), NS, tmp_path) as t:
        t.submit_store(1, [], [])
        t.submit_load(2, [], [])
        assert [(r.job_id, r.kind, r.success) for r in t.get_finished()] == [(1, "store", True), (2, "load", True)]
        assert t.lookup([]).shape == (0,)


def test_path_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(ValueError, match="not a directory"):
        DiskTier(make_records(1, 64, 0), NS, f)
    assert f.read_bytes() == b"" and sorted(tmp_path.iterdir()) == [f]
