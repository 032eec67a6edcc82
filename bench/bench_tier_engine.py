"""Engine-thread cost of a Redis tier: host time of the scheduler's calls per engine step, with and without.

Run: ``python bench/bench_tier_engine.py [--quick] [--no-verify] [--no-write]``. Needs Debian's ``redis-server``
(started here on a free port, stopped at the end). Writes ``bench/results/<machine>-tier-engine.json``.

The demo's chat workload (``kvoffload.app.demo``; ``--conversations`` per run) runs through the
reference engine several ways, in the same process, alternating, ``--reps`` times:

* ``none``: no tier (the baseline);
* ``redis-cold``: a Redis tier emptied first: every lookup that misses the host pool is probed in
  Redis, every stored block is written through;
* ``redis-warm``: the same tier holding what the previous run wrote: tier hits are promoted;
* ``redis-cold-async`` / ``redis-warm-async``: the same with nothing answered within a lookup
  (``probe_in_lookup=False``, ``sync_load_budget_bytes=0``: a request waits for the step's probe
  batch and for its promotions, as vLLM's adapter does);
* ``redis-warm-probeonly``: a warm tier whose lookups probe at once but promote asynchronously
  (``sync_load_budget_bytes=0``);
* ``redis-warm-bigbudget``: a warm tier with ``sync_load_budget_bytes`` 32 MiB a step;
* ``redis-warm-events`` / ``redis-warm-events-off``: a warm tier with and without
  ``removal_events`` (the server publishing its key events, the tier watching them), in
  ``--event-pairs`` alternated pairs per repetition; the on/off ratio is pooled over all pairs
  (goal <= 1.02x), beside the same ratio between the off runs of alternate pairs (an A/A
  comparison: what the measurement cannot resolve).

Per request, the wall time from its first deferred lookup to the lookup that answers (p50, p99;
``deferred_ms_*``); per request that waited on the tier (deferred, or blocks promoted for it), the
wall time from the start of its first lookup to the end of the one that answers (``waited_ms_*``:
for a request answered within its first lookup, that call), beside the transfer time of the blocks
promoted for it at the tier's measured read GB/s and one round trip to the server (the median of
``PING``s on a connection of its own); ``within_bound`` is the share of those requests whose wait
is at most one round trip plus their transfer time. The engine-thread time blocked in lookups that
answer within the call (``Tier.probe_now``, ``Tier.load_now``) is reported per step (mean, max).

With ``--no-verify`` the engine trusts its loads: it does not regenerate the KV of every block a
load brought to the device to compare (the reference engine's check costs what computing the
block costs, so with it a block loaded instead of computed saves only its store copy); results go
to section ``tier_engine_unverified``.

Timed: what the engine thread spends in the scheduler's calls -- ``get_num_new_matched_tokens``
(lookups, and with a tier its fall-through and promotion reservations), ``update_state_after_alloc``,
``build_step`` (with a tier: ``end_step``, which submits the step's probes, promotions and writes),
``complete_jobs`` (with a tier: pinning completed stores for the write) and ``request_finished``.
The tier's own threads run concurrently; they compete with the engine thread for the cores and the
GIL, which the timings include. Reported per engine step (mean), per *computing* step (the run's
total over the steps that scheduled tokens: a request deferred while the tier answers leaves the
reference engine stepping idle, and those cheap steps would flatter the plain mean) and per run
(total), as ratios to ``none`` paired within each repetition (median over repetitions). Goal:
<= 1.1x per step.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

import redis  # noqa: E402
import torch  # noqa: E402

from bench.common import RESULTS_DIR, machine_slug, write_section  # noqa: E402
from kvoffload.app.demo import build_engine  # noqa: E402
from kvoffload.engine.reference.demo_settings import DemoSettings  # noqa: E402
from kvoffload.engine.reference.drive import drive  # noqa: E402
from kvoffload.engine.tiered_options import TieredOptions  # noqa: E402
from kvoffload.testing.redis_server import RedisServer, redis_binaries_problem  # noqa: E402

TIMED = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_step", "complete_jobs", "request_finished")


def _instrument(sched: Any, acc: list[float], deferred: dict[str, float], waited: dict[str, float]) -> None:
    """Wrap the scheduler's calls on the instance: their wall time adds up in ``acc[0]``, the
    engine thread's CPU time in them in ``acc[1]``; per request, the wall time from its first
    deferred lookup (``(None, False)``) to the end of the lookup that answers goes to
    ``deferred``, and from the start of its first lookup to the end of the one that answers (the
    answering call itself for a request never deferred) to ``waited``."""
    since: dict[str, float] = {}
    for name in TIMED:
        fn = getattr(sched, name)

        @functools.wraps(fn)
        def timed(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                out = _fn(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t0
                acc[1] += time.thread_time() - c0
            if _name == "get_num_new_matched_tokens":
                rid = a[0].request_id
                if out[0] is None:
                    since.setdefault(rid, t0)
                else:
                    end = time.perf_counter()
                    first = since.pop(rid, None)
                    if first is not None:
                        deferred[rid] = end - first
                    waited.setdefault(rid, end - (t0 if first is None else first))
            return out

        setattr(sched, name, timed)


def _instrument_tier(tiered: Any, blocked: list[float]) -> None:
    """Wrap the tier's calls that block the engine thread (``probe_now``, ``load_now``): their wall
    time adds up in ``blocked[-1]`` (the run starts a new entry per engine step)."""
    tier = tiered.tiers[0]
    for name in ("probe_now", "load_now"):
        fn = getattr(tier, name)

        @functools.wraps(fn)
        def timed(*a: Any, _fn: Any = fn, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                blocked[-1] += time.perf_counter() - t0

        setattr(tier, name, timed)


def round_trip_seconds(url: str, n: int = 200) -> float:
    """The median wall time of ``n`` ``PING`` round trips to the server at ``url`` (a connection of its own)."""
    client = redis.Redis.from_url(url)
    try:
        client.ping()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - t0)
    finally:
        client.close()
    return statistics.median(times)


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_once(settings: DemoSettings, rtt: float = 0.0, **manager_options: Any) -> dict[str, Any]:
    """One demo run; the scheduler calls' host time, steps and what the tier did (``manager_options``:
    its :class:`~kvoffload.engine.tiered.TieredManager`'s, as ``TieredOptions``; ``rtt``: the
    tier's round trip)."""
    promoted: dict[str, int] = {}  # per request, the blocks promoted for it

    def on_promotion(req_id: str, n: int) -> None:
        promoted[req_id] = promoted.get(req_id, 0) + n

    engine = build_engine(settings, TieredOptions(**manager_options, on_promotion=on_promotion))
    acc = [0.0, 0.0]
    deferred: dict[str, float] = {}
    waited: dict[str, float] = {}
    blocked = [0.0]  # per engine step: wall time blocked in tier calls
    _instrument(engine.scheduler, acc, deferred, waited)
    if engine.tiered is not None:
        _instrument_tier(engine.tiered, blocked)
    busy = [0]
    step = engine.step

    def counting_step() -> Any:
        st = step()
        blocked.append(0.0)
        busy[0] += st.num_scheduled_tokens > 0
        return st

    engine.step = counting_step  # type: ignore[method-assign]
    t0 = time.perf_counter()
    try:
        drive(engine, list(settings.workload()), settings.max_concurrent)
    finally:
        engine.shutdown()
    s = engine.stats
    out = {
        "steps": s.steps,
        "sched_seconds": acc[0],
        "us_per_step": acc[0] / s.steps * 1e6,
        "cpu_seconds": acc[1],
        "cpu_us_per_step": acc[1] / s.steps * 1e6,
        "busy_steps": busy[0],
        "us_per_busy_step": acc[0] / max(1, busy[0]) * 1e6,
        "cpu_us_per_busy_step": acc[1] / max(1, busy[0]) * 1e6,
        "step_seconds": s.wall_seconds,
        "wall_seconds": time.perf_counter() - t0,
        "loaded_tokens": s.prefill_loaded_tokens,
        "computed_tokens": s.prefill_computed_tokens,
        "deferrals": s.deferrals,
        "deferred_requests": len(deferred),
        "deferred_ms_p50": _pct(list(deferred.values()), 0.5) * 1e3,
        "deferred_ms_p99": _pct(list(deferred.values()), 0.99) * 1e3,
        "deferred_ms_max": _pct(list(deferred.values()), 1.0) * 1e3,
        "step_ms_mean": s.wall_seconds / max(1, s.steps) * 1e3,
        "verification_failures": s.verification_failures,
    }
    if engine.tiered is not None:
        tier = engine.tiered.tiers[0]
        ts = tier.stats()
        u = engine.tiered.usage()[0]
        gbps = ts.bytes_read / ts.read_seconds / 1e9 if ts.read_seconds else 0.0
        # per request that waited on the tier (deferred, or blocks promoted for it): the wait, and
        # the transfer time of its promoted blocks at the run's GB/s
        tiered = {r: w for r, w in waited.items() if r in deferred or r in promoted}
        xfer = {r: promoted.get(r, 0) * tier.record_bytes / (gbps * 1e9) if gbps else 0.0 for r in tiered}
        within = [w <= rtt + xfer[r] for r, w in tiered.items()]
        out.update(
            round_trip_ms=rtt * 1e3,
            tier_requests=len(tiered),
            waited_ms_p50=_pct(list(tiered.values()), 0.5) * 1e3,
            waited_ms_p99=_pct(list(tiered.values()), 0.99) * 1e3,
            transfer_ms_p50=_pct(list(xfer.values()), 0.5) * 1e3,
            transfer_ms_p99=_pct(list(xfer.values()), 0.99) * 1e3,
            within_bound=sum(within) / len(within) if within else 1.0,
            blocked_ms_per_step=sum(blocked) / s.steps * 1e3,
            blocked_ms_max_step=max(blocked, default=0.0) * 1e3,
        )
        out.update(
            tier_blocks_loaded=u.blocks_promoted,
            tier_blocks_written=u.blocks_written,
            tier_round_trips=ts.lookup_round_trips,
            tier_lookups=ts.lookups,
            tier_read_gbps=gbps,
            tier_hit_rate=engine.tiered.tiers[0].hit_rate,
            tier_bytes_read=ts.bytes_read,
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 conversations, 1 repetition")
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument(
        "--event-pairs", type=int, default=3, help="removal events off/on pairs per repetition (at least 1)"
    )
    ap.add_argument(
        "--no-verify",
        action="store_true",
        help="the engine trusts its loads (no check of loaded blocks against recomputed KV); "
        "written as section tier_engine_unverified",
    )
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.event_pairs < 1:
        ap.error("--event-pairs must be at least 1")
    problem = redis_binaries_problem()
    if problem is not None:
        raise SystemExit(f"bench_tier_engine needs redis-server: {problem}")
    torch.set_num_threads(1)
    conv = args.conversations or (16 if args.quick else 48)
    reps = args.reps or (1 if args.quick else 3)
    base = DemoSettings(conversations=conv, verify_loads=not args.no_verify)
    names = ("none", "redis-cold", "redis-warm", "redis-cold-async", "redis-warm-async", "redis-warm-probeonly")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in (*names, "redis-warm-bigbudget")}
    runs.update({"redis-warm-events-off": [], "redis-warm-events": []})
    asynchronous = {"probe_in_lookup": False, "sync_load_budget_bytes": 0}
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-redis-") as tmp:
        server = RedisServer(Path(tmp), maxmemory="2gb").start()
        try:
            with_tier = replace(base, tiers=(server.url,))
            # removal events on: the server publishes its key events, the tier watches them
            events: Any = replace(base, tiers=({"url": server.url, "removal_events": True},))
            for r in range(reps):
                rtt = round_trip_seconds(server.url)
                runs["none"].append(run_once(base))
                for suffix, options in (("", {}), ("-async", asynchronous)):
                    server.cli("flushall")
                    runs[f"redis-cold{suffix}"].append(run_once(with_tier, rtt, **options))
                    runs[f"redis-warm{suffix}"].append(run_once(with_tier, rtt, **options))
                runs["redis-warm-probeonly"].append(run_once(with_tier, rtt, sync_load_budget_bytes=0))
                runs["redis-warm-bigbudget"].append(run_once(with_tier, rtt, sync_load_budget_bytes=32 << 20))
                for pair in range(args.event_pairs):  # alternated: off/on, on/off, ...
                    for on in (pair % 2 == 1, pair % 2 == 0):
                        server.cli("config", "set", "notify-keyspace-events", "Egex" if on else "")
                        name = "redis-warm-events" if on else "redis-warm-events-off"
                        runs[name].append(run_once(events if on else with_tier, rtt))
                server.cli("config", "set", "notify-keyspace-events", "")
                print(
                    f"rep {r + 1}/{reps}: "
                    + ", ".join(f"{k} {v[-1]['cpu_us_per_step']:.0f} us CPU/step" for k, v in runs.items()),
                    flush=True,
                )
        finally:
            server.stop()
    summary: dict[str, Any] = {"conversations": conv, "reps": reps, "verify_loads": base.verify_loads, "runs": runs}
    tiered = [name for name in runs if name != "none" and len(runs[name]) == reps]
    for name in tiered:
        pairs = list(zip(runs["none"], runs[name], strict=True))
        for kind, step_key, busy_key, run_key in (
            ("wall", "us_per_step", "us_per_busy_step", "sched_seconds"),
            ("cpu", "cpu_us_per_step", "cpu_us_per_busy_step", "cpu_seconds"),
        ):
            summary[f"{name}_{kind}_per_step_ratio"] = statistics.median(b[step_key] / a[step_key] for a, b in pairs)
            summary[f"{name}_{kind}_per_busy_step_ratio"] = statistics.median(
                b[busy_key] / a[busy_key] for a, b in pairs
            )
            summary[f"{name}_{kind}_per_run_ratio"] = statistics.median(b[run_key] / a[run_key] for a, b in pairs)
        summary[f"{name}_steps_ratio"] = statistics.median(b["steps"] / a["steps"] for a, b in pairs)
        summary[f"{name}_run_wall_ratio"] = statistics.median(b["wall_seconds"] / a["wall_seconds"] for a, b in pairs)
        for key in (
            "deferred_ms_p50",
            "deferred_ms_p99",
            "deferrals",
            "deferred_requests",
            "tier_requests",
            "waited_ms_p50",
            "waited_ms_p99",
            "transfer_ms_p50",
            "transfer_ms_p99",
            "round_trip_ms",
            "within_bound",
            "blocked_ms_per_step",
            "blocked_ms_max_step",
            "tier_read_gbps",
        ):
            summary[f"{name}_{key}"] = statistics.median(b[key] for b in runs[name])
    for name in runs:
        wall = statistics.median(r["us_per_step"] for r in runs[name])
        cpu = statistics.median(r["cpu_us_per_step"] for r in runs[name])
        steps = statistics.median(r["steps"] for r in runs[name])
        busy = statistics.median(r["busy_steps"] for r in runs[name])
        print(
            f"{name:>11}: {wall:7.0f} us wall, {cpu:7.0f} us engine-thread CPU in scheduler calls per step "
            f"({steps:.0f} steps, {busy:.0f} computing)"
        )
    for name in tiered:
        r = {k.removeprefix(name + "_"): v for k, v in summary.items() if k.startswith(name + "_")}
        print(
            f"{name:>17} / none: engine-thread CPU {r['cpu_per_step_ratio']:.2f}x per step, "
            f"{r['cpu_per_busy_step_ratio']:.2f}x per computing step, {r['cpu_per_run_ratio']:.2f}x per run; "
            f"wall {r['wall_per_step_ratio']:.2f}x / {r['wall_per_busy_step_ratio']:.2f}x / "
            f"{r['wall_per_run_ratio']:.2f}x; steps {r['steps_ratio']:.2f}x, run {r['run_wall_ratio']:.2f}x; "
            f"deferred per request p50 {r['deferred_ms_p50']:.1f} ms, p99 {r['deferred_ms_p99']:.1f} ms "
            f"({r['deferrals']:.0f} deferrals, {r['deferred_requests']:.0f} requests); waited on the tier per "
            f"request p50 {r['waited_ms_p50']:.1f} / p99 {r['waited_ms_p99']:.1f} ms ({r['tier_requests']:.0f} "
            f"requests; their transfer p50 {r['transfer_ms_p50']:.1f} / p99 {r['transfer_ms_p99']:.1f} ms, round "
            f"trip {r['round_trip_ms']:.2f} ms, within {r['within_bound']:.0%}); blocked in lookups "
            f"{r['blocked_ms_per_step']:.2f} ms/step "
            f"(max {r['blocked_ms_max_step']:.1f})"
        )
    on, off = runs["redis-warm-events"], runs["redis-warm-events-off"]
    for kind, key in (("", "sched_seconds"), ("_cpu", "cpu_seconds")):
        per_step = [r[key] / r["steps"] for r in on], [r[key] / r["steps"] for r in off]
        summary[f"events_on_vs_off{kind}_per_step"] = statistics.fmean(per_step[0]) / statistics.fmean(per_step[1])
        # A/A: the off runs of even pairs against those of odd pairs (NaN with a single off run)
        odd = per_step[1][1::2]
        summary[f"events_off_vs_off{kind}_per_step"] = (
            statistics.fmean(per_step[1][::2]) / statistics.fmean(odd) if odd else float("nan")
        )
    print(
        f"removal events on / off (warm, {len(on)} pairs): scheduler-call wall per step "
        f"{summary['events_on_vs_off_per_step']:.3f}x, engine-thread CPU per step "
        f"{summary['events_on_vs_off_cpu_per_step']:.3f}x (goal <= 1.02x); off / off "
        f"{summary['events_off_vs_off_per_step']:.3f}x wall, {summary['events_off_vs_off_cpu_per_step']:.3f}x CPU"
    )
    if not args.no_write:
        path = RESULTS_DIR / f"{machine_slug()}-tier-engine.json"
        write_section("tier_engine_unverified" if args.no_verify else "tier_engine", summary, path)
        print(f"written to {path}")
    return summary


if __name__ == "__main__":
    main()
