"""Benchmark: scheduler-side cost per engine step of vLLM's OffloadingConnector, kvoffload's manager
vs vLLM's own ``CPUOffloadingManager``.

Run: ``python bench/bench_vllm.py [--setting NAME ...] [--repeats N] [--quick]`` in a venv with
vLLM (``make test-vllm`` builds ``.venv-vllm``), or ``python -m kvoffload bench --only vllm``.
Writes the ``vllm`` section of ``bench/results/<machine>-vllm.json`` (unless ``--no-write``).

Engine: vLLM's real ``Scheduler`` and ``OffloadingConnector`` in both roles on CPU tensors
(``tests/integrations/vllm_harness.py``, its model writing no KV here), kvoffload's spec with its
``KVOffloadManager`` behind the connector, or the same spec with vLLM's ``CPUOffloadingManager``
swapped in (same policy, same capacity; the worker side is the same). The realistic settings give
each GPU block a 32-byte page (:func:`_shape`: 1 KV head of 1 channel, fp8): the worker still runs
every store and load through kvoffload's torch data path, but its CPU copies and the KV tensors
cost little; the scheduler side sees blocks and chunks, not bytes, so what is timed is the same as
with a model-sized page (the pool holds the setting's number of chunks whatever the page).

Workload: multi-turn conversations, each opening with one of a few shared system prompts, each
turn's prompt extending the previous turn's (its earlier turns are a shared prefix), more
conversations than the engine runs at once so that earlier turns leave the GPU cache and come back
from the CPU tier. At the two realistic settings the CPU pool holds every chunk the run stores (it
never fills: nothing is evicted), so what is timed is lookups, loads, stores, completions and
request ends; the evicting setting runs the first one's engine and conversations with a fifth of
its pool, so that about half of its ``prepare_store`` calls evict (fewer turns come back from the
CPU tier).
Settings (:data:`SETTINGS`; without ``--setting`` only ``64req-1e4`` runs, ``--setting 64req-1e4
--setting 256req-1e5`` runs both realistic ones, :data:`EVICTING` the evicting one):

* ``64req-1e4``: 16-token GPU blocks, 64 concurrent requests of 160 conversations, prompts of
  2k-8k tokens, a CPU pool of 10^4 chunks;
* ``256req-1e5``: 16-token GPU blocks, 256 concurrent requests of 640 conversations, prompts of
  2k-32k tokens, a CPU pool of 10^5 chunks;
* ``64req-2048``: ``64req-1e4`` with a CPU pool of 2,048 chunks (it peaks at about 4,200 there);
* ``small`` (``--quick``): the small trace (4-token blocks, 8 conversations of 3 short turns), its
  KV written and checked every step.

The realistic settings offload chunks of 256 tokens, so that the CPU pool is larger than the GPU
cache that runs the concurrent requests, as in a deployment: with 16-token chunks a 10^4-chunk
pool would be a third of that GPU cache and nothing would come back from it.

Timed: the scheduler-role connector calls (``on_new_request``, from the scheduler's
``add_request``, and each step's ``get_num_new_matched_tokens``, ``update_state_after_alloc``,
``build_connector_meta``, ``update_connector_output``, ``request_finished``), which is where the
manager is called, and inside them the manager's own calls (both managers behind the same timing
wrapper). Reported per setting and policy (LRU, ARC): µs per engine step for both and their ratios
(kvoffload / vLLM; below 1 is faster) and the blocks kvoffload's manager evicted (``evictions``, from its
counters), the two runs alternated (which one runs first swaps every
repeat), best of ``--repeats`` each (default 1 for the realistic settings, 3 for the small trace).
Each repeat is 4 runs (2 managers x 2 policies); on a 2-core machine 64req-1e4 takes about 3 s per
run (20 s in all at ``--repeats 1``), 256req-1e5 about 30 s per run (2 minutes in all), mostly
vLLM's own request hashing and scheduling, which are not timed. Both runs must produce the same
tokens and the same CPU-tier loads, else the comparison is void (asserted). Every manager call is
made inside a timed connector call, so the time the connector spends outside the manager's calls
(``*_outside_manager_us_per_step``) is vLLM's own connector code. Once the engine is built the GC
heap is frozen (``gc.freeze``), as vLLM's ``EngineCore`` does after start-up, so that collections
during the run do not rescan the engine's start-up objects. A garbage collection runs inside
whichever call allocates when the collector's counter is due, mostly on the engine's own garbage
(a request's block hashes); the time of the collections that ran inside the timed calls is
reported beside each figure (``*_gc_us_per_step``), and is part of it; ``*_no_gc`` are the
figures and ratios without it (kvoffload's manager allocates little, so the engine's garbage is
mostly collected in the connector's own code when it runs, and inside vLLM's manager calls when
that one runs: the connector's time outside the manager's calls differs mostly by where they
land; compare ``*_outside_manager_no_gc_us_per_step``).
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

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
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
)


@dataclass(frozen=True)
class Setting:
    """One benchmark setting: the engine's shape and the conversations it serves."""

    name: str
    block_size: int  # tokens per GPU block (= per CPU chunk)
    concurrent: int  # requests the engine runs at once (vLLM's max_num_seqs)
    conversations: int  # more than ``concurrent``: earlier turns leave the GPU cache
    turns: int
    system_prompts: int  # distinct system prompts, shared round-robin by the conversations
    system_tokens: int
    first_turn_tokens: int  # tokens the first turn adds to the system prompt
    turn_tokens: int  # tokens each later turn adds to the conversation's prompt
    reply_tokens: int  # tokens generated per turn
    chunks: int  # CPU pool size in chunks
    chunk_tokens: int  # tokens per CPU chunk (offloaded block): a multiple of block_size
    gpu_blocks: int
    max_batched_tokens: int
    small_trace: bool = False  # the original small trace, its KV written and checked every step

    @property
    def max_prompt(self) -> int:
        return self.system_tokens + self.first_turn_tokens + (self.turns - 1) * self.turn_tokens


