"""Where a warm Redis tier's run time goes, against the same run without a tier.

Run: ``python bench/bench_tier_breakdown.py [--quick] [--no-write]``. Needs Debian's
``redis-server`` (started here on a free port, stopped at the end). Writes the section
``tier_breakdown`` of ``bench/results/<machine>-tier-engine.json``.

The demo's chat workload runs through the reference engine without a tier (``none``), then with
a Redis tier emptied first (``redis-cold``, which fills it) and with the tier it filled
(``redis-warm``), alternating, ``--reps`` times. Per run, the engine thread's wall time is split
into the parts of :meth:`Engine.step <kvoffload.engine.reference.engine.Engine.step>` (each timed on the
instance, nested parts taken out of their parent):

* ``compute``: the step's "forward pass" (the KV of every scheduled token written);
* ``verify``: the reference engine's check of every block a load brought to the device against
  the KV computed for it (what a real engine does not do; this bench keeps it, as the demo does);
* ``load_copy`` / ``store_copy``: the worker's host pool -> device and device -> host pool copies;
* ``tier_blocked``: lookups answered within the call (``Tier.probe_now``, ``Tier.load_now``:
  the tier's reads and their copies into the host records on the engine thread);
* ``lookups``: the rest of the scheduler's lookups (``get_num_new_matched_tokens``);
* ``end_step``: the tiered manager's per-step submission of probes, promotions and writes;
* ``sched_other``: the rest of the scheduler's calls (``build_step``, ``complete_jobs``...);
* ``idle_sleep``: the engine's sleep on steps where only tier work is in flight;
* ``engine_other``: the rest of ``Engine.step`` and the demo's driver loop.

Beside them: the CPU time of the process's other threads (the tier's I/O and lookup threads:
reads of promotions and the write-through) and of ``redis-server``, both on the same 2 cores;
the tier's own read and write seconds; and per-unit costs (seconds per computed token, per
verified block, per block copied to the device, per block read from the tier).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

import torch  # noqa: E402

from bench.common import RESULTS_DIR, machine_slug, write_section  # noqa: E402
from kvoffload.app.demo import build_engine  # noqa: E402
from kvoffload.engine.reference.demo_settings import DemoSettings  # noqa: E402
from kvoffload.engine.reference.drive import drive  # noqa: E402
from kvoffload.engine.tiered_options import TieredOptions  # noqa: E402
from kvoffload.testing.redis_server import RedisServer, redis_binaries_problem  # noqa: E402

PARTS = (
    "compute",
    "verify",
    "load_copy",
    "store_copy",
    "tier_blocked",
    "lookups",
    "end_step",
    "sched_other",
    "idle_sleep",
    "engine_other",
)


class _Clock:
    """Exclusive wall time per part: time spent in a nested timed call is charged to the inner part."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self._stack: list[list[float]] = []  # per open call: [start, time taken by nested calls]

    def wrap(self, obj: Any, attr: str, part: str | Callable[..., str]) -> None:
        fn = getattr(obj, attr)

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*a, **k)
            finally:
                self._stack.pop()
                took = time.perf_counter() - frame[0]
                name = part(*a) if callable(part) else part
                self.parts[name] += took - frame[1]
                if self._stack:
                    self._stack[-1][1] += took

        setattr(obj, attr, timed)


def _proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (USER_HZ 100)


def run_once(settings: DemoSettings, redis_pid: int | None, options: TieredOptions | None = None) -> dict[str, Any]:
    """One demo run (its tiered manager's ``options``), its engine-thread wall time split into
    :data:`PARTS` (see the module docstring)."""
    engine = build_engine(settings, options)
    clock = _Clock()
    sched = engine.scheduler
    for name in ("update_state_after_alloc", "build_step", "complete_jobs", "request_finished"):
        clock.wrap(sched, name, "sched_other")
    clock.wrap(sched, "get_num_new_matched_tokens", "lookups")
    clock.wrap(engine, "_compute", "compute")
    clock.wrap(engine._transfers, "_verify", "verify")
    clock.wrap(engine._transfers, "submit", lambda worker, job, *_: "store_copy" if job.is_store else "load_copy")
    if engine.tiered is not None:
        for t in engine.tiered.tiers:
            clock.wrap(t, "probe_now", "tier_blocked")
            clock.wrap(t, "load_now", "tier_blocked")
        clock.wrap(sched, "_end_step", "end_step")  # the scheduler's bound end_step
    step_wall = [0.0]
    step = engine.step

    def timed_step() -> Any:
        t0 = time.perf_counter()
        st = step()
        step_wall[0] += time.perf_counter() - t0
        return st

    engine.step = timed_step  # type: ignore[method-assign]
    redis0 = _proc_cpu_seconds(redis_pid) if redis_pid else 0.0
    p0, c0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    try:
        drive(engine, list(settings.workload()), settings.max_concurrent)
        wall = time.perf_counter() - t0
        proc, thread = time.process_time() - p0, time.thread_time() - c0
    finally:
        engine.shutdown()
    redis_cpu = _proc_cpu_seconds(redis_pid) - redis0 if redis_pid else 0.0
    s = engine.stats
    parts = clock.parts
    parts["idle_sleep"] = step_wall[0] - s.wall_seconds  # Engine.step sleeps after timing itself
    parts["engine_other"] = wall - sum(v for k, v in parts.items() if k != "engine_other")
    out: dict[str, Any] = {
        "wall_seconds": wall,
        "steps": s.steps,
        "computed_tokens": s.computed_tokens,
        "prefill_computed_tokens": s.prefill_computed_tokens,
        "loaded_tokens": s.prefill_loaded_tokens,
        "verified_blocks": s.verified_blocks,
        "blocks_loaded": s.blocks_loaded,
        "blocks_stored": s.blocks_stored,
        "tier_blocks_loaded": s.tier_blocks_loaded,
        "deferrals": s.deferrals,
        "engine_thread_cpu_seconds": thread,
        "other_threads_cpu_seconds": proc - thread,
        "redis_server_cpu_seconds": redis_cpu,
        **{f"{k}_seconds": v for k, v in parts.items()},
        "compute_us_per_token": parts["compute"] / max(1, s.computed_tokens) * 1e6,
        "verify_us_per_block": parts["verify"] / max(1, s.verified_blocks) * 1e6,
        "load_copy_us_per_block": parts["load_copy"] / max(1, s.blocks_loaded) * 1e6,
    }
    if engine.tiered is not None:
        ts = engine.tiered.tiers[0].stats()
        u = engine.tiered.usage()[0]
        out.update(
            tier_blocks_promoted=u.blocks_promoted,
            tier_blocks_written=u.blocks_written,
            tier_read_seconds=ts.read_seconds,
            tier_write_seconds=ts.write_seconds,
            tier_bytes_read=ts.bytes_read,
            tier_read_us_per_block=ts.read_seconds / max(1, ts.blocks_read) * 1e6,
        )
    return out


