"""A/B of two versions of kvoffload's manager inside one process, on the manager calls of a ``bench_vllm`` run.

Run: ``python bench/bench_vllm_ab.py --against REV [--setting NAME ...] [--policy lru --policy arc]
[--repeats N]`` in a venv with vLLM, from a checkout. ``REV`` is a git revision (a branch, a commit)
of this repository. Prints; writes nothing.

Why: timing two checkouts one after the other on a shared machine mixes the change with the
machine's drift (tens of percent here). This loads both versions in one process -- this checkout's
``kvoffload`` (A) and ``REV``'s, extracted with ``git archive`` into a temporary directory and
renamed ``kvoffload_b`` (B; its absolute imports rewritten) -- records one engine run's manager
calls with A behind vLLM's real connector (:func:`bench.bench_vllm_replay.record`), then replays
them on a fresh A, a fresh B and vLLM's own ``CPUOffloadingManager`` (V), alternated, ``--repeats``
times, the collector off, best of the repeats, overall and per method. Both versions must decide
the same (the calls recorded with A are replayed on B). A control run with ``--against HEAD``
shows the harness's own spread (B/A near 1).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import bench_vllm, bench_vllm_replay  # noqa: E402
from bench.revision import extract_as_b  # noqa: E402


def compare(setting: str, policy: str, repeats: int, managers: dict[str, Any]) -> None:
    """Print the best replay of each manager class and, for A and B, each method's time per call."""
    calls = bench_vllm_replay.record(setting, policy)
    chunks = bench_vllm.SETTINGS[setting].chunks
    gc.collect()
    gc.freeze()
    best: dict[str, float] = {}
    per: dict[tuple[str, str], float] = {}
    for _ in range(repeats):
        for who, cls in managers.items():
            dt = bench_vllm_replay.replay(calls, cls(chunks, cache_policy=policy), False)
            best[who] = min(dt, best.get(who, dt))
            if who != "V":
                spent = bench_vllm_replay.replay_per_method(calls, cls(chunks, cache_policy=policy))
                for name, d in spent.items():
                    per[who, name] = min(d, per.get((who, name), d))
    gc.unfreeze()
    a, b, v = best["A"], best["B"], best["V"]
    print(f"{setting} {policy}: A {a * 1e3:.1f} ms, B {b * 1e3:.1f} ms, V {v * 1e3:.1f} ms | "
          f"A/V {a / v:.3f}  B/V {b / v:.3f}  B/A {b / a:.3f}")  # fmt: skip
    counts: dict[str, int] = {}
    for name, _ in calls:
        counts[name] = counts.get(name, 0) + 1
    for name, n in sorted(counts.items()):
        ta, tb = per["A", name] * 1e6 / n, per["B", name] * 1e6 / n
        print(f"  {name:22s} {n:6d} calls  A {ta:8.2f}  B {tb:8.2f} us/call  B/A {tb / ta:.2f}")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="git revision of B (A: this checkout)")
    ap.add_argument("--setting", action="append", choices=sorted(bench_vllm.SETTINGS), help="repeatable")
    ap.add_argument("--policy", action="append", choices=("lru", "arc"), help="repeatable (default both)")
    ap.add_argument("--repeats", type=int, default=7, help="replays per manager (best counts)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        extract_as_b(args.against, Path(tmp))
        sys.path.insert(1, tmp)
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        from kvoffload.integrations.vllm import KVOffloadManager

        b_module = __import__("kvoffload_b.integrations.vllm", fromlist=["KVOffloadManager"])
        managers = {"A": KVOffloadManager, "B": b_module.KVOffloadManager, "V": CPUOffloadingManager}
        for setting in args.setting or bench_vllm.DEFAULT:
            for policy in args.policy or ("lru", "arc"):
                compare(setting, policy, args.repeats, managers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
