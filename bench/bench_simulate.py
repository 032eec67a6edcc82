"""``kvoffload simulate``'s wall time on a real trace: one node against ``kvcache-simulator``, and a fleet.

Two measurements, each a whole command line timed from start to exit (imports, trace reading,
replays, report and plot included):

* **one node** (wall and CPU seconds): ``kvoffload simulate --policies lru --no-plot`` (the
  manager's LRU decisions, :mod:`kvoffload.simulate.lru_replay`; Belady and the infinite cache
  beside it; tables, CSV and JSON but no PNG, as ``kvcache-simulator`` draws none) at 8 host
  capacities against ``kvcache-simulator run --policies lru,optimal`` (KVCache.AI's simulator
  from PyPI, C++ core) at the same 8 capacities in GiB, same trace and block size, alternated
  ``--rounds`` times in the same run; the ratio of their medians is the figure. The same
  ``kvoffload`` command with the plot is timed in each round too; then the CPU seconds of its
  parts, one at a time in one process (:func:`breakdown`);
* **fleet**: ``kvoffload simulate --replicas`` with the given replicas, routings, host and tier
  capacities, once.

``kvcache-simulator`` is not a dependency: install it into a scratch virtual environment and pass
its executable (``--kvcache-simulator /tmp/venv/bin/kvcache-simulator``). Results are written as the
``simulate`` section of ``--out`` (JSON).

    python bench/bench_simulate.py --trace conversation_trace.jsonl --kvcache-simulator /tmp/v/bin/kvcache-simulator
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance  # noqa: E402

CAPACITIES_MTOK = (0.5, 1, 2, 3, 5, 10, 20, 50)
BYTES_PER_TOKEN = 131072  # the 8b shape, = kvcache-simulator's llama-3.1-8b at bf16


def _timed(cmd: list[str], cpu: list[float] | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of ``cmd``; its CPU seconds (user + system, children included)
    appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall, done.stdout


def _load() -> float:
    return os.getloadavg()[0]


def one_node(trace: str, kvsim: str, rounds: int, jobs: int, block: int) -> dict[str, Any]:
    caps = ",".join(f"{c:g}Mtok" for c in CAPACITIES_MTOK)
    gib = ",".join(f"{c * 1e6 * BYTES_PER_TOKEN / 2**30:.2f}" for c in CAPACITIES_MTOK)
    ours, theirs, plotted, loads = [], [], [], []
    ours_cpu: list[float] = []
    theirs_cpu: list[float] = []
    lru_ours: list[str] = []
    lru_theirs: list[str] = []
    with tempfile.TemporaryDirectory() as out:
        kv = [sys.executable, "-m", "kvoffload", "simulate", "--trace", trace, "--replay", "cache"]
        kv += ["--policies", "lru", "--block-size", str(block), "--capacities", caps, "--jobs", str(jobs), "--out", out]
        ks = [kvsim, "run", "--trace", trace, "--model", "llama-3.1-8b", "--block-size", str(block)]
        ks += ["--budgets-gib", gib, "--policies", "lru,optimal", "--no-progress"]
        for _ in range(rounds):
            loads.append(_load())
            t, text = _timed(ks, theirs_cpu)
            theirs.append(t)
            lru_theirs = re.findall(r"GiB\s+[\d,]+\s+([\d.]+)%", text)
            t, _ = _timed([*kv, "--no-plot"], ours_cpu)
            ours.append(t)
            points = json.loads((Path(out) / "results.json").read_text())["points"]
            lru_ours = [f"{100 * p['hit_rate']:.1f}" for p in points]
            plotted.append(_timed(kv)[0])
    mo, mt = statistics.median(ours), statistics.median(theirs)
    return {
        "trace": Path(trace).name,
        "block_tokens": block,
        "capacities_mtok": list(CAPACITIES_MTOK),
        "jobs": jobs,
        "kvoffload_s": ours,
        "kvcache_simulator_s": theirs,
        "ratio_of_medians": mo / mt,
        "ratio_of_minimums": min(ours) / min(theirs),  # each side's least disturbed round
        "kvoffload_cpu_s": ours_cpu,
        "kvcache_simulator_cpu_s": theirs_cpu,
        "cpu_ratio_of_medians": statistics.median(ours_cpu) / statistics.median(theirs_cpu),
        "kvoffload_with_plot_s": plotted,
        "ratio_of_medians_with_plot": statistics.median(plotted) / mt,
        "load_average_before_each_round": loads,
        "lru_hit_pct_kvoffload": lru_ours,
        "lru_hit_pct_kvcache_simulator_last_half": lru_theirs,
    }


def breakdown(trace: str, block: int) -> dict[str, Any]:
    """CPU seconds of the one-node sweep's parts, one at a time in one process: importing what the
    command imports (a fresh interpreter), reading the trace, its block keys, each LRU replay (as the
    command runs it, :mod:`kvoffload.simulate.lru_replay`, and the same through the manager's calls),
    Belady's plan and runs, the infinite cache."""
    from kvoffload.simulate.block_trace import BlockTrace
    from kvoffload.simulate.cache_replay import replay_cache
    from kvoffload.simulate.mooncake import read_mooncake_trace
    from kvoffload.simulate.optimal import BeladyPlan, replay_belady, replay_infinite

    imports = (
        "import kvoffload.app.cli, kvoffload.simulate.cli, kvoffload.simulate.cache_cli, kvoffload.simulate.report"
    )
    import_cpu: list[float] = []
    _timed([sys.executable, "-c", imports], import_cpu)
    clock = time.process_time
    t = clock()
    reqs = read_mooncake_trace(trace)
    read_s = clock() - t
    t = clock()
    bt = BlockTrace.from_mooncake(reqs, 512, block)
    lists = bt.key_lists()
    keys_s = clock() - t
    caps = [int(c * 1e6) // block for c in CAPACITIES_MTOK]
    lru, lru_manager, belady = [], [], []
    for c in caps:
        t = clock()
        replay_cache(bt, "lru", c)
        lru.append(clock() - t)
        t = clock()
        replay_cache(bt, "lru", c, lists, manager=True)  # the same decisions, through CPUOffloadingManager
        lru_manager.append(clock() - t)
    t = clock()
    plan = BeladyPlan(bt)
    plan_s = clock() - t
    for c in caps:
        t = clock()
        replay_belady(plan, c)
        belady.append(clock() - t)
    t = clock()
    replay_infinite(bt)
    return {
        "import_cpu_s": import_cpu[0],
        "read_trace_cpu_s": read_s,
        "block_keys_cpu_s": keys_s,
        "lru_replay_cpu_s": lru,
        "lru_us_per_request": 1e6 * statistics.median(lru) / bt.num_requests,
        "lru_through_manager_cpu_s": lru_manager,
        "lru_through_manager_us_per_request": 1e6 * statistics.median(lru_manager) / bt.num_requests,
        "belady_plan_cpu_s": plan_s,
        "belady_cpu_s": belady,
        "belady_peak_held_blocks": plan.peak_held,
        "infinite_cpu_s": clock() - t,
        "requests": bt.num_requests,
    }


def fleet(trace: str, jobs: int, block: int, replicas: str, routings: str, hosts: str, tiers: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "kvoffload", "simulate", "--trace", trace, "--block-size", str(block)]
        cmd += ["--replicas", replicas, "--routing", routings, "--capacities", hosts, "--tier-capacity", tiers]
        cmd += ["--jobs", str(jobs), "--out", out]
        load = _load()
        t, _ = _timed(cmd)
        rows = len(json.loads((Path(out) / "fleet.json").read_text())["rows"])
    return {
        "replicas": replicas,
        "routings": routings,
        "host_capacities": hosts,
        "tier_capacities": tiers,
        "jobs": jobs,
        "fleets": rows,
        "wall_s": t,
        "load_average_before": load,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="Mooncake conversation trace (JSONL)")
    ap.add_argument("--kvcache-simulator", default=None, help="kvcache-simulator executable (scratch venv)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="kvoffload's --jobs (the cores)")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--fleet-replicas", default="8")
    ap.add_argument("--fleet-routings", default="random,least-loaded,session,kv-aware")
    ap.add_argument("--fleet-hosts", default="1Mtok,2Mtok,3Mtok")
    ap.add_argument("--fleet-tiers", default="20Mtok")
    ap.add_argument("--skip-fleet", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "simulate-speed.json"))
    args = ap.parse_args()
    result: dict[str, Any] = {"provenance": provenance(), "machine_cores": len(os.sched_getaffinity(0))}
    if args.kvcache_simulator:
        result["one_node"] = one_node(args.trace, args.kvcache_simulator, args.rounds, args.jobs, args.block_size)
        result["one_node"]["cpu_breakdown"] = breakdown(args.trace, args.block_size)
        print(json.dumps(result["one_node"], indent=1), flush=True)
    if not args.skip_fleet:
        result["fleet"] = fleet(
            args.trace, args.jobs, args.block_size, args.fleet_replicas, args.fleet_routings, args.fleet_hosts,
            args.fleet_tiers,
        )  # fmt: skip
        print(json.dumps(result["fleet"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