# prompts 2k, 4k, 6k, 8k tokens; pool 2.6M tokens, GPU cache 0.54M
_64REQ = Setting("64req-1e4", 16, 64, 160, 4, 4, 1536, 512, 2048, 8, 10_000, 256, 64 * 530, 8192)
SETTINGS = {
    "small": Setting("small", 4, 16, 8, 3, 1, 32, 24, 24, 4, 512, 4, 48, 64, small_trace=True),
    "64req-1e4": _64REQ,
    # the same with a fifth of the pool: about half of the stores evict
    "64req-2048": replace(_64REQ, name="64req-2048", chunks=2_048),
    # prompts 2k, 9.6k, 17k, 24.6k, 32k tokens; pool 25.6M tokens, GPU cache 8.4M
    "256req-1e5": Setting("256req-1e5", 16, 256, 640, 5, 8, 1536, 512, 7552, 8, 100_000, 256, 256 * 2060, 16384),
}
REALISTIC = ("64req-1e4", "256req-1e5")
#: the realistic engine with a CPU pool that fills (every ``prepare_store`` past it evicts)
EVICTING = ("64req-2048",)
#: what a run without ``--setting`` measures (about 20 s on a 2-core machine; 256req-1e5 about 2 minutes)
DEFAULT = ("64req-1e4",)


def _trace(s: Setting) -> list[list[tuple[str, list[int]]]]:
    """Waves of (request id, prompt): wave t holds turn t of every conversation. The small setting
    keeps the original trace (one system prompt, deterministic turn tokens)."""
    rng = np.random.default_rng(7)
    systems = [rng.integers(1, 997, s.system_tokens).tolist() for _ in range(s.system_prompts)]
    if s.small_trace:
        systems = [[(i * 37) % 997 + 1 for i in range(s.system_tokens)]]
    history = {c: list(systems[c % s.system_prompts]) for c in range(s.conversations)}
    waves = []
    for t in range(s.turns):
        wave = []
        for c in range(s.conversations):
            if s.small_trace:
                history[c] += [(c * 131 + t * 17 + i * 7) % 997 + 1 for i in range(s.turn_tokens)]
            else:
                n = s.first_turn_tokens if t == 0 else s.turn_tokens
                history[c] += rng.integers(1, 997, n).tolist()
            wave.append((f"c{c}t{t}", list(history[c])))
        waves.append(wave)
    return waves


