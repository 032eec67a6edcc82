"""The host's work per transfer job, measured without a GPU: µs and Python-level calls per job.

``python bench/bench_host_path.py [--baseline REV] [--steps N] [--no-write]``

Runs :meth:`TransferWorker.transfer_async` and the completion poll (``get_finished``) on a
CPU-only machine under :func:`kvoffload.testing.fake_cuda.fake_cuda`: torch's CUDA streams and
events and Triton's driver are no-ops, the kernels are compiled by Triton for real (an sm_90
target) and every launch stops at Triton's C launcher. So it measures the **Python and numpy work
the host does per job** (checks, job table, launch entry, events as Python calls), not the CUDA
driver's own work (``cuLaunchKernel``, ``cudaEventRecord``...), which a GPU run adds
(``make gpu-check`` measures the whole host time there).

Cases: a Llama-8B-like flash-attn cache (32 layers, K and V: 64 pages of 4 KiB per block), jobs of 1
/ 16 / 64 blocks = 64 / 1,024 / 4,096 pages at random blocks and slots (no two jobs of a step naming
the same one), stores and loads. A *step* submits 16 jobs of one direction, then polls once (what an
engine does per step); per job = step time / 16, median over steps. ``--path direct`` (default):
every job on the direct path, the one whose host work this measures (``auto``: as the fake sm_90
GPU's config picks, which differs between the trees for loads). ``single``: one launch per job (the
default); ``merged``: ``TransferWorker(merge=True)``, the step's jobs in one launch. Calls per job:
every function call cProfile sees over 4 steps, / jobs (deterministic).

``--baseline REV`` (default ``418d42d``, the commit before the bound kernel): the same cases on
the code at ``REV``, checked out into a temporary git worktree and run in its own process,
alternating with this tree's (``--reps`` runs of each, medians); the table gives both and their
ratio. Writes section ``host_path`` of
``bench/results/<machine>.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import inspect
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PAGES = (64, 1024, 4096)
VIEWS = 64  # 32 layers x (K, V)
JOBS_PER_STEP = 16
DEFAULT_BASELINE = "418d42d"


def _fake_cuda_module() -> Any:
    """This tree's fake CUDA (loaded by path, so a baseline tree without it runs under it too)."""
    path = ROOT / "kvoffload" / "testing" / "fake_cuda.py"
    spec = importlib.util.spec_from_file_location("kvoffload_bench_fake_cuda", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _step_specs(rng: Any, blocks: int, store: bool, num_blocks: int, num_slots: int) -> list[Any]:
    """One step's jobs: random blocks and slots, no two jobs of the step naming the same one (as
    an engine's step: each request its own blocks and slots)."""
    from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec

    gpu_ids, slots = rng.permutation(num_blocks), rng.permutation(num_slots)
    out = []
    for k in range(JOBS_PER_STEP):
        gpu = GPULoadStoreSpec(gpu_ids[k * blocks : (k + 1) * blocks])
        cpu = CPULoadStoreSpec(slots[k * blocks : (k + 1) * blocks])
        out.append((gpu, cpu) if store else (cpu, gpu))
    return out


def _step(worker: Any, specs: list[list[Any]], first: int, timings: list[float] | None = None) -> int:
    """Submit one step's jobs (ids from ``first``), poll once; returns the next id."""
    jobs = specs[(first // JOBS_PER_STEP) % len(specs)]
    for k, spec in enumerate(jobs):
        if timings is None:
            worker.transfer_async(first + k, spec)
        else:
            t0 = time.perf_counter()
            worker.transfer_async(first + k, spec)
            timings.append(time.perf_counter() - t0)
    done = worker.get_finished()
    assert len(done) == JOBS_PER_STEP and all(r.success for r in done)
    return first + JOBS_PER_STEP


def _case(worker: Any, fake: Any, specs: list[list[Any]], steps: int, next_id: int) -> tuple[dict[str, Any], int]:
    """One case's figures (see the module docstring) and the next job id."""
    for _ in range(5):
        next_id = _step(worker, specs, next_id)
    launches = len(fake.launches)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(4):
        next_id = _step(worker, specs, next_id)
    prof.disable()
    calls = pstats.Stats(prof).total_calls / (4 * JOBS_PER_STEP)  # type: ignore[attr-defined]
    launches_per_step = (len(fake.launches) - launches) / 4
    gc.collect()
    gc.disable()
    per_job: list[float] = []
    submit: list[float] = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            next_id = _step(worker, specs, next_id)
            per_job.append((time.perf_counter() - t0) / JOBS_PER_STEP)
        for _ in range(max(1, steps // 4)):
            next_id = _step(worker, specs, next_id, submit)
    finally:
        gc.enable()
    case = {
        "us_per_job": round(statistics.median(per_job) * 1e6, 2),
        "submit_us": round(statistics.median(submit) * 1e6, 2),
        "calls_per_job": round(calls, 2),
        "launches_per_step": launches_per_step,
    }
    return case, next_id


def measure(steps: int, path: str) -> dict[str, Any]:
    """Every case on the kvoffload that ``import kvoffload`` finds; one dict per case."""
    import numpy as np
    import torch

    fc = _fake_cuda_module()
    from kvoffload.kernels.layout import KVCacheTable
    from kvoffload.transfer.worker import TransferWorker

    num_blocks = num_slots = JOBS_PER_STEP * max(PAGES) // VIEWS
    layers = [torch.zeros(2, num_blocks, 2, 8, 128, dtype=torch.bfloat16) for _ in range(VIEWS // 2)]  # 4 KiB pages
    modes = ["single"]
    if "merge" in inspect.signature(TransferWorker.__init__).parameters:
        modes.append("merged")
    rows = []
    rng = np.random.default_rng(0)
    with fc.fake_cuda() as fake:
        table = fc.as_cuda_table(KVCacheTable.from_tensors([layers], "flash_attn"))
        for mode in modes:
            extra = {"merge": True} if mode == "merged" else {}
            worker = TransferWorker(table, num_slots, backend="triton", path=path, **extra)
            entry = getattr(getattr(worker, "kernel", None), "entry", "plain (JITFunction)")
            next_id = 0
            for pages in PAGES:
                for store in (True, False):
                    blocks = pages // VIEWS
                    specs = [_step_specs(rng, blocks, store, num_blocks, num_slots) for _ in range(4)]
                    case, next_id = _case(worker, fake, specs, steps, next_id)
                    rows.append(
                        {
                            "pages": pages,
                            "direction": "store" if store else "load",
                            "mode": mode,
                            "entry": entry,
                            **case,
                        }
                    )
            worker.shutdown()
    import triton

    return {"rows": rows, "triton": triton.__version__, "torch": torch.__version__, "numpy": np.__version__}


def _run(tree: Path, steps: int, path: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree), KVOFFLOAD_HOST_PATH_CHILD="1")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--steps", str(steps), "--path", path],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=str(tree),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case, the median over runs of the timings (the call counts are the same in every run)."""
    out = dict(runs[0])
    out["rows"] = []
    for i, row in enumerate(runs[0]["rows"]):
        merged = dict(row)
        for key in ("us_per_job", "submit_us"):
            merged[key] = round(statistics.median(r["rows"][i][key] for r in runs), 2)
        out["rows"].append(merged)
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with ('' for none)")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per case and run")
    ap.add_argument("--reps", type=int, default=3, help="runs of each tree, alternated; medians")
    ap.add_argument("--path", default="direct", help="the workers' data path (auto: as the sm_90 config picks)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps, args.path)))
        return
    head = _git("rev-parse", "--short", "HEAD")
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        if args.baseline:
            _git("worktree", "add", "--detach", str(base), args.baseline)
        try:
            for _ in range(args.reps):  # alternated, so that a drift of the machine hits both
                runs["this"].append(_run(ROOT, args.steps, args.path))
                if args.baseline:
                    runs["baseline"].append(_run(base, args.steps, args.path))
        finally:
            if args.baseline:
                _git("worktree", "remove", "--force", str(base))
    results = {name: _median_runs(r) for name, r in runs.items() if r}
    print(
        f"host work per transfer job under fake CUDA ({head} vs {args.baseline or '-'}), "
        f"median of {args.steps} steps, median of {args.reps} alternated runs"
    )
    print(f"{'pages':>6} {'dir':>5} {'mode':>7} {'us/job':>8} {'base':>8} {'ratio':>6} {'calls/job':>9} {'base':>7}")
    base_rows = {(r["pages"], r["direction"]): r for r in results.get("baseline", {}).get("rows", [])}
    table = []
    for r in results["this"]["rows"]:
        b = base_rows.get((r["pages"], r["direction"]))
        ratio = round(r["us_per_job"] / b["us_per_job"], 3) if b else None
        calls_ratio = round(r["calls_per_job"] / b["calls_per_job"], 3) if b else None
        table.append({**r, "baseline_us_per_job": b and b["us_per_job"], "ratio": ratio, "calls_ratio": calls_ratio})
        print(
            f"{r['pages']:>6} {r['direction']:>5} {r['mode']:>7} {r['us_per_job']:>8.1f} "
            f"{(b['us_per_job'] if b else float('nan')):>8.1f} {(ratio or float('nan')):>6.3f} "
            f"{r['calls_per_job']:>9.1f} {(b['calls_per_job'] if b else float('nan')):>7.1f}"
        )
    if args.no_write:
        return
    from common import write_section

    path = write_section(
        "host_path",
        {
            "what": "µs and cProfile-counted calls per transfer job (submit + completion poll), CUDA faked; "
            "a step = 16 jobs then get_finished()",
            "command": f"python bench/bench_host_path.py --baseline {args.baseline} --steps {args.steps} "
            f"--reps {args.reps} --path {args.path}",
            "path": args.path,
            "baseline_revision": args.baseline,
            "revision": head,
            "versions": {k: {x: v[x] for x in ("triton", "torch", "numpy")} for k, v in results.items()},
            "rows": table,
            "baseline_rows": results.get("baseline", {}).get("rows", []),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
