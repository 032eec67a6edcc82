"""``kvoffload simulate --replicas``: size a fleet of replicas behind a router, not one node.

Replays the workload's prompt blocks (the cache-level replay) across each number of replicas in
``--replicas``, for each routing in ``--routing``, each policy, each host capacity per replica
(``--capacities``, and none: the fleet without offloading) and each shared-tier capacity
(``--tier-capacity``, 0 always included) (:mod:`kvoffload.simulate.fleet`,
:mod:`kvoffload.simulate.routing`, :mod:`kvoffload.simulate.kv_router`), puts time on it with the
engine-time model at each ``--rate-scale`` (:mod:`kvoffload.simulate.engine_time`, rates from
:mod:`kvoffload.simulate.gpu_profile`), and reports per fleet where the prompt tokens came from,
TTFT, queueing, utilisation, load balance and the shared tier's traffic, then the replicas needed
for ``--ttft-target`` (:mod:`kvoffload.simulate.fleet_tables`): ``fleet.csv``, ``fleet.json``,
``fleet.png`` (TTFT p99 vs replicas) and ``fleet_hit_rate.png`` (hit rate vs host memory).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.cache_cli import block_trace_of
from kvoffload.simulate.capacity import capacity_blocks
from kvoffload.simulate.engine_time import CHUNK_TOKENS, TIER_GBPS, EngineTime
from kvoffload.simulate.flags import policy_names
from kvoffload.simulate.fleet import FleetResult, FleetTrace
from kvoffload.simulate.fleet_report import fleet_rows, write_rows
from kvoffload.simulate.fleet_sweep import FleetSpec, sweep_fleet
from kvoffload.simulate.fleet_tables import (
    fleet_table,
    floor_line,
    imbalance_lines,
    replicas_needed,
    replicas_table,
)
from kvoffload.simulate.gpu_profile import MAX_RATE, MODEL_COMPUTE, gpu_profile
from kvoffload.simulate.kv_router import KV_AWARE, KV_WEIGHT, MAX_KV_WEIGHT
from kvoffload.simulate.model_config import ConfigShape
from kvoffload.simulate.mooncake import MooncakeRequest
from kvoffload.simulate.routing import LOAD_WINDOW_S, check_routings
from kvoffload.simulate.sweep import ModelShape
from kvoffload.simulate.units import size_label

__all__ = ["DEFAULT_ROUTINGS", "fleet_trace_of", "parse_numbers", "parse_seconds", "run_fleet"]

#: the fleet's routings when ``--routing`` is not given
DEFAULT_ROUTINGS = ("random", "least-loaded", "session", KV_AWARE)
#: the most replicas one fleet may have (each is a manager in memory)
MAX_REPLICAS = 4096
#: the largest --rate-scale
MAX_RATE_SCALE = 1e6


def fleet_trace_of(items: list[Any], block_tokens: int, trace_block_tokens: int) -> FleetTrace:
    """The workload as a :class:`FleetTrace`: Mooncake requests with their arrival times, any other
    workload with one request per second."""
    if items and isinstance(items[0], MooncakeRequest):
        return FleetTrace.from_mooncake(items, trace_block_tokens, block_tokens)
    return FleetTrace.untimed(block_trace_of(items, block_tokens, trace_block_tokens))


def parse_numbers(text: str | None, flag: str, default: list[float], maximum: float, zero: bool = False) -> list[float]:
    """Comma-separated finite numbers in ``(0, maximum]`` (``[0, maximum]`` with ``zero``), each once,
    sorted; an :class:`InvalidArgumentError` naming ``flag`` otherwise."""
    if text is None:
        return list(default)
    what = (
        f"comma-separated numbers in [0, {maximum:g}]"
        if zero
        else f"comma-separated positive numbers up to {maximum:g}"
    )
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            v = float(part)
        except ValueError:
            raise InvalidArgumentError(f"{flag} must be {what}, got {part!r}") from None
        if not math.isfinite(v) or v > maximum or v < 0 or (v == 0 and not zero):
            raise InvalidArgumentError(f"{flag} must be {what}, got {part!r}")
        if v in out:
            raise InvalidArgumentError(f"{flag} names {v:g} twice; give each value once")
        out.append(v)
    if not out:
        raise InvalidArgumentError(f"{flag} must be {what}, got {text!r}")
    return sorted(out)


def parse_seconds(text: str | None, flag: str, default: float) -> float:
    """A duration: ``2s``, ``500ms`` or a number of seconds, positive and at most 10^6 s."""
    if text is None:
        return default
    s = text.strip().lower()
    scale = 1e-3 if s.endswith("ms") else 1.0
    body = s[:-2] if s.endswith("ms") else s[:-1] if s.endswith("s") else s
    try:
        v = float(body) * scale
    except ValueError:
        raise InvalidArgumentError(f"{flag} must be a duration such as 2s or 500ms, got {text!r}") from None
    if not math.isfinite(v) or not 0 < v <= 1e6:
        raise InvalidArgumentError(f"{flag} must be a positive duration up to 1000000s, got {text!r}")
    return v


def _int_flag(value: Any, flag: str, default: int, maximum: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidArgumentError(f"{flag} must be a positive integer up to {maximum:,}, got {value!r}")
    return value


def engine_time_of(args: argparse.Namespace, shape: ModelShape | ConfigShape) -> EngineTime:
    """The engine-time model of the flags: ``--gpu``, ``--model`` (or ``--model-config`` with
    ``--prefill-tokens-per-s``), ``--link-gbps``, ``--tier-gbps``, ``--chunk-tokens``."""
    gpu = gpu_profile(getattr(args, "gpu", None) or "h100")
    model = None if getattr(args, "model_config", None) else MODEL_COMPUTE[args.model]
    link = parse_numbers(getattr(args, "link_gbps", None), "--link-gbps", [gpu.link_gbps], MAX_RATE)
    tier = parse_numbers(getattr(args, "tier_gbps", None), "--tier-gbps", [TIER_GBPS], MAX_RATE)
    if len(link) > 1 or len(tier) > 1:
        raise InvalidArgumentError("--link-gbps and --tier-gbps take one number each")
    chunk = _int_flag(getattr(args, "chunk_tokens", None), "--chunk-tokens", CHUNK_TOKENS, 2**31)
    rate = args.prefill_tokens_per_s
    if rate is not None and not (math.isfinite(rate) and 0 < rate <= 1e9):
        raise InvalidArgumentError(f"--prefill-tokens-per-s must be a positive number up to 1e9, got {rate!r}")
    return EngineTime.build(gpu, model, shape.bytes_per_token, chunk, rate, link[0], tier[0])


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
    routings = check_routings(DEFAULT_ROUTINGS if args.routing is None else args.routing)
    if len(set(args.replicas)) != len(args.replicas):
        raise InvalidArgumentError(f"--replicas names a count twice ({args.replicas}); give each count once")
    replicas = sorted(args.replicas)
    if replicas[-1] > MAX_REPLICAS:
        raise InvalidArgumentError(f"--replicas must be at most {MAX_REPLICAS:,}, got {replicas[-1]:,}")
    if not args.capacities:
        raise InvalidArgumentError("--replicas needs --capacities (host memory per replica, e.g. 1Mtok,3Mtok)")
    if args.replay == "engine":
        raise InvalidArgumentError("--replicas needs the cache-level replay (--replay cache or auto)")
    if getattr(args, "trace_block_view", None) is not None:
        raise InvalidArgumentError("--trace-block-view is a single-node figure: drop it with --replicas")
    block_bytes = shape.bytes_per_token * args.block_size
    capacities = capacity_blocks(args.capacities, block_bytes, args.block_size)
    policies = ["lru"] if args.policies is None else policy_names(args.policies)
    window = LOAD_WINDOW_S if args.load_window is None else args.load_window
    scales = parse_numbers(getattr(args, "rate_scale", None), "--rate-scale", [1.0], MAX_RATE_SCALE)
    weights = parse_numbers(getattr(args, "kv_weight", None), "--kv-weight", [KV_WEIGHT], MAX_KV_WEIGHT, zero=True)
    target = parse_seconds(getattr(args, "ttft_target", None), "--ttft-target", 2.0)
    et = engine_time_of(args, shape)
    spec = FleetSpec(routings, replicas, policies, capacities, tiers, args.seed, window, scales, weights, True)
    ft = fleet_trace_of(items, args.block_size, trace_block)
    out = out_dir(args.out)
    trace_name = Path(args.trace).name if getattr(args, "trace", None) else source.split(" (")[0]
    n_fleets = len(spec.keys())
    print(f"kvoffload simulate --replicas: {source}")
    print(f"  model shape:     {shape.describe()} = {size_label(shape.bytes_per_token)} of KV per token")
    print(f"  blocks:          {args.block_size} tokens ({size_label(block_bytes)}); {ft.trace.num_blocks:,} distinct")
    print(
        f"  fleets:          {n_fleets} ({', '.join(routings)} x replicas {replicas} x {len(capacities)} host "
        f"capacities + none x {len(tiers)} tier capacities x {len(policies)} policies; kv-aware x rate scales "
        f"{scales} x weights {weights}) on {jobs} processes"
    )
    print(f"  load model:      prompt tokens routed to a replica over the last {window:g} s of trace time "
          "(least-loaded; new conversations of session; ties of prefix)")  # fmt: skip
    arrival = (
        f"{ft.trace.num_requests:,} requests over {ft.duration_s:,.0f} s (the trace's own arrival times)"
        if ft.timed
        else "no arrival times: one request per second assumed (tier GB/s and TTFT follow from that)"
    )
    print(f"  arrivals:        {arrival}; rate scales {', '.join(f'{s:g}x' for s in scales)}")
    print(f"  engine time:     {et.describe}", flush=True)

    def progress(done: int, total: int, r: FleetResult, elapsed: float) -> None:
        w = f" w={r.kv_weight:g} at {r.rate_scale:g}x" if r.kv_weight is not None else ""
        print(
            f"  [{done:>3}/{total}] {r.routing:<12}{w} {r.replicas:>3} replicas  host {r.capacity:,} blocks  "
            f"tier {r.tier_capacity:,}  loaded {r.hit_tokens / (r.prompt_tokens or 1):6.1%}  "
            f"({r.seconds:.1f} s; {elapsed:.0f} s elapsed)",
            flush=True,
        )

    results = sweep_fleet(ft, spec, jobs, progress, et)
    rows = fleet_rows(results, ft, block_bytes, et, scales)
    print(
        "per fleet: memory (host tokens per replica + shared tier), arrival rate, prompt tokens loaded from the host "
        "pool / the tier, TTFT and mean queueing delay (s), busiest replica's utilisation, balance, tier traffic, "
        "prefill GPU-seconds saved:"
    )
    print(fleet_table(rows))
    for line in imbalance_lines(rows):
        print(line)
    needed = replicas_needed(rows, target)
    print(replicas_table(needed, target))
    print(floor_line(rows))
    settings = {
        "source": source,
        "trace_name": trace_name,
        "model_shape": {"describe": shape.describe(), "bytes_per_token": shape.bytes_per_token},
        "block_tokens": args.block_size,
        "block_bytes": block_bytes,
        "routings": routings,
        "replicas": replicas,
        "policies": policies,
        "capacities_blocks": capacities,
        "tier_capacities_blocks": tiers,
        "load_window_s": window,
        "rate_scales": scales,
        "kv_weights": weights,
        "ttft_target_s": target,
        "engine_time": {
            "describe": et.describe,
            "prefill_tokens_per_s": et.prefill_tokens_per_s,
            "attn_s": et.attn_s,
            "step_s": et.step_s,
            "kv_read_s": et.kv_read_s,
            "link_s_per_token": et.link_s,
            "tier_s_per_token": et.tier_s,
            "chunk_tokens": et.chunk_tokens,
        },
        "timed_arrivals": ft.timed,
        "duration_s": ft.duration_s,
        "seed": args.seed,
        "replicas_needed": [
            {
                "routing": n.routing,
                "memory": n.memory,
                "rate_scale": n.rate_scale,
                "replicas": n.replicas,
                "most_swept": n.most_swept,
            }  # fmt: skip
            for n in needed
        ],
    }
    paths = write_rows(rows, settings, out)
    if args.plot:
        from kvoffload.simulate.fleet_plot import plot_fleet

        paths += plot_fleet(rows, trace_name, target, out)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