def _shape(s: Setting) -> Any:
    """The engine's :class:`~tests.integrations.vllm_harness.Shape` for ``s``: the harness's KV for
    the small trace (its bytes are written and checked every step), else the smallest page the
    harness and kvoffload's data path take (1 head of 1 channel of a 1-byte dtype: 32 bytes per
    16-token block; ``ROOT`` must be on ``sys.path``)."""
    import torch

    from tests.integrations.vllm_harness import Shape

    shape = Shape(
        block_size=s.block_size,
        max_len=max(256, s.max_prompt + s.reply_tokens + s.block_size),
        max_num_seqs=s.concurrent,
        max_num_batched_tokens=s.max_batched_tokens,
    )
    if s.small_trace:
        return shape
    return replace(shape, kv_heads=1, head_dim=1, kv_dtype=torch.float8_e4m3fn)


#: the accumulators of the timed calls in progress; the collector's time inside them adds to ``acc[1]``
_OPEN: list[list[float]] = []
_GC_START = [0.0]


def _gc_phase(phase: str, info: dict[str, Any]) -> None:
    """``gc.callbacks`` hook: a collection's time counts as GC time of every timed call in progress."""
    if phase == "start":
        _GC_START[0] = time.perf_counter()
    elif _OPEN:
        dt = time.perf_counter() - _GC_START[0]
        for acc in _OPEN:
            acc[1] += dt


def _time_calls(obj: Any, names: tuple[str, ...], acc: list[float]) -> None:
    """Wrap the methods ``names`` of ``obj``: their wall time adds up in ``acc[0]``, the garbage
    collections that run inside them (whoever allocated the garbage) in ``acc[1]``."""
    for name in names:
        fn = getattr(obj, name)

        def timed(*a: Any, _fn: Any = fn, **kw: Any) -> Any:
            _OPEN.append(acc)
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                acc[0] += time.perf_counter() - t0
                _OPEN.pop()

        setattr(obj, name, timed)