def _per_block_ms(summary: dict[str, Any], block_tokens: int) -> dict[str, float]:
    """What one offloaded block costs the engine thread, in ms: computed in the run without a tier
    (its tokens' compute, its store copy), loaded in the warm run (the tier's read, the copy to the
    device, the reference engine's verification)."""
    none, warm = summary["none"], summary["redis-warm"]
    return {
        "compute": none["compute_us_per_token"] * block_tokens / 1e3,
        "store_copy": none["store_copy_seconds"] / max(1, none["blocks_stored"]) * 1e3,
        "tier_read": warm["tier_read_us_per_block"] / 1e3,
        "load_copy": warm["load_copy_us_per_block"] / 1e3,
        "verify": warm["verify_seconds"] / max(1, warm["blocks_loaded"]) * 1e3,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 conversations, 1 repetition")
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument(
        "--budgets", default="0,4", help="warm runs with these sync_load_budget_bytes (MiB, comma-separated)"
    )
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    problem = redis_binaries_problem()
    if problem is not None:
        raise SystemExit(f"bench_tier_breakdown needs redis-server: {problem}")
    torch.set_num_threads(1)
    conv = args.conversations or (16 if args.quick else 48)
    reps = args.reps or (1 if args.quick else 3)
    base = DemoSettings(conversations=conv)
    budgets = [int(float(b) * (1 << 20)) for b in args.budgets.split(",") if b]
    variants = {f"redis-warm-budget-{b / (1 << 20):g}MiB": TieredOptions(sync_load_budget_bytes=b) for b in budgets}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in ("none", "redis-cold", "redis-warm", *variants)}
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-redis-") as tmp:
        server = RedisServer(Path(tmp), maxmemory="2gb").start()
        pid = server.proc.pid if server.proc is not None else None
        try:
            with_tier = replace(base, tiers=(server.url,))
            for r in range(reps):
                runs["none"].append(run_once(base, pid))
                server.cli("flushall")
                runs["redis-cold"].append(run_once(with_tier, pid))
                runs["redis-warm"].append(run_once(with_tier, pid))
                for name, options in variants.items():
                    runs[name].append(run_once(with_tier, pid, options))
                print(
                    f"rep {r + 1}/{reps}: " + ", ".join(f"{k} {v[-1]['wall_seconds']:.2f} s" for k, v in runs.items())
                )
        finally:
            server.stop()
    summary: dict[str, Any] = {"conversations": conv, "reps": reps, "runs": runs}
    keys = [k for k in runs["redis-warm"][0] if isinstance(runs["redis-warm"][0][k], (int, float))]
    for name, rs in runs.items():
        summary[name] = {k: statistics.median(r[k] for r in rs if k in r) for k in keys if k in rs[0]}
    base_wall = summary["none"]["wall_seconds"]
    short = [n.removeprefix("redis-").replace("warm-budget-", "w-") for n in runs]
    print(f"{'':>32} " + " ".join(f"{n:>9}" for n in short) + "  (tier runs - none, as a share of none's wall)")
    for k in keys:
        vals = [summary[n].get(k, 0.0) for n in runs]
        share = " ".join(f"{(v - vals[0]) / base_wall:+.1%}" for v in vals[1:]) if k.endswith("_seconds") else ""
        print(f"{k:>32} " + " ".join(f"{v:9.3f}" for v in vals) + f"  {share}")
    summary["per_block_ms"] = per_block = _per_block_ms(summary, base.gpu_block_size * base.block_size_factor)
    print(
        f"per offloaded block ({base.gpu_block_size * base.block_size_factor} tokens): computed (no tier) "
        f"{per_block['compute']:.2f} ms + its store copy {per_block['store_copy']:.2f} ms; loaded from the warm "
        f"tier: read {per_block['tier_read']:.2f} ms + copy to the device {per_block['load_copy']:.2f} ms + "
        f"verification {per_block['verify']:.2f} ms"
    )
    for name in runs:
        if name != "none":
            summary[f"{name}_run_wall_ratio"] = statistics.median(
                b["wall_seconds"] / a["wall_seconds"] for a, b in zip(runs["none"], runs[name], strict=True)
            )
            print(f"{name} / none: run wall {summary[f'{name}_run_wall_ratio']:.2f}x (median of paired ratios)")
    if not args.no_write:
        path = RESULTS_DIR / f"{machine_slug()}-tier-engine.json"
        write_section("tier_breakdown", summary, path)
        print(f"written to {path}")
    return summary


if __name__ == "__main__":
    main()
