"""The PNG of ``kvoffload simulate``: hit rate against host memory, one line per policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.app.units import size_label
from kvoffload.sim.sweep import SimPoint, largest_run

if TYPE_CHECKING:
    from kvoffload.app.simulate_cache import CacheSweepPoints
    from kvoffload.app.simulate_report import SweepReport

__all__ = ["plot_hit_rates"]


def _by_policy_and_tier(points: list[SimPoint]) -> dict[tuple[str, int], list[SimPoint]]:
    out: dict[tuple[str, int], list[SimPoint]] = {}
    for p in sorted(points, key=lambda p: (p.policy, p.tier_blocks, p.cpu_blocks)):
        out.setdefault((p.policy, p.tier_blocks), []).append(p)
    return out


def _mark(ax: Any, x: float, linestyle: str, y: float, label: str) -> None:
    """A vertical grey line at ``x`` with ``label`` beside it at ``y`` (a fraction of the axes' height)."""
    ax.axvline(x, color="grey", linestyle=linestyle, linewidth=1)
    ax.annotate(
        label,
        (x, y),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=8,
        color="dimgrey",
    )


def plot_hit_rates(
    points: list[SimPoint],
    path: Path,
    report: SweepReport,
    ref: CacheSweepPoints | None = None,
    tiered: list[SimPoint] | None = None,
) -> Path:
    """Share of prompt tokens loaded from the CPU tier vs host memory (GiB), one line per policy;
    offloaded blocks on the top axis, the prompts' working set as a dashed line; with ``ref``,
    Belady's optimum and the infinite cache beside the policies; with ``tiered`` (runs with a
    shared tier), one dash-dotted line per (policy, tier capacity) of the share loaded from host
    memory and the tier together. The x axis is logarithmic when the capacities span two decades
    or more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib_per_block = report.block_bytes / 2**30
    fig, ax = plt.subplots(figsize=(8, 5))
    colors: dict[str, Any] = {}
    for policy in report.policies:
        pts = sorted((p for p in points if p.policy == policy), key=lambda p: p.cpu_blocks)
        (line,) = ax.plot(
            [p.cpu_blocks * gib_per_block for p in pts], [100 * p.cpu_hit_rate for p in pts], marker="o", label=policy
        )
        colors[policy] = line.get_color()
    styles = ("-.", (0, (5, 2)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1)))
    tier_sizes = sorted({p.tier_blocks for p in tiered or []})
    for (policy, tier), pts in _by_policy_and_tier(tiered or []).items():
        ax.plot(
            [p.cpu_blocks * gib_per_block for p in pts],
            [100 * p.hit_rate for p in pts],
            color=colors.get(policy),
            linestyle=styles[tier_sizes.index(tier) % len(styles)],
            marker="s",
            markersize=4,
            label=f"{policy} + {size_label(tier * report.block_bytes)} shared tier",
        )
    if ref is not None:
        bel = sorted(ref.belady, key=lambda p: p.cpu_blocks)
        ax.plot(
            [p.cpu_blocks * gib_per_block for p in bel],
            [100 * p.cpu_hit_rate for p in bel],
            color="black",
            linestyle="--",
            marker="x",
            label="Belady (offline optimum)",
        )
        ax.axhline(100 * ref.infinite.cpu_hit_rate, color="black", linestyle=":", label="infinite cache")
    log_x = report.capacities[-1] >= 100 * report.capacities[0]
    if log_x:
        ax.set_xscale("log")
    ws_gib = report.ws * gib_per_block
    _mark(ax, ws_gib, "--", 0.45, f"prompts' working set\n{report.ws:,} blocks = {ws_gib:.2f} GiB")
    top_run = largest_run(points)
    if top_run.cpu_evictions == 0 and top_run.distinct_blocks_stored > report.ws:
        all_gib = top_run.distinct_blocks_stored * gib_per_block
        n_all = top_run.distinct_blocks_stored
        _mark(ax, all_gib, ":", 0.6, f"all stored blocks (prompts + generated)\n{n_all:,} blocks = {all_gib:.2f} GiB")
    ax.set_xlabel(f"host memory for the CPU tier (GiB) — {report.shape.describe()}")
    ax.set_ylabel("% of prompt tokens loaded" if tiered else "% of prompt tokens loaded from the CPU tier")

    def to_blocks(gib: Any) -> Any:
        return gib / gib_per_block

    def to_gib(blocks: Any) -> Any:
        return blocks * gib_per_block

    top = ax.secondary_xaxis("top", functions=(to_blocks, to_gib))
    top.set_xlabel(f"offloaded blocks of {report.block_tokens} tokens ({size_label(report.block_bytes)} each)")
    fig.suptitle(f"How much host memory? {report.source}", fontsize=11)
    if not log_x:
        ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="eviction policy", loc="lower right", fontsize=8 if tiered else None)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
