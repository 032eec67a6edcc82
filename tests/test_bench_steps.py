"""The manager and scheduler benchmarks' own steps at tiny sizes: a change to the manager that
breaks a benchmark (which reaches its internal eviction step) fails here, not on the next full run.

The figures are not checked (no timing in tests); each step's own assertions and results are.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_manager() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import bench_manager as mod

    return mod


def test_manager_trace_step(bench_manager: Any) -> None:
    r = bench_manager.bench_trace(capacity=3_000, n_requests=6, repeats=1)
    for name in ("ours_batch_lookup", "ours_per_key_lookup", "baseline"):
        assert r[name]["requests_per_s"] > 0
    assert r["ratio_batch_vs_baseline"] > 0


@pytest.mark.parametrize("pinned", [0.0, 0.2])
def test_manager_eviction_step(bench_manager: Any, pinned: float) -> None:
    r = bench_manager.bench_evict(capacity=3_000, k=100, pinned_fraction=pinned, repeats=1)
    assert r["ours_evict_ms"] > 0 and r["baseline_evict_ms"] > 0


def test_manager_lookup_memory_and_hit_rate_steps(bench_manager: Any) -> None:
    assert bench_manager.bench_lookup(capacity=2_000, n=200, rounds=1)["ratio_miss"] > 0
    mem = bench_manager.bench_memory(capacity=2_000)
    assert mem and all(v > 0 for k, v in mem.items() if k.endswith("bytes_per_block"))
    rates = bench_manager.bench_hit_rate(n_requests=20, capacity=500)
    assert rates


def test_host_path_bench_measures_this_tree() -> None:
    """bench_host_path's measurement at 2 timed steps a case: every case ran through the compiled
    entry, the merged mode in one launch a step; the call counts are what the bench reports."""
    pytest.importorskip("triton")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import bench_host_path

    rows = bench_host_path.measure(steps=2, path="direct")["rows"]
    assert {(r["pages"], r["direction"], r["mode"]) for r in rows} == {
        (p, d, m) for p in bench_host_path.PAGES for d in ("store", "load") for m in ("single", "merged")
    }
    for r in rows:
        assert r["entry"] == "compiled" and r["us_per_job"] > 0 and r["calls_per_job"] > 0
        assert r["launches_per_step"] == (bench_host_path.JOBS_PER_STEP if r["mode"] == "single" else 1)
