"""Removal events of the disk tier on a real directory: every file the ``max_bytes`` budget evicts
yields one ``take_removed`` key (also files found by the start-up scan: their header names the
key), every value a load rejects (namespace, integrity, corruption) yields one, nothing else does."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import DiskTier
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.record import FIXED_HEADER_BYTES
from tests.tiers.conftest import NS, make_records

RB = 64 << 10
MAC_A = b"integrity-key-A-0123456789"
MAC_B = b"integrity-key-B-0123456789"


def _budget(n: int, key: bytes) -> int:
    """A ``max_bytes`` that ``n`` values fit in, not ``n + 1`` (buffered I/O: header + record)."""
    return n * (FIXED_HEADER_BYTES + len(key) + RB) + 50


def test_every_budget_evicted_file_yields_one_event_with_its_key(tmp_path: Path) -> None:
    n = 12
    src = make_records(n, RB, seed=41)
    keys = make_keys(n)
    with DiskTier(src, NS, tmp_path, o_direct=False, max_bytes=_budget(4, keys[0]), removal_events=True) as t:
        assert t.file_bytes(keys[0]) == FIXED_HEADER_BYTES + len(keys[0]) + RB
        assert run_job(t, "store", 1, keys[:4], [0, 1, 2, 3]) == (True,) * 4
        assert run_job(t, "load", 2, keys[:1], [11]) == (True,)  # keys[0] most recently used
        assert run_job(t, "load", 3, keys[5:6], [11]) == (False,)  # a miss: no event
        assert t.take_removed() == []
        for j, i in enumerate(range(4, n)):
            assert run_job(t, "store", 10 + j, keys[i : i + 1], [i]) == (True,)
        present = {k for k, c in zip(keys, t.contains(keys), strict=True) if c}
        removed = t.take_removed()
        assert len(present) == 4 and len(removed) == len(set(removed)) == n - 4
        assert set(removed) == set(keys) - present
        assert t.stats().evictions == len(removed) == t.stats().removals
        assert run_job(t, "store", 30, keys[-1:], [n - 1]) == (True,)  # already there: nothing evicted
        assert t.take_removed() == []


def test_files_of_the_startup_scan_are_named_by_their_header(tmp_path: Path) -> None:
    src = make_records(8, RB, seed=42)
    keys = make_keys(8)
    with DiskTier(src, NS, tmp_path, o_direct=False) as t:
        assert run_job(t, "store", 1, keys[:4], [0, 1, 2, 3]) == (True,) * 4
    with DiskTier(src, NS, tmp_path, o_direct=False, max_bytes=_budget(4, keys[0]), removal_events=True) as t:
        assert len(t.index) == 4
        assert run_job(t, "store", 2, keys[4:7], [4, 5, 6]) == (True,) * 3
        removed = t.take_removed()
        assert len(removed) == 3 and set(removed) <= set(keys[:4])
        assert t.contains(removed) == [False] * 3
        assert t.stats().evictions == 3


def test_no_events_unless_asked(tmp_path: Path) -> None:
    src = make_records(8, RB, seed=43)
    keys = make_keys(8)
    with DiskTier(src, NS, tmp_path, o_direct=False, max_bytes=_budget(2, keys[0])) as t:
        assert run_job(t, "store", 1, keys, list(range(8))) == (True,) * 8
        Path(t.value_path(keys[-1])).write_bytes(b"KVOT not a value")
        assert run_job(t, "load", 2, keys[-1:], [0]) == (False,)
        assert t.stats().evictions == 6 and t.stats().rejected_values == 1
        assert t.take_removed() == [] and t.stats().removals == 0


def test_each_rejected_value_yields_one_event(tmp_path: Path) -> None:
    src = make_records(8, RB, seed=44)
    keys = make_keys(5)
    other = TierNamespace("other/model", "bfloat16", "bfloat16", "flash_attn", (2, 16, 4, 64), 16)
    with DiskTier(src, other, tmp_path / "o", o_direct=False) as o:
        assert run_job(o, "store", 1, keys[:1], [0]) == (True,)
        foreign = o.value_path(keys[0])
    with DiskTier(src, NS, tmp_path / "s", o_direct=False, integrity_key=MAC_A) as signer:
        assert run_job(signer, "store", 1, keys[3:4], [3]) == (True,)
    kw = {"o_direct": False, "removal_events": True}
    with DiskTier(src, NS, tmp_path / "s", integrity_key=MAC_B, **kw) as t:  # keys[3]: a MAC it cannot verify
        assert run_job(t, "load", 1, keys[3:4], [7]) == (False,)
        assert t.take_removed() == [keys[3]]  # rejected, kept (valid for other readers): one event
        assert run_job(t, "load", 2, keys[3:4], [7]) == (False,)
        assert t.take_removed() == [keys[3]]  # one per rejection
    with DiskTier(src, NS, tmp_path / "m", **kw) as t:
        assert run_job(t, "store", 1, keys[1:3], [1, 2]) == (True, True)
        shutil.copyfile(foreign, t.value_path(keys[0]))  # another namespace's value under this path
        path = Path(t.value_path(keys[1]))
        flipped = bytearray(path.read_bytes())
        flipped[-1] ^= 0xFF
        path.write_bytes(bytes(flipped))  # a flipped payload byte
        assert run_job(t, "load", 2, keys[:4], [4, 5, 6, 7]) == (False, False, True, False)
        removed = t.take_removed()
        assert sorted(removed) == sorted(keys[:2])  # keys[2] loaded, keys[3] absent: no event
        st = t.stats()
        assert st.rejected_values == 2 and st.removals == 2 and st.evictions == 0
        assert run_job(t, "load", 3, keys[:2], [4, 5]) == (False, False)  # deleted: now misses
        assert t.take_removed() == []
