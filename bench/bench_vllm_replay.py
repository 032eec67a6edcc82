"""Benchmark: the manager calls of a ``bench_vllm`` run, replayed on kvoffload's manager and on
vLLM's own ``CPUOffloadingManager``, alternated -- the managers alone, without the engine around them.

Run: ``python bench/bench_vllm_replay.py [--setting NAME ...] [--repeats N]`` in a venv with vLLM.
Writes the ``vllm_replay`` section of ``bench/results/<machine>-vllm.json`` (unless ``--no-write``).

One run of :mod:`bench.bench_vllm`'s engine per setting and policy (kvoffload's manager behind
vLLM's real connector) records every call its connector made to the manager (method, keys, the
request's own ``ReqContext``, which carries the token positions vLLM's manager reads at a request's
end). The calls are then replayed, ``--repeats`` times each, alternating a fresh
``KVOffloadManager`` and a fresh vLLM ``CPUOffloadingManager`` of the same capacity and policy
(both make the same decisions: ``bench_vllm`` asserts it); the figure is the process CPU time of a
replay (``time.process_time``: time the process was descheduled by other load does not count),
best of the repeats, once with the garbage collector running (the recorded calls frozen out of its
scans, as vLLM freezes its start-up heap) and once with it disabled; ``evictions``: the blocks
kvoffload's manager evicted in a replay (its counters). ``--per-method`` adds, per
manager method, its calls and the best wall time of each manager in it (separate replays, each
call timed, the collector disabled: the timer adds about 0.1 us a call to both).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import bench_vllm  # noqa: E402

Calls = list[tuple[str, list[Any]]]


def record(setting: str, policy: str) -> Calls:
    """The manager calls of one engine run with kvoffload's manager (arguments as passed)."""
    calls: Calls = []
    timed = bench_vllm._time_calls

    def recording(obj: Any, names: tuple[str, ...], acc: list[float]) -> None:
        if names is not bench_vllm._MANAGER_CALLS:
            timed(obj, names, acc)
            return
        for name in names:
            fn = getattr(obj, name)

            def rec(*a: Any, _fn: Any = fn, _name: str = name) -> Any:
                calls.append((_name, [list(x) if isinstance(x, (list, tuple)) else x for x in a]))
                return _fn(*a)

            setattr(obj, name, rec)

    s = bench_vllm.SETTINGS[setting]
    bench_vllm._time_calls = recording  # type: ignore[assignment]
    try:
        bench_vllm._run_once(s, bench_vllm._trace(s), False, policy)
    finally:
        bench_vllm._time_calls = timed
    return calls


def replay(calls: Calls, manager: Any, collect: bool) -> float:
    """CPU seconds to make ``calls`` on ``manager`` (the collector off unless ``collect``)."""
    fns = {name: getattr(manager, name) for name in {c[0] for c in calls}}
    if not collect:
        gc.disable()
    t0 = time.process_time()
    for name, args in calls:
        fns[name](*args)
    dt = time.process_time() - t0
    gc.enable()
    return dt


def replay_per_method(calls: Calls, manager: Any) -> dict[str, float]:
    """Wall seconds spent in each method while making ``calls`` on ``manager`` (collector off)."""
    fns = {name: getattr(manager, name) for name in {c[0] for c in calls}}
    spent = dict.fromkeys(fns, 0.0)
    clock = time.perf_counter
    gc.disable()
    for name, args in calls:
        t0 = clock()
        fns[name](*args)
        spent[name] += clock() - t0
    gc.enable()
    return spent


def run(
    settings: tuple[str, ...], repeats: int, policies: tuple[str, ...] = ("lru", "arc"), per_method: bool = False
) -> dict[str, Any]:
    import vllm
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvoffload.integrations.vllm import KVOffloadManager

    rows = []
    for setting in settings:
        chunks = bench_vllm.SETTINGS[setting].chunks
        for policy in policies:
            calls = record(setting, policy)
            gc.collect()
            gc.freeze()
            make = {
                "kvoffload": lambda: KVOffloadManager(chunks, cache_policy=policy),  # noqa: B023
                "vllm": lambda: CPUOffloadingManager(chunks, cache_policy=policy),  # noqa: B023
            }
            best: dict[tuple[str, bool], float] = {}
            for collect in (True, False):
                for _ in range(repeats):
                    for who in ("kvoffload", "vllm"):
                        dt = replay(calls, make[who](), collect)
                        best[who, collect] = min(dt, best.get((who, collect), dt))
            methods: dict[str, dict[str, float]] = {}
            if per_method:
                for _ in range(repeats):
                    for who in ("kvoffload", "vllm"):
                        for name, dt in replay_per_method(calls, make[who]()).items():
                            m = methods.setdefault(name, {"calls": sum(1 for c in calls if c[0] == name)})
                            m[f"{who}_ms"] = round(min(dt * 1e3, m.get(f"{who}_ms", dt * 1e3)), 3)
                for m in methods.values():
                    m["ratio"] = round(m["kvoffload_ms"] / m["vllm_ms"], 3) if m["vllm_ms"] else 0.0
            counted = make["kvoffload"]()
            replay(calls, counted, False)
            gc.unfreeze()
            row = {"setting": setting, "policy": policy, "calls": len(calls)}
            row["evictions"] = counted.core.get_stats().evictions  # blocks the replay evicted
            for collect, tag in ((True, ""), (False, "_no_gc")):
                ours, theirs = best["kvoffload", collect], best["vllm", collect]
                row[f"kvoffload_ms{tag}"] = round(ours * 1e3, 2)
                row[f"vllm_ms{tag}"] = round(theirs * 1e3, 2)
                row[f"ratio{tag}"] = round(ours / theirs, 3)
            if methods:
                row["methods"] = dict(sorted(methods.items()))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"vllm_version": vllm.__version__, "repeats": repeats, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", action="append", choices=sorted(bench_vllm.SETTINGS), help="repeatable")
    ap.add_argument("--repeats", type=int, default=15, help="replays per manager (best counts)")
    ap.add_argument("--per-method", action="store_true", help="also each manager method's time (separate replays)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(tuple(args.setting or bench_vllm.DEFAULT), args.repeats, per_method=args.per_method)
    if not args.no_write:
        bench_vllm.write_section("vllm_replay", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
