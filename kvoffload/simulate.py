"""``python -m kvoffload simulate``: how much host memory, and which policy?

Replays a workload (the demo's multi-turn chat, or a JSONL trace) through the reference engine,
its scheduler and a :class:`~kvoffload.offload.manager.CPUOffloadingManager` for every policy and
a range of CPU-tier capacities, without moving KV bytes (:class:`NullTransferWorker`, a one-row
KV). Writes ``hit_rate.png`` (tokens served from the CPU tier vs capacity, one line per policy),
``results.csv`` and ``results.json`` into the output directory.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvoffload.demo import DemoSettings, drive
from kvoffload.errors import InvalidArgumentError
from kvoffload.offload.policies.base import available_policies, get_policy_class
from kvoffload.sim.config import EngineConfig, GroupConfig
from kvoffload.sim.engine import Engine
from kvoffload.sim.null_worker import NullTransferWorker
from kvoffload.sim.request import SimRequest, hash_blocks
from kvoffload.sim.workload import ChatWorkload, TraceRequest, read_trace

__all__ = ["SimPoint", "simulate", "default_capacities", "plot_hit_rates", "run_simulate"]

_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1.0, 1.25)


@dataclass(frozen=True)
class SimPoint:
    """One (policy, capacity) run."""

    policy: str
    cpu_blocks: int
    cpu_tokens: int
    prompt_tokens: int
    admitted_tokens: int
    cpu_hit_tokens: int
    gpu_hit_tokens: int
    cpu_hit_rate: float
    hit_rate: float
    cpu_evictions: int
    seconds: float


def _to_request(t: TraceRequest) -> SimRequest:
    if t.token_ids is not None:
        return SimRequest(t.request_id, t.token_ids, t.max_tokens)
    return SimRequest(
        t.request_id, None, t.max_tokens, prompt_block_hashes=t.block_hashes, num_prompt_tokens=t.num_tokens
    )


def working_set_blocks(items: list[Any], block_size: int) -> int:
    """Distinct full prompt blocks of ``block_size`` tokens over all requests."""
    seen: set[bytes] = set()
    for it in items:
        if isinstance(it, TraceRequest) and it.block_hashes is not None:
            seen.update(it.block_hashes)
        else:
            tokens = it.token_ids if isinstance(it, TraceRequest) else it.prompt_token_ids
            seen.update(hash_blocks(tokens, block_size))
    return len(seen)


def default_capacities(working_set_offloaded_blocks: int) -> list[int]:
    """Capacities from 1/16 to 1.25x the working set, in offloaded blocks."""
    w = max(working_set_offloaded_blocks, 16)
    return sorted({max(1, round(w * f)) for f in _FRACTIONS})


def simulate(
    items: list[Any], settings: DemoSettings, policies: list[str], capacities: list[int], verbose: bool = True
) -> list[SimPoint]:
    """Run every (policy, capacity) pair; items are chat turns or :class:`SimRequest`s."""
    group = GroupConfig(settings.gpu_block_size, settings.block_size_factor, None, 1)
    points: list[SimPoint] = []
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
            p = SimPoint(
                policy,
                cap,
                cap * group.offloaded_block_size,
                s.prompt_tokens,
                s.admitted_tokens,
                s.loaded_tokens,
                s.gpu_hit_tokens,
                s.cpu_hit_rate,
                s.hit_rate,
                s.cpu_evictions,
                time.perf_counter() - t0,
            )
            points.append(p)
            if verbose:
                print(
                    f"  {policy:>8}  {cap:>7} blocks  CPU-tier hit {p.cpu_hit_rate:6.1%}  "
                    f"total hit {p.hit_rate:6.1%}  evictions {p.cpu_evictions:>6}  ({p.seconds:.1f}s)",
                    flush=True,
                )
    return points


def plot_hit_rates(points: list[SimPoint], path: Path, title: str, tokens_per_block: int) -> Path:
    """Hit rate vs CPU capacity, one line per policy (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for policy in dict.fromkeys(p.policy for p in points):
        pts = sorted((p for p in points if p.policy == policy), key=lambda p: p.cpu_blocks)
        ax.plot([p.cpu_blocks for p in pts], [100 * p.cpu_hit_rate for p in pts], marker="o", label=policy)
    ax.set_xlabel(f"CPU tier capacity (offloaded blocks of {tokens_per_block} tokens)")
    ax.set_ylabel("admitted tokens loaded from CPU tier (%)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="eviction policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_simulate(args: argparse.Namespace) -> int:
    """CLI entry: validate flags, simulate, write PNG/CSV/JSON."""
    policies = available_policies() if not args.policies else [p.strip() for p in args.policies.split(",") if p]
    for p in policies:
        get_policy_class(p)
    if not policies:
        raise InvalidArgumentError("--policies must name at least one policy")
    base = DemoSettings()
    settings = DemoSettings(
        **{
            **asdict(base),
            "seed": args.seed,
            **({"gpu_blocks": args.gpu_blocks} if args.gpu_blocks else {}),
            **({"conversations": args.conversations} if args.conversations else {}),
        }
    )
    if args.trace:
        items: list[Any] = list(read_trace(args.trace))
        source = f"trace {args.trace} ({len(items)} requests)"
    else:
        items = list(ChatWorkload(conversations=settings.conversations, turns=settings.turns, seed=settings.seed))
        source = f"chat workload ({settings.conversations} conversations x {settings.turns} turns)"
    offloaded = settings.gpu_block_size * settings.block_size_factor
    ws = working_set_blocks(items, settings.gpu_block_size) // settings.block_size_factor
    capacities = args.capacities or default_capacities(ws)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"--out {out} cannot be created: {exc}") from None
    print(
        f"simulating {source}; working set ~{ws} offloaded blocks of {offloaded} tokens; "
        f"GPU {settings.gpu_blocks} blocks; policies {','.join(policies)}",
        flush=True,
    )
    points = simulate(items, settings, policies, capacities)
    rows = [asdict(p) for p in points]
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.json").write_text(
        json.dumps({"source": source, "working_set_blocks": ws, "settings": asdict(settings), "points": rows}, indent=2)
        + "\n"
    )
    png = plot_hit_rates(points, out / "hit_rate.png", f"CPU-tier hit rate vs capacity — {source}", offloaded)
    top = max(p.cpu_hit_rate for p in points)
    if top == 0:
        print(
            f"no CPU-tier hits at any capacity: the GPU cache ({settings.gpu_blocks} blocks) holds the working "
            "set; try a smaller --gpu-blocks"
        )
    for policy in policies if top > 0 else ():
        enough = [p for p in points if p.policy == policy and p.cpu_hit_rate >= 0.95 * top]
        where = f"{min(p.cpu_blocks for p in enough)} blocks" if enough else "no capacity tried"
        print(f"{policy}: 95% of the best CPU-tier hit rate ({top:.1%}) from {where}")
    print(f"wrote {png}, {out / 'results.csv'}, {out / 'results.json'}")
    return 0
