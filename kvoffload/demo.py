"""``python -m kvoffload demo``: a multi-turn chat workload through the reference engine.

Conversations share system prompts and grow turn by turn; the GPU KV cache holds only a
fraction of their working set, so earlier turns are evicted from the GPU and come back from the
CPU tier. Every byte moves through the real kernels (compiled Triton on a GPU, the torch backend
on CPU) and every loaded block is checked against the KV the engine computed for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kvoffload.errors import InvalidArgumentError
from kvoffload.sim.config import EngineConfig, GroupConfig
from kvoffload.sim.engine import Engine
from kvoffload.sim.stats import EngineStats
from kvoffload.sim.workload import ChatWorkload

__all__ = ["DemoSettings", "drive", "run_chat", "run_demo", "format_summary", "summary_dict"]


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of the demo; the defaults run in well under a minute on a 2-core CPU."""

    conversations: int = 128
    turns: int = 6
    gpu_block_size: int = 16
    block_size_factor: int = 2
    num_layers: int = 8
    num_heads: int = 8
    head_dim: int = 64
    gpu_blocks: int = 512
    cpu_blocks: int = 1536
    max_concurrent: int = 16
    policy: str = "lru"
    backend: str | None = None
    seed: int = 0


class _Progress:
    """A one-line progress bar on a terminal, a few plain lines otherwise."""

    def __init__(self, total: int, enabled: bool, out: TextIO = sys.stderr) -> None:
        self.total, self.enabled, self.out = total, enabled, out
        self.tty = out.isatty()
        self.start = time.perf_counter()
        self._last_decile = -1

    def update(self, done: int, extra: str) -> None:
        if not self.enabled:
            return
        frac = done / self.total if self.total else 1.0
        if self.tty:
            bar = "#" * int(frac * 30)
            self.out.write(
                f"\r[{bar:<30}] {done}/{self.total} requests  {extra}  {time.perf_counter() - self.start:5.1f}s"
            )
            self.out.flush()
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            self.out.write(f"  {done}/{self.total} requests  {extra}\n")

    def close(self) -> None:
        if self.enabled and self.tty:
            self.out.write("\n")


def drive(engine: Engine, items: Sequence[Any], max_concurrent: int, progress: _Progress | None = None) -> None:
    """Feed ``items`` to ``engine`` in arrival order and step until all finished.

    At most ``max_concurrent`` requests are in the engine at once. Items with ``conversation``
    and ``turn`` attributes (chat turns) are admitted only after the same conversation's previous
    turn finished; others (trace requests) in plain arrival order.
    """
    pending: deque[Any] = deque(items)
    finished_turn: dict[int, int] = {}
    in_engine: dict[str, Any] = {}
    done = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(len(pending)):
            if len(in_engine) >= max_concurrent:
                break
            item = pending.popleft()
            conv = getattr(item, "conversation", None)
            if conv is None or finished_turn.get(conv, -1) == item.turn - 1:
                engine.add_request(item)
                in_engine[item.request_id] = item
            else:
                pending.append(item)
        step = engine.step()
        for rid in step.finished:
            item = in_engine.pop(rid)
            if getattr(item, "conversation", None) is not None:
                finished_turn[item.conversation] = item.turn
            done += 1
        if step.finished and progress is not None:
            s = engine.stats
            progress.update(done, f"CPU hits {s.loaded_tokens} tok, verified {s.verified_blocks} blocks")
    engine.run_until_done()  # drain in-flight stores


def run_chat(settings: DemoSettings, progress: bool = True) -> tuple[EngineStats, Engine]:
    """Run the chat workload of ``settings`` through a fresh engine with real KV bytes.

    Returns the engine's cumulative stats and the (shut down) engine.
    """
    workload = ChatWorkload(conversations=settings.conversations, turns=settings.turns, seed=settings.seed)
    config = EngineConfig(
        groups=(GroupConfig(settings.gpu_block_size, settings.block_size_factor, None, settings.num_layers),),
        num_gpu_blocks=settings.gpu_blocks,
        num_cpu_blocks=settings.cpu_blocks,
        num_heads=settings.num_heads,
        head_dim=settings.head_dim,
        max_num_seqs=settings.max_concurrent,
        cache_policy=settings.policy,
        worker_backend=settings.backend,
        seed=settings.seed,
    )
    engine = Engine(config)
    bar = _Progress(len(workload), progress)
    try:
        drive(engine, list(workload), settings.max_concurrent, bar)
    finally:
        bar.close()
        engine.shutdown()
    return engine.stats, engine


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "n/a"


