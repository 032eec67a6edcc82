"""What ``kvoffload simulate`` prints and writes: header, table, diagnosis, PNG, CSV, JSON.

Capacities are shown in GiB of host memory for the stated model shape and in offloaded blocks;
hit rates are shares of the prompt tokens (plus generated tokens prefilled again after a
preemption, when there were any), counted over each request's completed admission. With shared-tier
capacities (cache-level replay), a second table gives, per (host capacity, tier capacity), the
shares found in host memory and promoted from the tier; the first table, the diagnosis, the
reference lines and Belady's shares are those of host memory alone.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.simulate.model_config import ConfigShape
from kvoffload.simulate.sweep import ModelShape, SimPoint, largest_run
from kvoffload.simulate.units import gib, size_label, tokens_label

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvoffload.simulate.cache_cli import CacheSweepPoints
    from kvoffload.simulate.trace_block_view import TraceBlockView

__all__ = ["SweepReport"]


class SweepReport:
    """The report of one capacity x policy sweep (see the module docstring)."""

    def __init__(
        self,
        source: str,
        shape: ModelShape | ConfigShape,
        settings: DemoSettings,
        policies: list[str],
        capacities: list[int],
        working_set_blocks: int,
        block_bytes: int,
        replay: str = "engine",
        tier_capacities: list[int] | None = None,
    ) -> None:
        self.source, self.shape, self.settings, self.replay = source, shape, settings, replay
        self.policies, self.capacities = policies, capacities
        self.ws, self.block_bytes = working_set_blocks, block_bytes
        self.block_tokens = settings.gpu_block_size * settings.block_size_factor
        self.tiers = [0] if not tier_capacities else tier_capacities

    def header(self) -> str:
        s, shape = self.settings, self.shape
        gpu_bytes = s.gpu_blocks * s.gpu_block_size * shape.bytes_per_token
        caps, bb = self.capacities, self.block_bytes
        gpu = (
            f"; GPU KV cache: {s.gpu_blocks:,} GPU blocks of {s.gpu_block_size} tokens = {gib(gpu_bytes)}"
            if self.replay == "engine"
            else "; cache-level replay (no GPU tier)"
        )
        return "\n".join(
            [
                f"simulating {self.source}",
                f"  model shape:     {shape.describe()} = {size_label(shape.bytes_per_token)} of KV per token",
                f"  offloaded block: {self.block_tokens} tokens = {size_label(self.block_bytes)}{gpu}",
                f"  working set:     {self.ws:,} distinct offloaded blocks in the prompts = {gib(self.ws * bb)} "
                f"(each full {self.block_tokens}-token block of every prompt, counted once by its chained hash)",
                f"  sweep:           policies {', '.join(self.policies)}; {len(caps)} capacities from {caps[0]:,} to "
                f"{caps[-1]:,} offloaded blocks ({gib(caps[0] * bb)} to {gib(caps[-1] * bb)})",
                *(
                    [
                        "  shared tier:     none, "
                        + ", ".join(
                            f"{gib(t * bb)} ({tokens_label(t * self.block_tokens)} tokens)" for t in self.tiers if t
                        )
                        + " beneath each (an LRU model of Redis with allkeys-lru, written through, promoted on hits)"
                    ]
                    if len(self.tiers) > 1
                    else []
                ),
            ]
        )

    def settings_dict(self) -> dict[str, Any]:
        """What the sweep was (``results.json``'s ``sweep``): workload, model shape, sizes, policies, capacities."""
        s = self.settings
        return {
            "source": self.source,
            "replay": self.replay,
            "model_shape": {**asdict(self.shape), "bytes_per_token": self.shape.bytes_per_token},
            "gpu_block_tokens": s.gpu_block_size,
            "offloaded_block_tokens": self.block_tokens,
            "offloaded_block_bytes": self.block_bytes,
            "gpu_blocks": s.gpu_blocks,
            "gpu_kv_bytes": s.gpu_blocks * s.gpu_block_size * self.shape.bytes_per_token,
            "max_concurrent_requests": s.max_concurrent,
            "seed": s.seed,
            "policies": self.policies,
            "capacities_blocks": self.capacities,
            "capacities_gib": [c * self.block_bytes / 2**30 for c in self.capacities],
            "tier_capacities_blocks": self.tiers,
            "tier_capacities_gib": [t * self.block_bytes / 2**30 for t in self.tiers],
            "tier_model": "shared tier beneath host memory: exact LRU over blocks (Redis allkeys-lru, which "
            "samples); EXISTS probes leave recency alone, GET and SET NX refresh it",
        }

    def table(self, points: list[SimPoint], ref: CacheSweepPoints | None = None) -> str:
        """Share of prompt tokens loaded from the CPU tier, one row per capacity, one column per
        policy (and Belady's optimum and the infinite cache when given); then, with ``ref``, each
        policy's share of Belady's optimum; then, when ``lru`` is among several policies, each
        policy's hit tokens relative to LRU's at the same capacity."""
        by = {(p.policy, p.cpu_blocks): p for p in points}
        cols = list(self.policies)
        if ref is not None:
            by.update({("belady", p.cpu_blocks): p for p in ref.belady})
            by.update({("infinite", c): ref.infinite for c in self.capacities})
            cols += ["belady", "infinite"]
        widths = [max(len(p), 6) for p in cols]
        bw = max(8, len(f"{self.capacities[-1]:,}"))
        tok = self.replay == "cache"  # real traces: capacities in tokens too

        def head(names: list[str]) -> str:
            return (
                f"{'host memory':>12}  "
                + (f"{'tokens':>8}  " if tok else "")
                + f"{'blocks':>{bw}}  "
                + "  ".join(f"{p:>{w}}" for p, w in zip(names, widths, strict=False))
            )

        def row(cap: int, cells: str) -> str:
            t = f"{tokens_label(cap * self.block_tokens):>8}  " if tok else ""
            return f"{size_label(cap * self.block_bytes):>12}  {t}{cap:>{bw},}  {cells}"

        lines = ["prompt tokens loaded from the CPU tier, % of prompt tokens:", head(cols)]
        for cap in self.capacities:
            lines.append(
                row(cap, "  ".join(f"{by[(p, cap)].cpu_hit_rate:>{w}.1%}" for p, w in zip(cols, widths, strict=True)))
            )

        def relative(title: str, base: str, fmt: Callable[[int, int], str]) -> None:
            """A table of each policy's hit tokens against ``base``'s at the same capacity."""
            lines.extend([title, head(self.policies)])
            for cap in self.capacities:
                b = by[(base, cap)].cpu_hit_tokens
                cells = "  ".join(
                    f"{fmt(by[(p, cap)].cpu_hit_tokens, b):>{w}}" for p, w in zip(self.policies, widths, strict=False)
                )
                lines.append(row(cap, cells))

        if ref is not None:
            lines.append(self.infinite_definition())
            relative("each policy's share of Belady's optimum (its hit tokens / Belady's):", "belady", _share)
        if "lru" in self.policies and len(self.policies) > 1:
            relative("each policy's hit tokens relative to LRU's (x LRU):", "lru", _ratio)
        return "\n".join(lines)

    def infinite_definition(self) -> str:
        """What the infinite column counts, and why trace-analysis tools report another figure."""
        return (
            f"(infinite, counted like every column: prompt tokens of the full {self.block_tokens}-token offloaded "
            "blocks a request finds stored,\n at most its prompt - 1 tokens, over every request from the first; "
            "tools that count the trace's own blocks over a\n steady-state window report another figure: "
            "--trace-block-view WARMUP prints that one too)"
        )

    def trace_block_line(self, view: TraceBlockView, trace_block_tokens: int) -> str:
        """The infinite cache counted in the trace's own blocks (``--trace-block-view``)."""
        n = view.warmup_requests
        return (
            f"infinite cache in the trace's own blocks ({trace_block_tokens} tokens each, a partial last block "
            f"counted whole, no cap at prompt - 1): {view.hit_rate:.1%} of trace blocks over every request; "
            f"{view.window_hit_rate:.1%} over the requests after the first {n:,} (warm-up)"
        )

    def tier_table(self, points: list[SimPoint]) -> str:
        """Per (host capacity, tier capacity), per policy: the shares of prompt tokens found in host
        memory and promoted from the shared tier, and their sum."""
        by = {(p.policy, p.cpu_blocks, p.tier_blocks): p for p in points}
        cell = 22
        lines = [
            "prompt tokens loaded with a shared tier beneath host memory, % of prompt tokens "
            "(from host memory + from the tier = both):",
            f"{'host memory':>12}  {'tokens':>8}  {'tier':>12}  {'tokens':>8}  "
            + "  ".join(f"{p:>{cell}}" for p in self.policies),
        ]
        for cap in self.capacities:
            for t in self.tiers:
                cells = []
                for pol in self.policies:
                    p = by[(pol, cap, t)]
                    cells.append(f"{p.cpu_hit_rate:6.1%} + {p.tier_hit_rate:5.1%} = {p.hit_rate:5.1%}".rjust(cell))
                tsize, ttok = (
                    (size_label(t * self.block_bytes), tokens_label(t * self.block_tokens)) if t else ("-", "-")
                )
                lines.append(
                    f"{size_label(cap * self.block_bytes):>12}  {tokens_label(cap * self.block_tokens):>8}  "
                    f"{tsize:>12}  {ttok:>8}  " + "  ".join(cells)
                )
        return "\n".join(lines)

    def diagnosis(self, points: list[SimPoint]) -> list[str]:
        """What the sweep says, in sentences that hold for these numbers."""
        bb = self.block_bytes
        top = largest_run(points)
        stored = top.distinct_blocks_stored
        room = (
            "and evicted none: the room to keep everything"
            if top.cpu_evictions == 0
            else f"and still evicted {top.cpu_evictions:,}"
        )
        if self.replay == "cache":
            what = f"of the {self.ws:,} in the prompts (the cache-level replay stores prompt blocks only)"
        else:
            what = (
                f"at most {self.ws:,} of them hold prompt tokens, the others were filled by generated tokens, "
                "which take room too but are reused only if a later prompt repeats them"
            )
        lines = [
            f"stored: the largest run ({top.cpu_blocks:,} blocks, {top.policy}) stored {stored:,} distinct offloaded "
            f"blocks ({gib(stored * bb)}) {room}; {what}"
        ]
        if any(p.served_tokens != p.prompt_tokens for p in points):
            lines.append(
                "(some runs preempted requests: their shares are of prompt tokens plus the generated tokens "
                "prefilled again on re-admission)"
            )
        for policy in self.policies:
            pts = sorted((p for p in points if p.policy == policy), key=lambda p: p.cpu_blocks)
            best = max(pts, key=lambda p: p.cpu_hit_rate)
            if best.cpu_hit_rate == 0:
                lines.append(f"{policy}: nothing loaded from the CPU tier at any capacity tried")
                continue
            enough = next(p for p in pts if p.cpu_hit_rate >= 0.95 * best.cpu_hit_rate)
            lines.append(
                f"{policy}: best {best.cpu_hit_rate:.1%} of prompt tokens at {best.cpu_blocks:,} blocks "
                f"({gib(best.cpu_blocks * bb)}); 95% of that from {enough.cpu_blocks:,} blocks "
                f"({gib(enough.cpu_blocks * bb)})"
            )
        if all(p.cpu_hit_rate == 0 for p in points):
            if top.cpu_evictions:
                lines.append(
                    f"no capacity tried kept a block until a request asked for it again: the largest, "
                    f"{top.cpu_blocks:,} blocks ({gib(top.cpu_blocks * bb)}), still evicted {top.cpu_evictions:,}; "
                    f"try capacities around the prompts' working set ({self.ws:,} blocks, {gib(self.ws * bb)}) "
                    f"and up to what was stored ({stored:,} blocks, {gib(stored * bb)})"
                )
            else:
                lines.append(
                    f"nothing was evicted and nothing loaded: the GPU prefix cache ({self.settings.gpu_blocks:,} GPU "
                    f"blocks) served all reuse ({top.gpu_hit_tokens / max(top.served_tokens, 1):.1%} of prompt "
                    "tokens); a smaller --gpu-blocks makes the CPU tier matter"
                )
        elif any(p.cpu_evictions for p in points if p.cpu_blocks == top.cpu_blocks):
            lines.append("the largest capacity still evicted: larger ones may load a little more")
        return lines

    def reference_lines(self, points: list[SimPoint], ref: CacheSweepPoints) -> list[str]:
        """The reference lines in words: the infinite cache, and each policy's share of Belady."""
        inf = ref.infinite
        lines = [
            f"infinite cache: {inf.cpu_hit_rate:.1%} of prompt tokens (every block ever stored kept: "
            f"{inf.distinct_blocks_stored:,} blocks, {gib(inf.distinct_blocks_stored * self.block_bytes)}); "
            "no policy at any capacity can load more"
        ]
        best = {p.cpu_blocks: p.cpu_hit_tokens for p in ref.belady}
        for policy in self.policies:
            pts = sorted((p for p in points if p.policy == policy), key=lambda p: p.cpu_blocks)
            shares = ", ".join(_share(p.cpu_hit_tokens, best[p.cpu_blocks]) for p in pts)
            lines.append(f"{policy}: share of Belady's optimum at each capacity, smallest first: {shares}")
        lines.append(f"sweep wall time: {ref.seconds:.1f} s")
        return lines

    def finish(self, points: list[SimPoint], out: Path, ref: CacheSweepPoints | None = None, plot: bool = True) -> str:
        """Write ``results.csv``, ``results.json`` and (``plot``) ``hit_rate.png`` into ``out``; return the report
        text.

        With ``ref`` (a cache-level sweep) the CSV also has Belady's rows (one per capacity) and the
        infinite cache's row, and every row its share of Belady's optimum at its capacity."""
        best = {} if ref is None else {p.cpu_blocks: p.cpu_hit_tokens for p in ref.belady}
        everything = points if ref is None else [*points, *ref.belady, ref.infinite]
        rows = [asdict(p) for p in everything]
        if ref is not None:
            for p, row in zip(everything, rows, strict=True):
                b = best.get(p.cpu_blocks)
                # Belady's optimum is of host memory alone: no share for runs with a tier
                row["share_of_belady"] = p.cpu_hit_tokens / b if b and not p.tier_blocks else None
        all_points, points = points, [p for p in points if not p.tier_blocks]
        csv_path, json_path, png_path = out / "results.csv", out / "results.json", out / "hit_rate.png"
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        stored = max(p.distinct_blocks_stored for p in points)
        made_by = (
            "(prompts only: the cache-level replay)" if self.replay == "cache" else "(prompts and generated tokens)"
        )
        n_pts = len(all_points)
        doc: dict[str, Any] = {
            "sweep": self.settings_dict(),
            "working_set": {
                "prompt_blocks": self.ws,
                "prompt_bytes": self.ws * self.block_bytes,
                "stored_blocks": stored,
                "stored_bytes": stored * self.block_bytes,
                "how_counted": "prompt_blocks: distinct full offloaded blocks of the prompts, by chained hash; "
                f"stored_blocks: distinct offloaded blocks stored in the run that stored the most {made_by}",
            },
            "points": rows[:n_pts],
        }
        if ref is not None:
            doc["belady"] = rows[n_pts:-1]
            doc["infinite"] = rows[-1]
            doc["sweep_seconds"] = ref.seconds
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
        written = [png_path, csv_path, json_path] if plot else [csv_path, json_path]
        if plot:
            from kvoffload.simulate.plot import plot_hit_rates

            plot_hit_rates(points, png_path, self, ref, [p for p in all_points if p.tier_blocks])
        for path in written:
            os.chmod(path, 0o644)
        extra = [] if ref is None else self.reference_lines(points, ref)
        tiered = [self.tier_table(all_points)] if len(self.tiers) > 1 else []
        return "\n".join(
            [
                self.table(points, ref),
                *tiered,
                *self.diagnosis(points),
                *extra,
                f"wrote {', '.join(map(str, written))}",
            ]
        )


def _ratio(hit: int, base: int) -> str:
    """``hit / base`` as ``1.23x`` (``inf`` when the base loaded nothing but this did)."""
    if base == 0:
        return "1.00x" if hit == 0 else "inf"
    return f"{hit / base:.2f}x"


def _share(hit: int, best: int) -> str:
    return f"{hit / best:.1%}" if best else "-"
