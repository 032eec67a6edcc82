"""Benchmark: scheduler-side cost per engine step of vLLM's OffloadingConnector, kvoffload's manager
vs vLLM's own ``CPUOffloadingManager``.

Run: ``python bench/bench_vllm.py [--quick]`` in a venv with vLLM (``make test-vllm`` builds
``.venv-vllm``), or ``python -m kvoffload bench --only vllm``. Writes the ``vllm`` section of
``bench/results/<machine>-vllm.json`` (unless ``--no-write``).

Setting: vLLM's real ``Scheduler`` and ``OffloadingConnector`` in both roles on CPU tensors
(``kvoffload.integrations.vllm.harness``), a trace of multi-turn conversations sharing a system
prompt (each turn's prompt extends the previous turn's), a GPU cache too small to keep them, so
turns hit the CPU tier; eviction pressure on the CPU tier too. The same trace runs twice in the
same process, once with kvoffload's ``KVOffloadManager`` behind the connector and once with
vLLM's ``CPUOffloadingManager`` swapped in (same policy, same capacity; the worker side is the
same). Timed: the scheduler-role connector calls of each step (``get_num_new_matched_tokens``,
``update_state_after_alloc``, ``build_connector_meta``, ``update_connector_output``,
``request_finished``), which is where the manager is called, and inside them the manager's own
calls (both managers behind the same timing wrapper). Reported: µs per engine step for both
(alternating runs, best of three each) and their ratios (kvoffload / vLLM; below 1 is faster).
Both runs must produce the same tokens and the same number of CPU-tier loads, else the
comparison is void (asserted).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

_MANAGER_CALLS = (
    "lookup",
    "prepare_load",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_new_request",
    "on_request_finished",
    "take_events",
    "touch",
)
_TIMED = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
)


def _trace(conversations: int, turns: int) -> list[list[tuple[str, list[int]]]]:
    """Waves of (request id, prompt): wave t holds turn t of every conversation."""
    system = [(i * 37) % 997 + 1 for i in range(32)]
    waves = []
    history = {c: list(system) for c in range(conversations)}
    for t in range(turns):
        wave = []
        for c in range(conversations):
            history[c] += [(c * 131 + t * 17 + i * 7) % 997 + 1 for i in range(24)]
            wave.append((f"c{c}t{t}", list(history[c])))
        waves.append(wave)
    return waves


def _time_calls(obj: Any, names: tuple[str, ...], acc: list[float]) -> None:
    """Wrap the methods ``names`` of ``obj`` so that their wall time adds up in ``acc[0]``."""
    for name in names:
        fn = getattr(obj, name)

        def timed(*a: Any, _fn: Any = fn, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                acc[0] += time.perf_counter() - t0

        setattr(obj, name, timed)


def _run_once(waves: list[list[tuple[str, list[int]]]], use_vllm_manager: bool, policy: str) -> dict[str, Any]:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvoffload.integrations.vllm.harness import PAGE, Engine

    chunks = 512
    extra = {
        "spec_name": "KVOffloadSpec",
        "spec_module_path": "kvoffload.integrations.vllm",
        "cpu_bytes_to_use": chunks * PAGE,
        "eviction_policy": policy,
        "kernel_backend": "torch",
    }
    e = Engine(extra, num_gpu_blocks=48)
    sched = e.connector.connector_scheduler
    if use_vllm_manager:
        sched.manager = CPUOffloadingManager(chunks, cache_policy=policy)
    spent = [0.0]
    in_manager = [0.0]
    _time_calls(sched.manager, _MANAGER_CALLS, in_manager)
    _time_calls(e.connector, _TIMED, spent)
    gc.collect()
    for wave in waves:
        for rid, prompt in wave:
            e.add(rid, prompt, max_tokens=4)
        while e.scheduler.has_unfinished_requests():
            e.step()
    e.drain()
    steps = e.steps
    return {
        "steps": steps,
        "connector_s": spent[0],
        "us_per_step": spent[0] / steps * 1e6,
        "manager_us_per_step": in_manager[0] / steps * 1e6,
        "loads": e.worker.counts["loads"],
        "stores": e.worker.counts["stores"],
        "outputs": e.outputs,
    }


def run(quick: bool = False) -> dict[str, Any]:
    import vllm

    conversations, turns = (8, 3) if quick else (16, 5)
    waves = _trace(conversations, turns)
    out: dict[str, Any] = {"vllm_version": vllm.__version__, "conversations": conversations, "turns": turns}
    rows = []
    for policy in ("lru", "arc"):
        runs = [_run_once(waves, use_vllm, policy) for _ in range(3) for use_vllm in (False, True)]
        ours = min(runs[0::2], key=lambda r: r["us_per_step"])  # alternated, best of 3 each
        theirs = min(runs[1::2], key=lambda r: r["us_per_step"])
        assert ours["outputs"] == theirs["outputs"], "the two runs produced different tokens"
        assert ours["loads"] == theirs["loads"], (ours["loads"], theirs["loads"])
        row = {
            "policy": policy,
            "steps": ours["steps"],
            "cpu_tier_loads": ours["loads"],
            "stores": ours["stores"],
            "kvoffload_us_per_step": round(ours["us_per_step"], 1),
            "vllm_us_per_step": round(theirs["us_per_step"], 1),
            "ratio": round(ours["us_per_step"] / theirs["us_per_step"], 3),
            "kvoffload_manager_us_per_step": round(ours["manager_us_per_step"], 1),
            "vllm_manager_us_per_step": round(theirs["manager_us_per_step"], 1),
            "manager_ratio": round(ours["manager_us_per_step"] / theirs["manager_us_per_step"], 3),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    out["rows"] = rows
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    result = run(quick=args.quick)
    if not args.no_write:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench import common

        out = common.results_path()
        path = out.with_name(out.stem + "-vllm.json")
        print(f"results: {common.write_section('vllm', result, path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
