"""``python -m kvoffload demo``: a multi-turn chat workload through the reference engine.

Conversations share system prompts and grow turn by turn; the GPU KV cache holds only a
fraction of their working set, so earlier turns are evicted from the GPU and come back from the
CPU tier. Every byte moves through the real kernels (compiled Triton on a GPU, the torch backend
on CPU) and every loaded block is checked against the KV the engine computed for it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.sim.config import EngineConfig, GroupConfig
from kvoffload.sim.engine import Engine
from kvoffload.sim.stats import EngineStats
from kvoffload.sim.workload import ChatWorkload

__all__ = ["DemoSettings", "drive", "run_chat", "run_demo", "format_header", "format_summary", "summary_dict"]


@dataclass(frozen=True)
class DemoSettings:
    """Sizes of the demo; the defaults run in well under a minute on a 2-core CPU."""

    conversations: int = 128
    turns: int = 6
    system_prompts: int = 3
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
    tiers: tuple[str, ...] = ()

    def workload(self) -> ChatWorkload:
        """The chat workload these settings describe."""
        return ChatWorkload(
            conversations=self.conversations, turns=self.turns, system_prompts=self.system_prompts, seed=self.seed
        )

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token over all layers (K and V, 16-bit words)."""
        return self.num_layers * 2 * self.num_heads * self.head_dim * 2

    @property
    def gpu_block_bytes(self) -> int:
        """KV bytes of one GPU block over all layers."""
        return self.gpu_block_size * self.token_bytes


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
            progress.update(done, f"{s.loaded_tokens:,} tokens loaded from the CPU tier")
    engine.run_until_done()  # drain in-flight stores


def build_engine(settings: DemoSettings) -> Engine:
    """The engine ``settings`` describe (its tiers opened, nothing run yet)."""
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
    return Engine(config, tiers=settings.tiers)


