"""The fleet report's plots, one per question (matplotlib, imported only here):

* ``fleet.png``: TTFT p99 against replicas, one line per routing (colour) and memory (style), one
  panel per arrival-rate scale; the TTFT target as a horizontal line;
* ``fleet_hit_rate.png``: prompt tokens loaded against host memory per replica, one line per
  routing and replica count, one panel per tier capacity.

Axes span the swept values only, on a log scale where they span a decade or more (TTFT always
may: a saturated fleet's tail is orders of magnitude above a light one's); titles name the trace's
file only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kvoffload.simulate.axis_span import XSpan
from kvoffload.simulate.fleet_report import FleetRow
from kvoffload.simulate.fleet_tables import memory_label, routing_label
from kvoffload.simulate.units import tokens_label

__all__ = ["plot_fleet"]

_STYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v"]


def _log_if_wide(ax: Any, values: list[float], axis: str) -> None:
    """A log scale on ``axis`` when the positive finite ``values`` span a decade (:class:`XSpan`'s rule)."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if pos and XSpan(pos).log:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def plot_fleet(rows: list[FleetRow], trace_name: str, target_s: float, out: Path) -> list[Path]:
    """Both plots into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [out / "fleet.png", out / "fleet_hit_rate.png"]
    routings = list(dict.fromkeys(routing_label(r) for r in rows))
    memories = list(dict.fromkeys(memory_label(r) for r in rows))
    scales = sorted({r.rate_scale for r in rows})
    fig, axes = plt.subplots(1, len(scales), figsize=(5.2 * len(scales), 4.4), sharey=True, squeeze=False)
    finite = [r.ttft_p99_s for r in rows if math.isfinite(r.ttft_p99_s) and r.ttft_p99_s > 0]
    for ax, scale in zip(axes[0], scales, strict=True):
        for ci, routing in enumerate(routings):
            for si, mem in enumerate(memories):
                pts = sorted(
                    (r.replicas, r.ttft_p99_s)
                    for r in rows
                    if r.rate_scale == scale and routing_label(r) == routing and memory_label(r) == mem
                )
                pts = [(n, t) for n, t in pts if math.isfinite(t)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker=_MARKERS[si % 5], color=f"C{ci}", linestyle=_STYLES[si % 5],
                            label=f"{routing}, {mem}")  # fmt: skip
        ax.axhline(target_s, color="0.4", linewidth=0.8, label=f"target {target_s:g} s")
        replicas = sorted({r.replicas for r in rows})
        ax.set_xticks(replicas)
        ax.set_xlim(min(replicas) - 0.3, max(replicas) + 0.3)
        _log_if_wide(ax, finite + [target_s], "y")
        ax.set_title(f"{scale:g}x the trace's arrival rate", fontsize=10)
        ax.set_xlabel("replicas")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("TTFT p99, s (missing: infinite)")
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle(f"fleet TTFT p99: {trace_name}", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    ref = 1.0 if 1.0 in scales else scales[0]  # hits do not depend on the rate but for kv-aware's routes
    offload = [r for r in rows if r.host_blocks and r.rate_scale == ref]
    tiers = sorted({r.tier_blocks for r in offload}) or [0]
    fig, axes = plt.subplots(1, len(tiers), figsize=(5.2 * len(tiers), 4.2), sharey=True, squeeze=False)
    gib = sorted({r.host_gib for r in offload})
    for ax, tier in zip(axes[0], tiers, strict=True):
        for ci, routing in enumerate(routings):
            for si, n in enumerate(sorted({r.replicas for r in offload})):
                hp = sorted(
                    (r.host_gib, 100 * r.loaded_share)
                    for r in offload
                    if r.tier_blocks == tier and routing_label(r) == routing and r.replicas == n
                )
                if hp:
                    ax.plot(*zip(*hp, strict=True), marker=_MARKERS[si % 5], color=f"C{ci}", linestyle=_STYLES[si % 5],
                            label=f"{routing}, {n} replicas")  # fmt: skip
        if gib:
            pad = (max(gib) - min(gib)) * 0.05 or max(gib) * 0.05
            ax.set_xlim(min(gib) - pad, max(gib) + pad)
            _log_if_wide(ax, gib, "x")
            ax.set_xticks(gib)
            ax.set_xticklabels([f"{g:,.0f}" for g in gib])
        one = next((r for r in offload if r.tier_blocks == tier), None)
        name = "no shared tier" if not tier or one is None else f"shared tier {tokens_label(one.tier_tokens)} tok"
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("host memory per replica, GiB")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("prompt tokens loaded (host + tier), %")
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle(f"fleet hit rate: {trace_name}", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths
