"""``headstart``'s hit rates beside LRU, ARC, S3-FIFO, Belady's optimum and the infinite cache.

Run: ``python bench/bench_headstart.py [--trace mooncake_conversation_trace.jsonl] [--out PATH]``.

Runs ``kvoffload simulate --replay cache --policies lru,arc,s3fifo,headstart`` on the Mooncake
conversation trace at 512- and 32-token blocks (1M to 20M tokens; only with ``--trace``: the trace is
not part of the repository) and on every generated workload of the suite at 512-token blocks (its
default nine capacities), and writes, per run and capacity: each policy's share of prompt tokens
loaded, share of Belady's and ratio to LRU's hit tokens, and the worst and every "headstart minus
LRU" in points (default ``bench/results/headstart.json``). Hit rates do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from bench.common import provenance  # noqa: E402
from kvoffload.simulate.suite import SUITE  # noqa: E402

POLICIES = ("lru", "arc", "s3fifo", "headstart")
MOONCAKE_CAPACITIES = "1Mtok,2Mtok,3Mtok,5Mtok,10Mtok,20Mtok"


def simulate(args: list[str], out: Path) -> dict[str, Any]:
    """``kvoffload simulate ARGS`` (cache-level replay, the four policies) into ``out``; its results."""
    cmd = [sys.executable, "-m", "kvoffload", "simulate", *args, "--replay", "cache"]
    cmd += ["--policies", ",".join(POLICIES), "--no-plot", "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def rows_of(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per capacity: Belady's and the infinite cache's share of prompt tokens, and each policy's."""
    inf = res["infinite"]["hit_rate"] if isinstance(res["infinite"], dict) else res["infinite"][0]["hit_rate"]
    belady = {p["cpu_blocks"]: p for p in res["belady"]}
    points = {(p["policy"], p["cpu_blocks"]): p for p in res["points"]}
    rows = []
    for blocks in res["sweep"]["capacities_blocks"]:
        lru_hit = points[("lru", blocks)]["cpu_hit_tokens"]
        row: dict[str, Any] = {
            "blocks": blocks,
            "tokens": belady[blocks]["cpu_tokens"],
            "belady": round(belady[blocks]["hit_rate"], 4),
            "infinite": round(inf, 4),
        }
        for policy in POLICIES:
            p = points[(policy, blocks)]
            row[policy] = {
                "hit_rate": round(p["hit_rate"], 4),
                "share_of_belady": round(p["share_of_belady"], 3) if p["share_of_belady"] is not None else None,
                "x_lru": round(p["cpu_hit_tokens"] / lru_hit, 3) if lru_hit else None,
            }
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="the Mooncake conversation trace (JSONL); without it, the suite only")
    parser.add_argument("--out", default=str(_HERE / "results" / "headstart.json"))
    args = parser.parse_args(argv)
    runs: dict[str, Any] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        jobs: list[tuple[str, list[str], str]] = []
        if args.trace:
            name = Path(args.trace).name
            for bs in (512, 32):
                jobs.append(
                    (
                        f"mooncake-conversation-{bs}",
                        ["--trace", args.trace, "--block-size", str(bs), "--capacities", MOONCAKE_CAPACITIES],
                        f"kvoffload simulate --trace {name} --block-size {bs}",
                    )
                )
        for workload in SUITE:
            jobs.append(
                (
                    f"suite-{workload}-512",
                    ["--suite", workload, "--block-size", "512"],
                    f"kvoffload simulate --suite {workload} --block-size 512",
                )
            )
        for run, sim_args, shown in jobs:
            res = simulate(sim_args, Path(tmp) / run)
            extra = f" --capacities {MOONCAKE_CAPACITIES}" if run.startswith("mooncake") else ""
            source = res["sweep"]["source"]
            if args.trace:
                source = source.replace(args.trace, Path(args.trace).name)
            runs[run] = {
                "command": f"{shown} --replay cache{extra} --policies {','.join(POLICIES)}",
                "source": source,
                "rows": rows_of(res),
            }
            shares = [r["headstart"]["share_of_belady"] for r in runs[run]["rows"]]
            print(f"{run}: headstart share of Belady {shares}", flush=True)
    diffs = sorted(
        (round((r["headstart"]["hit_rate"] - r["lru"]["hit_rate"]) * 100, 2), run, r["blocks"])
        for run, v in runs.items()
        for r in v["rows"]
    )
    result = {
        "what": "headstart vs lru/arc/s3fifo, Belady's optimum and the infinite cache (cache-level replay); per "
        "capacity: share of prompt tokens loaded, share of Belady's, ratio to LRU's hit tokens",
        "command": "python bench/bench_headstart.py" + (f" --trace {Path(args.trace).name}" if args.trace else ""),
        "seconds": round(time.perf_counter() - t0, 1),
        "provenance": provenance(),
        "runs": runs,
        "headstart_minus_lru_points_worst": list(diffs[0]),
        "headstart_minus_lru_points_all": [list(d) for d in diffs],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