def run_chat(settings: DemoSettings, progress: bool = True, engine: Engine | None = None) -> tuple[EngineStats, Engine]:
    """Run the chat workload of ``settings`` through ``engine`` (default: a fresh
    :func:`build_engine`) with real KV bytes.

    Returns the engine's cumulative stats and the (shut down) engine.
    """
    workload = settings.workload()
    engine = engine if engine is not None else build_engine(settings)
    bar = _Progress(len(workload), progress)
    try:
        drive(engine, list(workload), settings.max_concurrent, bar)
    finally:
        bar.close()
        engine.shutdown()
    return engine.stats, engine


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB, two decimals."""
    return f"{nbytes / 2**30:.2f} GiB"


def _kib(nbytes: int) -> str:
    return f"{nbytes // 1024:,} KiB" if nbytes % 1024 == 0 else f"{nbytes:,} B"


def summary_dict(settings: DemoSettings, stats: EngineStats, engine: Engine) -> dict[str, Any]:
    """The demo's results as plain data (what ``--json`` writes).

    ``stats`` holds :class:`~kvoffload.sim.stats.EngineStats` as a dict; ``geometry`` the block
    sizes in tokens and bytes (``gpu_block_bytes``: one GPU block over all layers, K and V;
    ``offloaded_block_bytes``: one CPU slot) and the host pool's size; ``tiers`` one entry per
    secondary tier (:func:`tier_report`).
    """
    worker = engine.worker
    backend = getattr(getattr(worker, "backend", None), "name", None)
    pool = getattr(worker, "host_pool", None)
    gpu_block_bytes = engine.kv.block_bytes(0)
    return {
        # tier specs may hold credentials: the tiers' display names instead
        "settings": {**settings.__dict__, "tiers": [t.name for t in engine.tiered.tiers] if engine.tiered else []},
        "device": str(engine.device),
        "backend": backend,
        "torch_threads": torch.get_num_threads(),
        "geometry": {
            "gpu_block_tokens": settings.gpu_block_size,
            "gpu_block_bytes": gpu_block_bytes,
            "offloaded_block_tokens": settings.gpu_block_size * settings.block_size_factor,
            "offloaded_block_bytes": gpu_block_bytes * settings.block_size_factor,
            "host_pool_bytes": gpu_block_bytes * settings.block_size_factor * settings.cpu_blocks,
            "host_pool_pinned": bool(getattr(pool, "pinned", False)),
        },
        "stats": stats.as_dict(),
        "tiers": tier_report(engine, settings.gpu_block_size * settings.block_size_factor),
    }


def tier_report(engine: Engine, block_tokens: int) -> list[dict[str, Any]]:
    """Per secondary tier of ``engine``: its name (no credentials), blocks and tokens loaded from it
    (promoted into the host pool) and written to it, failures and drops, and the tier's own
    counters (:class:`~kvoffload.tiers.TierStats`)."""
    if engine.tiered is None:
        return []
    out = []
    for tier, use in zip(engine.tiered.tiers, engine.tiered.usage(), strict=True):
        out.append(
            {
                "name": use.name,
                "blocks_loaded": use.blocks_promoted,
                "tokens_loaded": use.blocks_promoted * block_tokens,
                "blocks_written": use.blocks_written,
                "tokens_written": use.blocks_written * block_tokens,
                "promotions_failed": use.promotions_failed,
                "promotions_refused": use.promotions_refused,
                "writes_failed": use.writes_failed,
                "writes_dropped": use.writes_dropped,
                "tier_stats": dict(tier.stats().__dict__),
            }
        )
    return out


def _share(part: int, whole: int, of: str) -> str:
    return f"{part:>9,}  {part / whole:6.1%} of {of}" if whole else f"{part:>9,}"


def _rate(nbytes: int, seconds: float) -> str:
    """Bytes / the time the worker spent in those transfers."""
    return f"{nbytes / seconds / 1e9:.2f} GB/s over the {seconds:.2f} s spent in them" if seconds > 0 else "n/a"


def _tier_rows(summary: dict[str, Any], off: str) -> list[tuple[str, str]]:
    """One row per secondary tier: what it gave the host pool and what was written to it."""
    rows = []
    for t in summary.get("tiers", []):
        lost = t["promotions_failed"] + t["writes_failed"] + t["writes_dropped"]
        rows.append(
            (
                f"tier {t['name']}",
                f"loaded {t['blocks_loaded']:,} offloaded blocks ({t['tokens_loaded']:,} tokens) into the host pool, "
                f"wrote {t['blocks_written']:,} ({t['tokens_written']:,} tokens)"
                + (
                    f"; {t['promotions_failed']:,} loads failed, {t['writes_failed'] + t['writes_dropped']:,} "
                    "writes failed or dropped"
                    if lost
                    else ""
                ),
            )
        )
    if rows:
        s = summary["stats"]
        rows.append(
            (
                "  loaded to the GPU from them",
                f"{s['tier_blocks_loaded']:,} offloaded blocks whose host-pool bytes came from a tier (verified below)",
            )
        )
    return rows


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table: how the prompt tokens were served (the rows add up), transfers, checks.

    Every row counts in one unit, named in the row; rates name their denominator.
    """
    s, cfg, geo = summary["stats"], summary["settings"], summary["geometry"]
    off = f"offloaded blocks ({geo['offloaded_block_tokens']} tokens)"
    readmitted = s["readmitted_output_tokens"]
    whole = s["served_tokens"]
    of = "prompt tokens" if not readmitted else "admitted tokens"
    rows = [
        (
            "requests finished",
            f"{s['requests_finished']:>9,}  ({cfg['conversations']} conversations x {cfg['turns']} turns)",
        ),
        ("prompt tokens", f"{s['prompt_tokens']:>9,}"),
    ]
    if readmitted:
        rows.append(("+ generated tokens re-admitted", f"{readmitted:>9,}  (prefilled again after a preemption)"))
    rows += [
        ("  from the GPU prefix cache", _share(s["prefill_gpu_hit_tokens"], whole, of)),
        ("  loaded from the CPU tier", _share(s["prefill_loaded_tokens"], whole, of)),
        ("  computed (prefill)", _share(s["prefill_computed_tokens"], whole, of)),
        (
            "decode tokens computed",
            f"{s['decode_tokens']:>9,}  ({s['generated_tokens']:,} tokens generated: each request's first one is "
            "sampled at the end of its prefill)",
        ),
    ]
    if s["discarded_tokens"]:
        rows.append(("tokens lost to preemptions", f"{s['discarded_tokens']:>9,}  (computed, then freed)"))
    rows += [
        (
            "stores, GPU -> CPU tier",
            f"{s['blocks_stored']:,} {off} in {s['store_jobs']:,} jobs: {gib(s['bytes_stored'])}, "
            f"{_rate(s['bytes_stored'], s['store_seconds'])}",
        ),
        (
            "loads, CPU tier -> GPU",
            f"{s['blocks_loaded']:,} {off} in {s['load_jobs']:,} jobs: {gib(s['bytes_loaded'])}, "
            f"{_rate(s['bytes_loaded'], s['load_seconds'])}",
        ),
        *_tier_rows(summary, off),
        ("evicted from the CPU tier", f"{s['cpu_evictions']:,} {off}"),
        ("evicted from the GPU cache", f"{s['gpu_evictions']:,} GPU blocks ({geo['gpu_block_tokens']} tokens)"),
        ("requests preempted", f"{s['preemptions']:>9,}"),
        (
            "requests deferred",
            f"{s['deferrals']:>9,}  (told to retry: a block they need was still being stored or loaded"
            + (", or looked up in or promoted from a tier)" if summary.get("tiers") else ")"),
        ),
        (
            "engine",
            f"{s['steps']:,} steps in {s['wall_seconds']:.1f} s on {summary['device']}, kernel backend "
            f"{summary['backend']}, {summary['torch_threads']} torch thread(s)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    verified = s["verified_blocks"]
    if s["verification_failures"]:
        lines.append(
            f"VERIFICATION FAILED: {s['verification_failures']:,} of {verified:,} GPU blocks written by loads "
            "differ from the KV the engine computed for them"
        )
    elif verified == 0:
        why = (
            f"the CPU tier evicted {s['cpu_evictions']:,} offloaded blocks before any was asked for again: "
            "try a larger --cpu-blocks"
            if s["cpu_evictions"]
            else "the GPU prefix cache served all reuse: try a smaller --gpu-blocks"
        )
        lines.append(f"verified: nothing was loaded from the CPU tier, nothing to check ({why})")
    else:
        lines.append(
            f"verified: all {verified:,} GPU blocks ({geo['gpu_block_tokens']} tokens) written by loads hold exactly "
            "the KV computed for them"
        )
        if verified != s["blocks_loaded"] * cfg["block_size_factor"]:
            lines.append(
                f"  ({s['blocks_loaded']:,} offloaded blocks of {cfg['block_size_factor']} GPU blocks: a load starts "
                "part-way into an offloaded block whose first GPU blocks were GPU prefix-cache hits)"
            )
    return "\n".join(lines)


def format_header(settings: DemoSettings) -> str:
    """What the run is: workload, model shape, block sizes in tokens and bytes, both capacities."""
    gpu_block = settings.gpu_block_bytes
    off_tokens = settings.gpu_block_size * settings.block_size_factor
    off_bytes = gpu_block * settings.block_size_factor
    return "\n".join(
        [
            f"kvoffload demo: {settings.conversations} conversations x {settings.turns} turns sharing "
            f"{settings.system_prompts} system prompts, eviction policy {settings.policy}",
            f"  KV per token: {settings.num_layers} layers x K,V x {settings.num_heads} heads x {settings.head_dim} "
            f"x fp16 = {_kib(settings.token_bytes)}",
            f"  GPU KV cache: {settings.gpu_blocks:,} GPU blocks of {settings.gpu_block_size} tokens "
            f"({_kib(gpu_block)} each) = {gib(settings.gpu_blocks * gpu_block)}",
            f"  CPU tier:     {settings.cpu_blocks:,} offloaded blocks of {off_tokens} tokens "
            f"({settings.block_size_factor} GPU blocks, {_kib(off_bytes)} each) = host pool of "
            f"{gib(settings.cpu_blocks * off_bytes)}",
        ]
    )


def _json_path(text: str | None) -> Path | None:
    """``--json PATH`` checked before the run: its folder is created; a path that cannot be
    written is a one-line error."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise InvalidArgumentError(f"--json {text}: is a directory, expected a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"--json {text}: cannot create its folder ({exc.strerror or exc})") from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InvalidArgumentError(f"--json {text}: not writable")
    return path


def run_demo(args: argparse.Namespace) -> int:
    """CLI entry: build settings from flags, run, print the table; exit 1 on a verification failure.

    Every flag is checked before the run (bad values raise :class:`InvalidArgumentError`). On
    CPU, torch runs with ``--threads`` intra-op threads (default 1: the engine's gathers and
    scatters are small, and on a few busy cores more threads only contend).
    """
    from kvoffload.cache.policies.base import get_policy_class  # validates the policy name up front

    overrides: dict[str, Any] = {
        "policy": args.policy,
        "backend": args.backend,
        "seed": args.seed,
        "tiers": tuple(getattr(args, "tier", None) or ()),
    }
    for flag in ("cpu_blocks", "gpu_blocks", "conversations"):
        if getattr(args, flag) is not None:
            overrides[flag] = getattr(args, flag)
    settings = replace(DemoSettings(), **overrides)
    get_policy_class(settings.policy)
    cuda = torch.cuda.is_available()
    if args.backend is not None:
        from kvoffload.kernels.registry import get_backend

        get_backend(args.backend, "cuda" if cuda else "cpu")
    if settings.gpu_blocks < 2:
        raise InvalidArgumentError("--gpu-blocks must be at least 2")
    json_path = _json_path(args.json)
    if args.threads is not None or not cuda:
        torch.set_num_threads(args.threads or 1)
    engine = build_engine(settings)  # opens the tiers: a bad --tier is an error before the run
    print(format_header(settings), flush=True)
    if engine.tiered is not None:
        print(f"  tiers:        {', '.join(t.name for t in engine.tiered.tiers)} (first asked first)", flush=True)
    stats, engine = run_chat(settings, progress=not args.no_progress, engine=engine)
    summary = summary_dict(settings, stats, engine)
    print(format_summary(summary))
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        print(f"summary written to {json_path}")
    return 1 if stats.verification_failures else 0
