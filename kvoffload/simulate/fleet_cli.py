"""``kvoffload simulate --replicas``: size a fleet of replicas behind a router, not one node.

Replays the workload's prompt blocks (the cache-level replay) across each number of replicas in
``--replicas``, for each routing in ``--routing``, each policy, each host capacity per replica
(``--capacities``) and each shared-tier capacity (``--tier-capacity``, 0 always included)
(:mod:`kvoffload.simulate.fleet`, :mod:`kvoffload.simulate.routing`), and reports per fleet where the prompt
tokens came from, load balance, the shared tier's traffic and the prefill GPU-seconds saved
(:mod:`kvoffload.simulate.fleet_report`): a table, ``fleet.csv``, ``fleet.json``, ``fleet.png``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.cache_cli import block_trace_of
from kvoffload.simulate.capacity import to_blocks
from kvoffload.simulate.fleet import FleetResult, FleetTrace
from kvoffload.simulate.fleet_report import (
    PREFILL_TOKENS_PER_S,
    fleet_rows,
    fleet_table,
    imbalance_lines,
    write_fleet,
)
from kvoffload.simulate.fleet_sweep import FleetSpec, sweep_fleet
from kvoffload.simulate.model_config import ConfigShape
from kvoffload.simulate.mooncake import MooncakeRequest
from kvoffload.simulate.routing import LOAD_WINDOW_S, check_routings
from kvoffload.simulate.sweep import ModelShape
from kvoffload.simulate.units import size_label

__all__ = ["fleet_trace_of", "run_fleet"]

#: the fleet's routings when ``--routing`` is not given
DEFAULT_ROUTINGS = ("random", "least-loaded", "session", "prefix")


def fleet_trace_of(items: list[Any], block_tokens: int, trace_block_tokens: int) -> FleetTrace:
    """The workload as a :class:`FleetTrace`: Mooncake requests with their arrival times, any other
    workload with one request per second."""
    if items and isinstance(items[0], MooncakeRequest):
        return FleetTrace.from_mooncake(items, trace_block_tokens, block_tokens)
    return FleetTrace.untimed(block_trace_of(items, block_tokens, trace_block_tokens))


def prefill_rate(args: argparse.Namespace) -> tuple[float, str]:
    """``--prefill-tokens-per-s`` or the named shape's default, and where it came from."""
    if args.prefill_tokens_per_s is not None:
        return float(args.prefill_tokens_per_s), "--prefill-tokens-per-s"
    if getattr(args, "model_config", None):
        raise InvalidArgumentError(
            "--model-config with --replicas needs --prefill-tokens-per-s (the named shapes' defaults do not apply)"
        )
    return PREFILL_TOKENS_PER_S[args.model], f"default for --model {args.model}"


def run_fleet(
    args: argparse.Namespace,
    items: list[Any],
    source: str,
    shape: ModelShape | ConfigShape,
    trace_block: int,
    tiers: list[int],
    out_dir: Callable[[str], Path],
    jobs: int,
) -> int:
    """The fleet sweep of ``run_simulate`` (``--replicas`` given; ``out_dir`` creates ``--out``
    once every flag is checked)."""
    routings = check_routings(args.routing or DEFAULT_ROUTINGS)
    replicas = sorted(set(args.replicas))
    if not args.capacities:
        raise InvalidArgumentError("--replicas needs --capacities (host memory per replica, e.g. 1Mtok,3Mtok)")
    if args.replay == "engine":
        raise InvalidArgumentError("--replicas needs the cache-level replay (--replay cache or auto)")
    if getattr(args, "trace_block_view", None) is not None:
        raise InvalidArgumentError("--trace-block-view is a single-node figure: drop it with --replicas")

    block_bytes = shape.bytes_per_token * args.block_size
    capacities = sorted({to_blocks(v, u, block_bytes, args.block_size) for v, u in args.capacities})
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else ["lru"]
    rate, rate_from = prefill_rate(args)
    window = LOAD_WINDOW_S if args.load_window is None else args.load_window
    spec = FleetSpec(routings, replicas, policies, capacities, tiers, args.seed, window)
    ft = fleet_trace_of(items, args.block_size, trace_block)
    out = out_dir(args.out)
    n_fleets = len(routings) * len(replicas) * len(policies) * len(capacities) * len(tiers)
    print(f"kvoffload simulate --replicas: {source}")
    print(f"  model shape:     {shape.describe()} = {size_label(shape.bytes_per_token)} of KV per token")
    print(f"  blocks:          {args.block_size} tokens ({size_label(block_bytes)}); {ft.trace.num_blocks:,} distinct")
    print(
        f"  fleets:          {n_fleets} ({', '.join(routings)} x replicas {replicas} x {len(capacities)} host x "
        f"{len(tiers)} tier capacities x {len(policies)} policies) on {jobs} processes"
    )
    print(
        f"  load model:      prompt tokens routed to a replica over the last {window:g} s of trace time "
        "(least-loaded; ties of session and prefix)"
    )
    arrival = (
        f"{ft.trace.num_requests:,} requests over {ft.duration_s:,.0f} s (the trace's own arrival times)"
        if ft.timed
        else "no arrival times: one request per second assumed (tier GB/s follow from that)"
    )
    print(f"  arrivals:        {arrival}")
    print(f"  prefill:         {rate:,.0f} tokens/s per GPU ({rate_from})", flush=True)

    def progress(done: int, total: int, r: FleetResult, elapsed: float) -> None:
        print(
            f"  [{done:>3}/{total}] {r.routing:<12} {r.replicas:>3} replicas  host {r.capacity:,} blocks  "
            f"tier {r.tier_capacity:,}  loaded {r.hit_tokens / (r.prompt_tokens or 1):6.1%}  "
            f"({r.seconds:.1f} s; {elapsed:.0f} s elapsed)",
            flush=True,
        )

    results = sweep_fleet(ft, spec, jobs, progress)
    rows = fleet_rows(results, ft, block_bytes, rate)
    print(
        "prompt tokens by where they came from (host pool of the replica / shared tier / computed), "
        "load balance, shared tier traffic, prefill saved:"
    )
    print(fleet_table(rows))
    for line in imbalance_lines(rows):
        print(line)
    settings = {
        "source": source,
        "model_shape": {"describe": shape.describe(), "bytes_per_token": shape.bytes_per_token},
        "block_tokens": args.block_size,
        "block_bytes": block_bytes,
        "routings": routings,
        "replicas": replicas,
        "policies": policies,
        "capacities_blocks": capacities,
        "tier_capacities_blocks": tiers,
        "load_window_s": window,
        "prefill_tokens_per_s": rate,
        "timed_arrivals": ft.timed,
        "duration_s": ft.duration_s,
        "seed": args.seed,
    }
    paths = write_fleet(rows, settings, out, args.plot)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
