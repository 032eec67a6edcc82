"""``bench/bench_tier_breakdown.py``'s own step at a tiny size, against a real ``redis-server``: the
parts it splits a run's wall time into are each the time of that part alone (nested calls taken out
of their parent, none negative), and its counts are the engine's. No figure is checked."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.tiered_options import TieredOptions
from kvoffload.testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def breakdown() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import bench_tier_breakdown as mod

    return mod


def test_breakdown_parts_of_a_cold_and_a_warm_run(breakdown: Any, own_redis: RedisServer) -> None:
    base = DemoSettings(conversations=3)
    with_tier = replace(base, tiers=(own_redis.url,))
    pid = own_redis.proc.pid if own_redis.proc is not None else None
    none = breakdown.run_once(base, pid)
    cold = breakdown.run_once(with_tier, pid)
    warm = breakdown.run_once(with_tier, pid, TieredOptions(sync_load_budget_bytes=0))
    for r in (none, cold, warm):
        parts = [r[f"{p}_seconds"] for p in breakdown.PARTS]
        assert min(parts) >= 0 and abs(sum(parts) - r["wall_seconds"]) < 1e-6
        assert r["compute_seconds"] > 0 and r["steps"] > 0
    assert "tier_blocks_promoted" not in none and none["tier_blocked_seconds"] == 0
    assert cold["tier_blocks_written"] == cold["blocks_stored"] > 0 and cold["tier_blocks_promoted"] == 0
    # warm, every promotion on the tier's threads: nothing read within lookups, requests deferred
    assert warm["tier_blocks_promoted"] > 0 and warm["deferrals"] > 0
    assert warm["prefill_computed_tokens"] < cold["prefill_computed_tokens"]
    assert warm["tier_blocks_loaded"] > 0 and warm["other_threads_cpu_seconds"] > 0