def summary_dict(settings: DemoSettings, stats: EngineStats, engine: Engine) -> dict[str, Any]:
    """The demo's results as plain data (what ``--json`` writes)."""
    backend = getattr(getattr(engine.worker, "backend", None), "name", None)
    return {
        "settings": settings.__dict__,
        "device": str(engine.device),
        "backend": backend,
        "stats": stats.as_dict(),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table."""
    s = summary["stats"]
    cfg = summary["settings"]
    rows = [
        ("requests", f"{s['requests_finished']} ({cfg['conversations']} conversations x {cfg['turns']} turns)"),
        ("prompt tokens", f"{s['prompt_tokens']}"),
        ("tokens from GPU prefix cache", f"{s['gpu_hit_tokens']}"),
        ("tokens from CPU tier (not recomputed)", f"{s['loaded_tokens']}"),
        ("tokens computed", f"{s['computed_tokens']}"),
        ("hit rate (GPU + CPU / admitted)", f"{s['hit_rate']:.1%} (CPU tier {s['cpu_hit_rate']:.1%})"),
        ("store jobs / blocks", f"{s['store_jobs']} / {s['blocks_stored']}"),
        ("load jobs / blocks", f"{s['load_jobs']} / {s['blocks_loaded']}"),
        ("CPU evictions / GPU evictions", f"{s['cpu_evictions']} / {s['gpu_evictions']}"),
        ("preemptions / deferrals", f"{s['preemptions']} / {s['deferrals']}"),
        ("bytes GPU->CPU", f"{s['bytes_stored']:,} ({_gbps(s['bytes_stored'], s['store_seconds'])})"),
        ("bytes CPU->GPU", f"{s['bytes_loaded']:,} ({_gbps(s['bytes_loaded'], s['load_seconds'])})"),
        ("engine steps / wall time", f"{s['steps']} / {s['wall_seconds']:.1f} s"),
        ("device / kernel backend", f"{summary['device']} / {summary['backend']}"),
        ("policy / GPU blocks / CPU blocks", f"{cfg['policy']} / {cfg['gpu_blocks']} / {cfg['cpu_blocks']}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if s["verification_failures"]:
        lines.append(
            f"VERIFICATION FAILED: {s['verification_failures']} of {s['verified_blocks']} loaded blocks "
            "differ from the KV the engine computed"
        )
    elif s["verified_blocks"] == 0:
        lines.append(
            "verified: nothing was loaded from the CPU tier (the GPU cache held the working set: "
            "try a smaller --gpu-blocks)"
        )
    else:
        lines.append(f"verified: {s['verified_blocks']} GPU blocks loaded, all byte-identical")
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    """CLI entry: build settings from flags, run, print the table; exit 1 on a verification failure."""
    from kvoffload.offload.policies.base import get_policy_class  # validates the policy name up front

    settings = DemoSettings()
    overrides: dict[str, Any] = {"policy": args.policy, "backend": args.backend, "seed": args.seed}
    for flag, field in (("cpu_blocks", "cpu_blocks"), ("gpu_blocks", "gpu_blocks"), ("conversations", "conversations")):
        if getattr(args, flag) is not None:
            overrides[field] = getattr(args, flag)
    settings = DemoSettings(**{**settings.__dict__, **overrides})
    get_policy_class(settings.policy)
    if args.backend is not None:
        from kvoffload.kernels.registry import get_backend

        get_backend(args.backend, "cuda" if _cuda() else "cpu")
    if settings.gpu_blocks < 2:
        raise InvalidArgumentError("--gpu-blocks must be at least 2")
    print(
        f"kvoffload demo: {settings.conversations} conversations x {settings.turns} turns, "
        f"GPU {settings.gpu_blocks} blocks of {settings.gpu_block_size} tokens, "
        f"CPU {settings.cpu_blocks} slots, policy {settings.policy}",
        flush=True,
    )
    stats, engine = run_chat(settings, progress=not args.no_progress)
    summary = summary_dict(settings, stats, engine)
    print(format_summary(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(f"summary written to {args.json}")
    return 1 if stats.verification_failures else 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
