"""``python -m kvoffload simulate``: how much host memory, and which policy?

Replays a workload (the demo's multi-turn chat, a kvoffload JSONL trace or a Mooncake trace) for
every policy and a range of CPU-tier capacities, without moving KV bytes, in one of two ways:

* ``engine``: through the reference engine, its scheduler and a
  :class:`~kvoffload.cache.manager.CPUOffloadingManager` (:class:`NullTransferWorker`, a one-row
  KV): GPU prefix cache, concurrency, chunked prefill and generated blocks included;
* ``cache``: the prompts' offloaded blocks straight through the same manager and policies
  (:mod:`kvoffload.simulate.cache_replay`), with Belady's optimum and the infinite cache beside them
  (:mod:`kvoffload.simulate.optimal`), the runs spread over ``--jobs`` processes. The default for
  workloads of more than :data:`ENGINE_REPLAY_MAX_TOKENS` prompt tokens.
With ``--tier-capacity`` the cache-level replay also puts a shared tier (Redis with
``allkeys-lru``, :mod:`kvoffload.simulate.shared_tier`) of each given size beneath every host
capacity, and the report splits the prompt tokens loaded into those found in host memory and those
promoted from the tier.
Capacities are reported in bytes of host memory for a stated model shape
(:class:`ModelShape`; default an 8B-class model) as well as in offloaded blocks. Writes
``hit_rate.png``, ``results.csv`` and ``results.json`` into the output directory (default
``./simulate-out``); the report is in :mod:`kvoffload.simulate.report`.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvoffload.cache.policies.base import available_policies
from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.reference.request import SimRequest
from kvoffload.engine.reference.workload import TraceRequest, read_trace
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.bailian import BAILIAN_BLOCK_TOKENS, read_bailian_trace
from kvoffload.simulate.capacity import capacity_blocks
from kvoffload.simulate.flags import policy_names
from kvoffload.simulate.model_config import ConfigShape, read_model_config
from kvoffload.simulate.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeRequest,
    detect_trace_format,
    piece_hash,
    prompt_piece_ids,
    read_mooncake_trace,
)
from kvoffload.simulate.suite import suite_workload
from kvoffload.simulate.sweep import (
    DTYPE_BYTES,
    HASH_BLOCK_TOKENS,
    MODEL_SHAPES,
    ModelShape,
    SimPoint,
    default_capacities,
    log_capacities,
    spread_capacities,
    stored_blocks_bound,
    working_set_blocks,
)
from kvoffload.simulate.trace_block_view import trace_block_view

__all__ = [
    "DTYPE_BYTES",
    "ENGINE_REPLAY_MAX_TOKENS",
    "MODEL_SHAPES",
    "ModelShape",
    "SimPoint",
    "default_capacities",
    "run_simulate",
    "simulate",
    "working_set_blocks",
]


def _to_request(t: TraceRequest) -> SimRequest:
    if t.token_ids is not None:
        return SimRequest(t.request_id, t.token_ids, t.max_tokens)
    return SimRequest(
        t.request_id, None, t.max_tokens, prompt_block_hashes=t.block_hashes, num_prompt_tokens=t.num_tokens
    )


#: ``--replay auto`` uses the engine replay up to this many prompt tokens in the workload
ENGINE_REPLAY_MAX_TOKENS = 1_000_000


def _mooncake_to_trace(reqs: list[MooncakeRequest], trace_block_tokens: int) -> list[TraceRequest]:
    """Mooncake requests as engine trace requests: one 16-token block hash per piece
    (:func:`~kvoffload.simulate.mooncake.prompt_piece_ids`), ``output_length`` tokens decoded."""
    return [
        TraceRequest(
            f"r{r.line}",
            None,
            tuple(piece_hash(p) for p in prompt_piece_ids(r, trace_block_tokens)),
            r.input_length,
            r.output_length,
            r.line,
        )
        for r in reqs
    ]


def simulate(
    items: list[Any],
    settings: DemoSettings,
    policies: list[str],
    capacities: list[int],
    verbose: bool = True,
    block_bytes: int = 0,
) -> list[SimPoint]:
    """Run every (policy, capacity) pair; items are chat turns or :class:`TraceRequest`\\ s.

    ``block_bytes`` (bytes of one offloaded block for the model shape) only converts capacities
    to ``cpu_gib``; the simulated engine moves no bytes.
    """
    # the engine replay's modules (torch among them) are imported only when it runs
    from kvoffload.engine.reference.config import EngineConfig, GroupConfig
    from kvoffload.engine.reference.drive import drive
    from kvoffload.engine.reference.engine import Engine
    from kvoffload.engine.reference.null_worker import NullTransferWorker

    group = GroupConfig(settings.gpu_block_size, settings.block_size_factor, None, 1)
    points: list[SimPoint] = []
    width = max(len(p) for p in policies)
    for policy in policies:
        for cap in capacities:
            config = EngineConfig(
                groups=(group,),
                num_gpu_blocks=settings.gpu_blocks,
                num_cpu_blocks=cap,
                num_heads=1,
                head_dim=4,
                max_num_seqs=settings.max_concurrent,
                verify_loads=False,
                track_stored_keys=True,
                cache_policy=policy,
                seed=settings.seed,
                device="cpu",
            )
            engine = Engine(config, worker=NullTransferWorker())
            t0 = time.perf_counter()
            # Trace requests are single-use objects: rebuild them for every run.
            run_items = [_to_request(it) if isinstance(it, TraceRequest) else it for it in items]
            drive(engine, run_items, settings.max_concurrent)
            engine.shutdown()
            s = engine.stats
            served = s.served_tokens
            p = SimPoint(
                policy=policy,
                cpu_blocks=cap,
                cpu_gib=cap * block_bytes / 2**30,
                cpu_tokens=cap * group.offloaded_block_size,
                prompt_tokens=s.prompt_tokens,
                served_tokens=served,
                cpu_hit_tokens=s.prefill_loaded_tokens,
                gpu_hit_tokens=s.prefill_gpu_hit_tokens,
                computed_prefill_tokens=s.prefill_computed_tokens,
                cpu_hit_rate=s.prefill_loaded_tokens / served if served else 0.0,
                hit_rate=(s.prefill_loaded_tokens + s.prefill_gpu_hit_tokens) / served if served else 0.0,
                cpu_evictions=s.cpu_evictions,
                distinct_blocks_stored=s.distinct_blocks_stored,
                preemptions=s.preemptions,
                seconds=time.perf_counter() - t0,
            )
            points.append(p)
            if verbose:
                size = f"{p.cpu_gib:8.2f} GiB " if block_bytes else ""
                print(
                    f"  {policy:<{width}}  {size}{cap:>8,} blocks   from CPU tier {p.cpu_hit_rate:6.1%}   "
                    f"GPU + CPU {p.hit_rate:6.1%}   evicted {p.cpu_evictions:>8,} blocks   ({p.seconds:.1f} s)",
                    flush=True,
                )
    return points


def _shape(args: argparse.Namespace) -> ModelShape | ConfigShape:
    if getattr(args, "model_config", None):
        given = [f for f in ("layers", "kv_heads", "head_dim") if getattr(args, f)]
        if given:
            raise InvalidArgumentError(
                f"--model-config gives the shape: drop --{given[0].replace('_', '-')} (only --dtype overrides it)"
            )
        return read_model_config(args.model_config, args.dtype)
    base = MODEL_SHAPES[args.model]
    return ModelShape(
        args.layers or base.layers,
        args.kv_heads or base.kv_heads,
        args.head_dim or base.head_dim,
        args.dtype or base.dtype,
    )


def _read_workload(args: argparse.Namespace, settings: DemoSettings) -> tuple[list[Any], str, int]:
    """The workload's items, its description (a trace by its file name) and the trace block size
    (tokens per hash)."""
    if getattr(args, "suite", None):
        if args.trace:
            raise InvalidArgumentError("--suite and --trace are exclusive: pick one workload")
        generated = suite_workload(args.suite, args.seed)
        return generated, f"suite workload {args.suite} ({len(generated):,} requests)", HASH_BLOCK_TOKENS
    if args.trace is not None and not args.trace.strip():
        raise InvalidArgumentError("--trace names no file: give a JSONL trace (or drop the flag for the chat workload)")
    if not args.trace:
        if args.trace_format != "auto" or args.trace_block_size is not None:
            raise InvalidArgumentError("--trace-format and --trace-block-size need --trace")
        items = list(settings.workload())
        return items, f"chat workload ({settings.conversations} conversations x {settings.turns} turns)", 16
    try:
        return _read_trace(args)
    except InvalidArgumentError as exc:  # the trace's own errors (unreadable, a bad line) name the flag too
        raise InvalidArgumentError(str(exc) if str(exc).startswith("--") else f"--trace: {exc}") from None


def _read_trace(args: argparse.Namespace) -> tuple[list[Any], str, int]:
    fmt = detect_trace_format(args.trace) if args.trace_format == "auto" else args.trace_format
    name = Path(args.trace).name  # the report's and the plot title's: the file's name, not its path
    if fmt == "bailian":
        if args.trace_block_size not in (None, BAILIAN_BLOCK_TOKENS):
            raise InvalidArgumentError(f"--trace-block-size: a Bailian trace has {BAILIAN_BLOCK_TOKENS}-token blocks")
        breqs = read_bailian_trace(args.trace)
        return breqs, f"Bailian trace {name} ({len(breqs):,} requests)", BAILIAN_BLOCK_TOKENS
    if fmt == "mooncake":
        tb = MOONCAKE_BLOCK_TOKENS if args.trace_block_size is None else args.trace_block_size
        reqs = read_mooncake_trace(args.trace, tb)
        return reqs, f"Mooncake trace {name} ({len(reqs):,} requests)", tb
    if args.trace_block_size not in (None, HASH_BLOCK_TOKENS):
        raise InvalidArgumentError(
            f"--trace-block-size {args.trace_block_size}: a kvoffload trace hashes {HASH_BLOCK_TOKENS}-token blocks; "
            "the option is for Mooncake traces"
        )
    trace_items = list(read_trace(args.trace, HASH_BLOCK_TOKENS))
    return trace_items, f"trace {name} ({len(trace_items):,} requests)", HASH_BLOCK_TOKENS


def _prompt_tokens(items: list[Any]) -> int:
    return sum(
        it.input_length
        if isinstance(it, MooncakeRequest)
        else getattr(it, "num_tokens", None) or len(it.prompt_token_ids)
        for it in items
    )


def run_simulate(args: argparse.Namespace) -> int:
    """CLI entry: validate every flag and the trace, simulate, write PNG/CSV/JSON, print the report."""
    from kvoffload.simulate.cache_cli import block_trace_of, run_cache_sweep, trace_blocks
    from kvoffload.simulate.report import SweepReport

    policies = available_policies() if args.policies is None else policy_names(args.policies)
    if args.block_size % HASH_BLOCK_TOKENS:
        raise InvalidArgumentError(
            f"--block-size must be a multiple of the {HASH_BLOCK_TOKENS}-token GPU block, got {args.block_size}"
        )
    jobs = args.jobs or min(len(os.sched_getaffinity(0)), 8)
    shape = _shape(args)
    factor = args.block_size // HASH_BLOCK_TOKENS
    block_bytes = shape.bytes_per_token * args.block_size
    overrides: dict[str, Any] = {"seed": args.seed, "gpu_block_size": HASH_BLOCK_TOKENS, "block_size_factor": factor}
    if args.gpu_blocks:
        overrides["gpu_blocks"] = args.gpu_blocks
    if args.conversations:
        overrides["conversations"] = args.conversations
    settings = replace(DemoSettings(), **overrides)
    items, source, trace_block = _read_workload(args, settings)
    raw_items = items
    tier_groups = getattr(args, "tier_capacity", None)
    tier_items = [t for group in tier_groups or [] for t in group]
    tiers = [0] if tier_groups is None else capacity_blocks(tier_items, block_bytes, args.block_size, "--tier-capacity")
    tiers = [0, *tiers] if tiers[0] else tiers
    replay = args.replay
    if getattr(args, "replicas", None):
        from kvoffload.simulate.fleet_cli import run_fleet

        return run_fleet(args, items, source, shape, trace_block, tiers, _out_dir, jobs)
    if len(tiers) > 1 and replay == "engine":
        raise InvalidArgumentError("--tier-capacity needs the cache-level replay (--replay cache or auto)")
    if replay == "auto":
        small = _prompt_tokens(items) <= ENGINE_REPLAY_MAX_TOKENS
        replay = "engine" if small and len(tiers) == 1 else "cache"
    if replay == "engine":
        if items and isinstance(items[0], MooncakeRequest):
            items = _mooncake_to_trace(items, trace_block)
        if args.trace:
            _check_fits(items, settings, args.trace)
        ws = working_set_blocks(items, HASH_BLOCK_TOKENS, factor)
        bound = stored_blocks_bound(items, args.block_size)
    else:
        btrace = block_trace_of(items, args.block_size, trace_block)
        ws = bound = btrace.num_blocks  # the cache-level replay stores prompt blocks only
    if args.capacities is not None:
        capacities = capacity_blocks(args.capacities, block_bytes, args.block_size)
    else:
        capacities = default_capacities(ws) if replay == "engine" else log_capacities(ws)
    # a pool of `bound` blocks never fills: a larger one is run at that size (same figures, no giant pool)
    run_caps = sorted({max(1, min(c, bound)) for c in capacities})
    out = _out_dir(args.out)
    report = SweepReport(source, shape, settings, policies, capacities, ws, block_bytes, replay, tiers)
    print(report.header(), flush=True)
    if capacities[-1] > bound:
        print(
            f"  larger than:     {max(1, bound):,} blocks, the most this workload can store: capacities above it "
            "never fill and run at that size",
            flush=True,
        )
    if replay == "engine":
        import torch

        torch.set_num_threads(1)  # tiny tensors: more threads only contend
        points = simulate(items, settings, policies, run_caps, block_bytes=block_bytes)
        points = spread_capacities(points, capacities, max(1, bound), block_bytes, args.block_size)
        print(report.finish(points, out, plot=args.plot))
    else:
        print(
            f"  replay:          cache-level, {jobs} processes; Belady's optimum and the infinite cache beside",
            flush=True,
        )
        swept = run_cache_sweep(btrace, policies, run_caps, jobs, block_bytes, tier_capacities=tiers)
        swept = swept.at_capacities(capacities, max(1, bound), block_bytes, args.block_size)
        print(report.finish(swept.points, out, swept, plot=args.plot))
    if args.trace_block_view is not None:
        print(report.trace_block_line(trace_block_view(trace_blocks(raw_items), args.trace_block_view), trace_block))
    return 0


def _out_dir(path: str) -> Path:
    if not path.strip():
        raise InvalidArgumentError("--out names no directory: give one (default ./simulate-out)")
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"--out {out} cannot be created: {exc}") from None
    return out


def _check_fits(items: list[TraceRequest], settings: DemoSettings, path: str) -> None:
    """Every trace request must fit the GPU cache (prompt + max_tokens), checked before the run."""
    from kvoffload.engine.reference.config import max_request_tokens

    room = max_request_tokens(settings.gpu_blocks, settings.gpu_block_size)
    for it in items:
        if it.num_tokens + it.max_tokens > room:
            raise InvalidArgumentError(
                f"{path}:{it.line}: request_id {it.request_id!r} needs {it.num_tokens + it.max_tokens:,} tokens "
                f"(num_tokens + max_tokens), the GPU cache holds {room:,}: raise --gpu-blocks (or --replay cache)"
            )
