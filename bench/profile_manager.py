"""Where the time goes: cProfile of the realistic per-key trace (``bench/manager_trace.py``) at
10^6 blocks, kvoffload's ``CPUOffloadingManager`` (batch lookup) vs the OrderedDict baseline.

Run: ``python bench/profile_manager.py [--capacity N] [--requests N] [--top N]``. Prints the wall
time of each replay without the profiler, then the top functions by own time and by cumulative
time under the profiler (which inflates per-call overhead: read the shares, not the totals).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.baseline_manager import OrderedDictLRUManager  # noqa: E402
from bench.manager_trace import PrefixTrace, _filler, _prefill, run_trace  # noqa: E402
from kvoffload.cache.manager import CPUOffloadingManager  # noqa: E402


def _setup(impl: str, capacity: int, warm: list[list[bytes]]) -> Any:
    m = CPUOffloadingManager(capacity) if impl == "ours" else OrderedDictLRUManager(capacity)
    _prefill(m, _filler(capacity, seed=3))
    run_trace(m, [list(r) for r in warm], batch_lookup=impl == "ours")
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    trace = PrefixTrace(seed=7, num_prefixes=max(50, args.capacity // 2000))
    warm = [trace.request() for _ in range(max(20, args.requests // 5))]
    reqs = [trace.request() for _ in range(args.requests)]
    for impl in ("ours", "baseline"):
        batch = impl == "ours"
        m = _setup(impl, args.capacity, warm)
        plain = run_trace(m, [[bytes(bytearray(k)) for k in r] for r in reqs], batch)
        del m
        gc.collect()
        m = _setup(impl, args.capacity, warm)
        copies = [[bytes(bytearray(k)) for k in r] for r in reqs]
        prof = cProfile.Profile()
        prof.enable()
        run_trace(m, copies, batch)
        prof.disable()
        print(f"\n=== {impl}: {plain['requests_per_s']:.0f} requests/s unprofiled ({plain['seconds']:.3f} s)")
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        del m
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
