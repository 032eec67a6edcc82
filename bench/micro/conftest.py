"""pytest-benchmark micro benchmarks (``make bench-micro``): kvoffload vs the in-run baseline.

Each benchmark names its group (one operation at one size) and its implementation (``ours`` or
a baseline: ``baseline`` is :class:`bench.baseline_manager.OrderedDictLRUManager`, the OrderedDict
design of vLLM's CPU manager; ``bare`` is the engine's own cost of describing a step). At the end
of the session every group's ratio ``baseline median / ours median`` (above 1: ours is faster) is
printed and, with ``--benchmark-json``, added to that file under ``"ratios"``. No target is
asserted: the ratios are the result.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: group -> implementation -> median seconds per operation
_MEDIANS: dict[str, dict[str, float]] = {}


class Recorder:
    """Runs one benchmark and keeps its median (seconds per operation) for the ratio table."""

    def __init__(self, benchmark: Any) -> None:
        self.benchmark = benchmark

    def __call__(self, group: str, impl: str, fn: Any, *, per: int = 1, setup: Any = None, rounds: int = 60) -> None:
        """Time ``fn`` (after ``setup()`` when given, untimed, once per round); ``per``: operations
        per call, so that the recorded figure is per operation."""
        b = self.benchmark
        b.group = group
        b.name = f"{group}[{impl}]"
        b.extra_info["impl"] = impl
        b.extra_info["ops_per_call"] = per
        if setup is None:
            b(fn)
        else:
            b.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=2)
        data = b.stats.stats.data
        _MEDIANS.setdefault(group, {})[impl] = statistics.median(data) / per


@pytest.fixture
def record(benchmark: Any) -> Recorder:
    return Recorder(benchmark)


def _ratios() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for group, by_impl in sorted(_MEDIANS.items()):
        ours = by_impl.get("ours")
        if not ours:
            continue
        row = {f"{impl}_us": round(t * 1e6, 3) for impl, t in sorted(by_impl.items())}
        for impl, t in by_impl.items():
            if impl != "ours":
                row[f"{impl}_over_ours"] = round(t / ours, 3)
        out[group] = row
    return out


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    output_json["ratios"] = _ratios()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    ratios = _ratios()
    if not ratios:
        return
    terminalreporter.section("kvoffload vs in-run baseline (median per operation; ratio > 1: ours faster)")
    for group, row in ratios.items():
        cells = "  ".join(f"{k} {v}" for k, v in row.items())
        terminalreporter.write_line(f"{group:<40} {cells}")
