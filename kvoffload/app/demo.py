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
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import torch

from kvoffload.app.demo_report import format_header, format_summary, summary_dict
from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.reference.drive import drive
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.stats import EngineStats
from kvoffload.engine.tiered_options import TieredOptions
from kvoffload.errors import InvalidArgumentError

__all__ = ["build_engine", "run_chat", "run_demo"]


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


def build_engine(settings: DemoSettings, tiered_options: TieredOptions | None = None) -> Engine:
    """The engine ``settings`` describe (its tiers opened, nothing run yet; their manager's options:
    ``tiered_options``)."""
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
        verify_loads=settings.verify_loads,
    )
    return Engine(config, tiers=settings.tiers, tiered_options=tiered_options)


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