def _run_once(
    s: Setting, waves: list[list[tuple[str, list[int]]]], use_vllm_manager: bool, policy: str
) -> dict[str, Any]:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.integrations.vllm_harness import Engine

    shape = _shape(s)
    extra = {
        "spec_name": "KVOffloadSpec",
        "spec_module_path": "kvoffload.integrations.vllm",
        # a chunk's row is rounded up to whole OS pages (as vLLM's CPU spec does): s.chunks rows
        "cpu_bytes_to_use": s.chunks
        * -(-shape.page * (s.chunk_tokens // s.block_size) // mmap.PAGESIZE)
        * mmap.PAGESIZE,
        "eviction_policy": policy,
        "kernel_backend": "torch",
    }
    if s.chunk_tokens != s.block_size:
        extra["block_size"] = s.chunk_tokens
    e = Engine(extra, num_gpu_blocks=s.gpu_blocks, shape=shape, check_kv=s.small_trace)
    sched = e.connector.connector_scheduler
    assert e.worker.transfer_worker.host_pool.num_slots == s.chunks, "the pool must hold the setting's chunks"
    if use_vllm_manager:
        sched.manager = CPUOffloadingManager(s.chunks, cache_policy=policy)
    spent = [0.0, 0.0]
    in_manager = [0.0, 0.0]
    _time_calls(sched.manager, _MANAGER_CALLS, in_manager)
    _time_calls(e.connector, _TIMED, spent)
    gc.collect()
    gc.freeze()  # as vLLM's EngineCore does once the engine is built: start-up objects leave the GC's scans
    gc.callbacks.append(_gc_phase)
    t0 = time.perf_counter()
    for wave in waves:
        for rid, prompt in wave:
            e.add(rid, prompt, max_tokens=s.reply_tokens)
        while e.scheduler.has_unfinished_requests():
            e.step()
    e.drain()
    wall = time.perf_counter() - t0
    steps = e.steps
    out = {
        "steps": steps,
        "wall_s": wall,
        "connector_s": spent[0],
        "us_per_step": spent[0] / steps * 1e6,
        "manager_us_per_step": in_manager[0] / steps * 1e6,
        "gc_us_per_step": spent[1] / steps * 1e6,
        "manager_gc_us_per_step": in_manager[1] / steps * 1e6,
        "page_bytes": shape.page,
        "loads": e.worker.counts["loads"],
        "stores": e.worker.counts["stores"],
        # blocks kvoffload's manager evicted (its counters; vLLM's manager counts none)
        "evictions": None if use_vllm_manager else sched.manager.core.get_stats().evictions,
        "outputs": e.outputs,
    }
    gc.callbacks.remove(_gc_phase)
    gc.unfreeze()
    del e, sched
    gc.collect()
    return out


def _no_gc(run: dict[str, Any], prefix: str = "") -> float:
    """A run's µs per step in the connector's calls (``prefix`` ``"manager_"``: the manager's) less
    the collections that ran inside them."""
    return float(run[f"{prefix}us_per_step"] - run[f"{prefix}gc_us_per_step"])


def run_setting(s: Setting, repeats: int, policies: tuple[str, ...] = ("lru", "arc")) -> list[dict[str, Any]]:
    """Rows for ``s``: per policy, kvoffload's manager and vLLM's alternated, best of ``repeats``."""
    waves = _trace(s)
    rows = []
    for policy in policies:
        # alternated, the first of each pair swapped every repeat (no manager always runs first)
        order = [use_vllm for i in range(repeats) for use_vllm in ((False, True) if i % 2 == 0 else (True, False))]
        runs = [_run_once(s, waves, use_vllm, policy) for use_vllm in order]
        ours = min((r for r, v in zip(runs, order, strict=True) if not v), key=lambda r: r["us_per_step"])
        theirs = min((r for r, v in zip(runs, order, strict=True) if v), key=lambda r: r["us_per_step"])
        for r in runs[1:]:  # every run, not only the best ones, must agree
            assert r["outputs"] == runs[0]["outputs"], "two runs produced different tokens"
            assert r["loads"] == runs[0]["loads"], ("two runs loaded differently", r["loads"], runs[0]["loads"])
        row = {
            "setting": s.name,
            "policy": policy,
            "steps": ours["steps"],
            "cpu_tier_loads": ours["loads"],
            "stores": ours["stores"],
            "evictions": ours["evictions"],
            "kvoffload_us_per_step": round(ours["us_per_step"], 1),
            "vllm_us_per_step": round(theirs["us_per_step"], 1),
            "ratio": round(ours["us_per_step"] / theirs["us_per_step"], 3),
            "kvoffload_manager_us_per_step": round(ours["manager_us_per_step"], 1),
            "vllm_manager_us_per_step": round(theirs["manager_us_per_step"], 1),
            "manager_ratio": round(ours["manager_us_per_step"] / theirs["manager_us_per_step"], 3),
            # vLLM's own connector code around the manager's calls (the same code for both managers)
            "kvoffload_outside_manager_us_per_step": round(ours["us_per_step"] - ours["manager_us_per_step"], 1),
            "vllm_outside_manager_us_per_step": round(theirs["us_per_step"] - theirs["manager_us_per_step"], 1),
            # of which garbage collections that ran inside the timed calls (the engine's garbage too)
            "kvoffload_gc_us_per_step": round(ours["gc_us_per_step"], 1),
            "vllm_gc_us_per_step": round(theirs["gc_us_per_step"], 1),
            "kvoffload_manager_gc_us_per_step": round(ours["manager_gc_us_per_step"], 1),
            "vllm_manager_gc_us_per_step": round(theirs["manager_gc_us_per_step"], 1),
            # the same without the collections (whose garbage is mostly the engine's, and which land
            # in whichever call allocates when the collector is due)
            "ratio_no_gc": round(_no_gc(ours) / _no_gc(theirs), 3),
            "manager_ratio_no_gc": round(_no_gc(ours, "manager_") / _no_gc(theirs, "manager_"), 3),
            "kvoffload_outside_manager_no_gc_us_per_step": round(_no_gc(ours) - _no_gc(ours, "manager_"), 1),
            "vllm_outside_manager_no_gc_us_per_step": round(_no_gc(theirs) - _no_gc(theirs, "manager_"), 1),
            "run_wall_s": round(min(r["wall_s"] for r in runs), 1),
            "gpu_page_bytes": runs[0]["page_bytes"],
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def compare_policies(s: Setting, repeats: int, policies: tuple[str, ...]) -> list[dict[str, Any]]:
    """kvoffload's manager alone, one run per policy alternated, best of ``repeats``: µs per step
    in the manager's calls and in the timed connector calls, each relative to the first policy's
    (the cost of a policy inside vLLM; the policies may load differently, so tokens are not compared)."""
    waves = _trace(s)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for _ in range(repeats):
        for p in policies:
            runs[p].append(_run_once(s, waves, False, p))
    best = {p: min(rs, key=lambda r: r["manager_us_per_step"]) for p, rs in runs.items()}
    base = best[policies[0]]
    rows = []
    for p in policies:
        b = best[p]
        row = {
            "setting": s.name,
            "policy": p,
            "steps": b["steps"],
            "cpu_tier_loads": b["loads"],
            "evictions": b["evictions"],
            "manager_us_per_step": round(b["manager_us_per_step"], 1),
            "connector_us_per_step": round(b["us_per_step"], 1),
            f"manager_vs_{policies[0]}": round(b["manager_us_per_step"] / base["manager_us_per_step"], 3),
            f"connector_vs_{policies[0]}": round(b["us_per_step"] / base["us_per_step"], 3),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run(
    quick: bool = False,
    settings: tuple[str, ...] | None = None,
    repeats: int | None = None,
    chunk_tokens: int | None = None,
) -> dict[str, Any]:
    """Every setting in ``settings`` (default: :data:`DEFAULT`; ``quick``: the small trace),
    with ``chunk_tokens`` tokens per CPU chunk instead of the setting's when given."""
    import vllm

    names = settings or (("small",) if quick else DEFAULT)
    reps = repeats or (3 if names == ("small",) else 1)
    out: dict[str, Any] = {"vllm_version": vllm.__version__, "repeats": reps, "settings": {}, "rows": []}
    for name in names:
        s = SETTINGS[name]
        if chunk_tokens is not None:
            s = replace(s, name=f"{name}-c{chunk_tokens}", chunk_tokens=chunk_tokens)
        out["settings"][s.name] = asdict(s)
        out["rows"] += run_setting(s, reps)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small trace only (about a minute)")
    ap.add_argument("--setting", action="append", choices=sorted(SETTINGS), help="run these settings (repeatable)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per manager and policy (best counts)")
    ap.add_argument("--chunk-tokens", type=int, default=None, help="tokens per CPU chunk (default: the setting's)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--section", default="vllm", help="the results section written (e.g. vllm_033 for vLLM 0.33)")
    ap.add_argument(
        "--compare-policies",
        default=None,
        help="e.g. lru,headstart: kvoffload's manager alone with each policy (cost relative to the first), "
        "written to bench/results/<machine>-vllm-policies.json",
    )
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the harness's model config is local
    if args.compare_policies:
        pols = tuple(p for p in args.compare_policies.split(",") if p)
        names = tuple(args.setting) if args.setting else REALISTIC
        reps = args.repeats or 2
        res: dict[str, Any] = {"repeats": reps, "policies": list(pols), "rows": []}
        for name in names:
            res["rows"] += compare_policies(SETTINGS[name], reps, pols)
        if not args.no_write:
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            from bench import common

            out = common.results_path()
            path = out.with_name(out.stem + "-vllm-policies.json")
            print(f"results: {common.write_section('vllm_policies', res, path)}")
        return 0
    result = run(
        quick=args.quick,
        settings=tuple(args.setting) if args.setting else None,
        repeats=args.repeats,
        chunk_tokens=args.chunk_tokens,
    )
    if not args.no_write:
        write_section(args.section, result)
    return 0


def write_section(name: str, result: dict[str, Any]) -> None:
    """Write ``result`` as section ``name`` of ``bench/results/<machine>-vllm.json``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench import common

    out = common.results_path()
    path = out.with_name(out.stem + "-vllm.json")
    print(f"results: {common.write_section(name, result, path)}")


if __name__ == "__main__":
    raise SystemExit(main())
