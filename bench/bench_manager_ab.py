"""A/B of two versions of kvoffload's CPU manager inside one process, on ``bench_manager``'s trace and stores.

Run: ``python bench/bench_manager_ab.py --against REV [--capacity N] [--rounds N]`` from a
checkout. ``REV`` is a git revision of this repository. Prints; writes nothing.

Why: on a shared machine ``bench_manager``'s ratios swing by tens of percent from run to run (its
baseline's requests/s too). This loads this checkout's ``CPUOffloadingManager`` (A) and ``REV``'s
(B, extracted by :func:`bench.revision.extract_as_b`) in one process and, for ``--rounds`` rounds,
runs each of A, B and the OrderedDict baseline once in turn on the same data:

* the realistic trace of ``bench_manager`` (``manager_trace.run_trace``, batch lookups, 400
  requests, the pool pre-filled and warmed as there): requests/s;
* a ``prepare_store`` of 1,000 new keys on a full pool of ready blocks, right after a full
  collection (cold caches): the eviction of 1,000 blocks, their release and the new keys'
  allocation, in ms (only public calls, so that any revision runs it).

Printed: each round's figures, then medians, and the medians of the per-round ratios B/A,
A/baseline and B/baseline (for the trace, higher is faster; for the stores, lower is).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import baseline_manager, manager_trace  # noqa: E402
from bench.revision import extract_as_b  # noqa: E402

STORE_KEYS = 1000


def _trace_round(make: Any, ctx: Any, capacity: int, data: dict[str, Any]) -> float:
    """Requests/s of one fresh manager on the trace (fresh key objects, as an engine's)."""
    manager_trace.CTX = ctx  # the module's calls read it
    copies = [[bytes(bytearray(k)) for k in r] for r in data["requests"]]
    m = make(capacity)
    manager_trace._prefill(m, data["filler"])
    batch = hasattr(m, "lookup_batch")
    manager_trace.run_trace(m, [list(r) for r in data["warm"]], batch)
    rate: float = manager_trace.run_trace(m, copies, batch)["requests_per_s"]
    del m, copies
    gc.collect()
    return rate


def _store_round(make: Any, ctx: Any, capacity: int, data: dict[str, Any], r: int) -> float:
    """Milliseconds of a ``prepare_store`` of new keys that evicts as many, on a full pool."""
    m = make(capacity)
    manager_trace.CTX = ctx
    manager_trace._prefill(m, data["filler"])
    new = manager_trace._filler(STORE_KEYS, seed=1000 + r)
    for k in new:
        hash(k)
    gc.collect()  # cold: the collection's traversal flushes the CPU caches
    t = time.perf_counter()
    out = m.prepare_store(new, ctx)
    ms = (time.perf_counter() - t) * 1e3
    assert out is not None and len(out.evicted_keys) == STORE_KEYS
    del m
    gc.collect()
    return ms


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="git revision of B (A: this checkout)")
    ap.add_argument("--capacity", type=int, default=1_000_000, help="pool size in blocks")
    ap.add_argument("--rounds", type=int, default=11, help="rounds (each runs A, B and the baseline once)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extract_as_b(args.against, Path(tmp))
        sys.path.insert(1, tmp)
        from kvoffload.cache.manager import CPUOffloadingManager
        from kvoffload.core.base import ReqContext

        b_manager = __import__("kvoffload_b.cache.manager", fromlist=["CPUOffloadingManager"])
        b_base = __import__("kvoffload_b.core.base", fromlist=["ReqContext"])
        versions = {
            "A": (CPUOffloadingManager, ReqContext(req_id="bench")),
            "B": (b_manager.CPUOffloadingManager, b_base.ReqContext(req_id="bench")),
            "base": (baseline_manager.OrderedDictLRUManager, ReqContext(req_id="bench")),
        }
        trace = manager_trace.PrefixTrace(seed=7, num_prefixes=max(50, args.capacity // 2000))
        data = {
            "warm": [trace.request() for _ in range(80)],
            "requests": [trace.request() for _ in range(400)],
            "filler": manager_trace._filler(args.capacity, seed=3),
        }
        rates: dict[str, list[float]] = {v: [] for v in versions}
        stores: dict[str, list[float]] = {v: [] for v in versions}
        for r in range(args.rounds):
            for name, (make, ctx) in versions.items():
                rates[name].append(_trace_round(make, ctx, args.capacity, data))
                stores[name].append(_store_round(make, ctx, args.capacity, data, r))
            print(
                f"round {r}: trace req/s "
                + " ".join(f"{v} {rates[v][-1]:.0f}" for v in versions)
                + " | store 1,000 (evicting) ms "
                + " ".join(f"{v} {stores[v][-1]:.3f}" for v in versions),
                flush=True,
            )
    for label, got in (("trace req/s", rates), ("store ms", stores)):
        print(
            f"{label}: medians "
            + " ".join(f"{v} {statistics.median(x):.3f}" for v, x in got.items())
            + f" | median ratios B/A {_median_ratio(got['B'], got['A']):.3f}"
            + f" A/base {_median_ratio(got['A'], got['base']):.3f} B/base {_median_ratio(got['B'], got['base']):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
