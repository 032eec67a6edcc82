"""What ``kvoffload demo`` prints and writes: the results as plain data (``--json``), the summary
table and the settings header."""

from __future__ import annotations

from typing import Any

import torch

from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.stats import EngineStats
from kvoffload.simulate.units import gib

__all__ = ["summary_dict", "tier_report", "format_summary", "format_header"]


def _kib(nbytes: int) -> str:
    return f"{nbytes // 1024:,} KiB" if nbytes % 1024 == 0 else f"{nbytes:,} B"


def summary_dict(settings: DemoSettings, stats: EngineStats, engine: Engine) -> dict[str, Any]:
    """The demo's results as plain data (what ``--json`` writes).

    ``stats`` holds :class:`~kvoffload.engine.reference.stats.EngineStats` as a dict; ``geometry`` the block
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
