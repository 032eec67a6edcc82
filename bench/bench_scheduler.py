"""Benchmark of the offloading scheduler's host overhead per engine step.

Run: ``python bench/bench_scheduler.py [--quick]`` (or ``python -m kvoffload bench --only scheduler``).
Writes the ``scheduler`` section of ``bench/results/<machine>.json`` (unless ``--no-write``).

Setting: 256 running requests with 8k-token prompts, GPU blocks of 16 tokens (512
offload keys per prompt), a CPU tier of 10^6 blocks filled to capacity with other keys, so every
store evicts. Measured in one run:

1. **Decode steps** (the target): every step each of the 256 requests computes one token; every
   16 tokens a request gets a new GPU block and a new hash, and its block fills, so about 16 store
   jobs per step (``prepare_store`` on the full pool, evicting). Timed: ``build_step`` plus
   ``complete_jobs`` of the previous step's jobs. Reported in µs per step and per request, mean,
   median and p99; the target is <= 1 ms per step. Also with ``num_workers=2`` (two reports per
   job), with 64-token offloaded blocks (block_size_factor 4: ~4 store jobs per step), with a
   manager that answers at once (the scheduler's own cost) and with vLLM's style of manager
   (``baseline_manager.OrderedDictLRUManager``, no batch lookup) behind the same scheduler.
2. **Bare step loop** (baseline measured in the same run): building the 256 ``ScheduledRequest``
   objects and reading them once -- what the engine spends just to describe a step. The decode
   figure is reported as a ratio to it.
3. **Admission**: ``get_num_new_matched_tokens`` + ``update_state_after_alloc`` for an 8k prompt,
   all 512 keys missing (then the prefill step stores them: one ``build_step`` with the whole
   prompt + completion), and all 512 keys in the CPU tier (a 512-key load job built, handed out and
   completed). µs per request.

No target is asserted; the closing lines print each figure next to its target.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402

from kvoffload.cache.manager import CPUOffloadingManager  # noqa: E402
from kvoffload.core.base import CPULoadStoreSpec, PrepareStoreOutput, ReqContext  # noqa: E402
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig  # noqa: E402
from kvoffload.engine.scheduler.jobs import ScheduledRequest  # noqa: E402
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler  # noqa: E402

BLOCK = 16
PROMPT = 8192
CTX = ReqContext("bench")


def _load_sibling(name: str) -> Any:
    mod_name = f"bench.{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, _HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


class BenchRequest:
    """The duck-typed request the scheduler needs; hashes are random 16-byte strings."""

    __slots__ = ("request_id", "block_hashes", "num_tokens", "num_prompt_tokens", "kv_transfer_params")

    def __init__(self, rid: str, num_tokens: int) -> None:
        self.request_id = rid
        self.num_tokens = num_tokens
        self.num_prompt_tokens = num_tokens
        self.block_hashes = [os.urandom(16) for _ in range(num_tokens // BLOCK)]
        self.kv_transfer_params = None


def _fill(manager: Any, capacity: int) -> None:
    """Fill the pool to capacity with ready blocks of unrelated keys."""
    step = 50_000
    for lo in range(0, capacity, step):
        keys = [os.urandom(20) for _ in range(min(step, capacity - lo))]
        out = manager.prepare_store(keys, CTX)
        manager.complete_store(out.keys_to_store, CTX)


def _stats(samples: list[float], n_req: int) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples)
    return {
        "us_per_step_mean": round(statistics.fmean(us), 1),
        "us_per_step_median": round(us[len(us) // 2], 1),
        "us_per_step_p99": round(us[min(len(us) - 1, int(len(us) * 0.99))], 1),
        "us_per_request": round(statistics.fmean(us) / n_req, 3),
    }


class NullManager:
    """A manager that answers at once (every key absent, every store accepted): isolates the
    scheduler's own cost from the manager's."""

    def __init__(self) -> None:
        self._specs: dict[int, CPULoadStoreSpec] = {}

    def lookup(self, key: bytes, ctx: ReqContext) -> bool:
        return False

    def lookup_batch(self, keys: Any, ctx: ReqContext) -> np.ndarray:
        return np.zeros(len(keys), dtype=np.int8)

    def prepare_load(self, keys: Any, ctx: ReqContext) -> CPULoadStoreSpec:
        raise AssertionError("nothing is ever loadable")

    def touch(self, keys: Any, ctx: ReqContext) -> None:
        pass

    def complete_load(self, keys: Any, ctx: ReqContext) -> None:
        pass

    def prepare_store(self, keys: Any, ctx: ReqContext) -> PrepareStoreOutput:
        spec = self._specs.get(len(keys))
        if spec is None:
            spec = self._specs[len(keys)] = CPULoadStoreSpec(np.arange(len(keys)))
        return PrepareStoreOutput(list(keys), spec, [])

    def complete_store(self, keys: Any, ctx: ReqContext, success: bool = True) -> None:
        pass


def bench_decode(manager: Any, n_running: int, n_steps: int, num_workers: int = 1, factor: int = 1) -> dict[str, Any]:
    """256 running requests, one token each per step (section 1 of the module docstring)."""
    config = OffloadingSchedulerConfig.from_block_sizes([BLOCK], factor, num_workers=num_workers)
    sched = OffloadingScheduler(config, manager)
    obs = BLOCK * factor
    reqs = [BenchRequest(f"r{i}", PROMPT + (i * 7) % obs) for i in range(n_running)]
    next_block = 1
    tables: list[list[int]] = []
    pending: list[int] = []
    # admission + prefill (not timed here)
    for r in reqs:
        n, _ = sched.get_num_new_matched_tokens(r, 0)
        assert n == 0
        nb = -(-r.num_tokens // BLOCK)
        table = list(range(next_block, next_block + nb))
        next_block += nb
        tables.append(table)
        sched.update_state_after_alloc(r, [table], 0)
        out = sched.build_step([ScheduledRequest(r, 0, r.num_tokens, [table])])
        sched.complete_jobs([(j.job_id, True) for j in out.store_jobs for _ in range(num_workers)])
        r.num_tokens += 1  # the sampled token
        if r.num_tokens % BLOCK == 0:
            r.block_hashes.append(os.urandom(16))
    computed = [r.num_tokens - 1 for r in reqs]
    samples: list[float] = []
    jobs_per_step: list[int] = []
    gc.collect()
    for _ in range(n_steps):
        running = []
        for i, r in enumerate(reqs):
            c = computed[i]
            appended: list[int] = []
            if c % BLOCK == 0:  # this token opens a new GPU block
                appended = [next_block]
                next_block += 1
            running.append(ScheduledRequest(r, c, 1, [appended]))
        results = [(j, True) for j in pending for _ in range(num_workers)]
        t0 = time.perf_counter()
        out = sched.build_step((), running)
        sched.complete_jobs(results)
        samples.append(time.perf_counter() - t0)
        pending = [j.job_id for j in out.store_jobs]
        jobs_per_step.append(len(pending))
        for i, r in enumerate(reqs):  # the engine samples one token per request
            computed[i] += 1
            r.num_tokens += 1
            if r.num_tokens % BLOCK == 0:
                r.block_hashes.append(os.urandom(16))
    res = _stats(samples, n_running)
    res["store_jobs_per_step"] = round(statistics.fmean(jobs_per_step), 2)
    res["steps"] = n_steps
    res["num_workers"] = num_workers
    res["offloaded_block_tokens"] = obs
    return res


def bench_bare_loop(n_running: int, n_steps: int) -> dict[str, Any]:
    """Baseline: build and read the 256 ScheduledRequest objects of a step (section 2)."""
    reqs = [BenchRequest(f"b{i}", BLOCK) for i in range(n_running)]
    computed = [PROMPT] * n_running
    samples = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        running = [ScheduledRequest(r, computed[i], 1, [[]]) for i, r in enumerate(reqs)]
        total = 0
        for sr in running:
            total += sr.num_computed_tokens + sr.num_scheduled_tokens
        samples.append(time.perf_counter() - t0)
    return _stats(samples, n_running)


def bench_admission(manager: Any, n_requests: int) -> dict[str, Any]:
    """Per 8k-token request: admission with all keys missing (+ prefill store), then all present."""
    sched = OffloadingScheduler(OffloadingSchedulerConfig.from_block_sizes([BLOCK], 1), manager)
    reqs = [BenchRequest(f"a{i}", PROMPT + 1) for i in range(n_requests)]
    table = list(range(1, PROMPT // BLOCK + 2))
    miss, store, hit = [], [], []
    for r in reqs:
        t0 = time.perf_counter()
        n, _ = sched.get_num_new_matched_tokens(r, 0)
        sched.update_state_after_alloc(r, [table], 0)
        t1 = time.perf_counter()
        out = sched.build_step([ScheduledRequest(r, 0, r.num_tokens, [table])])
        sched.complete_jobs([(j.job_id, True) for j in out.store_jobs])
        t2 = time.perf_counter()
        sched.request_finished(r)
        assert n == 0 and len(out.store_jobs) == 1
        miss.append(t1 - t0)
        store.append(t2 - t1)
    for i, r in enumerate(reqs):
        r2 = BenchRequest(f"h{i}", PROMPT + 1)
        r2.block_hashes = r.block_hashes
        t0 = time.perf_counter()
        n, _ = sched.get_num_new_matched_tokens(r2, 0)
        sched.update_state_after_alloc(r2, [table], n)
        out = sched.build_step()
        sched.complete_jobs([(j.job_id, True) for j in out.load_jobs])
        hit.append(time.perf_counter() - t0)
        sched.request_finished(r2)
        assert n == PROMPT and len(out.load_jobs) == 1
    return {
        "requests": n_requests,
        "us_admit_all_missing": round(statistics.fmean(miss) * 1e6, 1),
        "us_prefill_store_512_keys": round(statistics.fmean(store) * 1e6, 1),
        "us_admit_and_load_512_hits": round(statistics.fmean(hit) * 1e6, 1),
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Run every part. ``quick``: fewer steps and requests (well under a minute)."""
    t_start = time.perf_counter()
    capacity = 1_000_000
    n_running = 256
    n_steps = 64 if quick else 400
    result: dict[str, Any] = {
        "quick": quick,
        "capacity": capacity,
        "running_requests": n_running,
        "prompt_tokens": PROMPT,
        "gpu_block_size": BLOCK,
    }
    ours = CPUOffloadingManager(capacity)
    _fill(ours, capacity)
    result["decode"] = bench_decode(ours, n_running, n_steps)
    _print("decode (ours, 1 worker)", result["decode"])
    result["decode_2_workers"] = bench_decode(ours, n_running, n_steps, num_workers=2)
    _print("decode (ours, 2 workers)", result["decode_2_workers"])
    result["decode_factor_4"] = bench_decode(ours, n_running, n_steps, factor=4)
    _print("decode (ours, 64-token blocks)", result["decode_factor_4"])
    result["decode_null_manager"] = bench_decode(NullManager(), n_running, n_steps)
    _print("decode (scheduler alone)", result["decode_null_manager"])
    result["bare_loop"] = bench_bare_loop(n_running, n_steps)
    _print("bare step loop (baseline)", result["bare_loop"])
    result["admission"] = bench_admission(ours, 16 if quick else 64)
    a = result["admission"]
    print(
        f"admission per 8k-token request: all keys missing {a['us_admit_all_missing']} us, prefill store of "
        f"512 keys {a['us_prefill_store_512_keys']} us, admit + load of 512 hits {a['us_admit_and_load_512_hits']} us",
        flush=True,
    )
    del ours
    gc.collect()
    baseline = _load_sibling("baseline_manager").OrderedDictLRUManager(capacity)
    _fill(baseline, capacity)
    result["decode_baseline_manager"] = bench_decode(baseline, n_running, n_steps)
    _print("decode (OrderedDict manager)", result["decode_baseline_manager"])
    del baseline
    gc.collect()
    d = result["decode"]
    result["ratio_decode_to_bare_loop"] = round(d["us_per_step_mean"] / result["bare_loop"]["us_per_step_mean"], 2)
    result["target_us_per_step"] = 1000.0
    result["target_met"] = d["us_per_step_mean"] <= 1000.0
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    own = result["decode_null_manager"]["us_per_step_mean"]
    result["scheduler_own_us_per_step"] = own
    result["manager_share_of_step"] = round(max(0.0, d["us_per_step_mean"] - own) / d["us_per_step_mean"], 3)
    print(
        f"-- target: decode step {d['us_per_step_mean']} us (p99 {d['us_per_step_p99']} us) / <= 1000 us "
        f"{'MET' if result['target_met'] else 'MISSED'}; {d['us_per_request']} us per request; "
        f"{result['ratio_decode_to_bare_loop']}x the bare step loop; scheduler alone {own} us/step "
        f"(the manager's calls are {result['manager_share_of_step']:.0%} of the step)",
        flush=True,
    )
    return result


def _print(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name:32s} mean {r['us_per_step_mean']:8.1f} us/step  median {r['us_per_step_median']:8.1f}  "
        f"p99 {r['us_per_step_p99']:8.1f}  {r['us_per_request']:7.3f} us/request",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (well under a minute)")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/<machine>.json")
    parser.add_argument("--out", default=None, help="results JSON path")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    if not args.no_write:
        path = _load_sibling("common").write_section("scheduler", result, args.out)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
