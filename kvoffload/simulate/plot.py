"""The PNG of ``kvoffload simulate``: hit rate against host memory, one line per policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvoffload.simulate.axis_span import XSpan
from kvoffload.simulate.sweep import SimPoint, largest_run
from kvoffload.simulate.units import size_label

if TYPE_CHECKING:
    from kvoffload.simulate.cache_cli import CacheSweepPoints

__all__ = ["SweepFacts", "fit_title", "plot_hit_rates", "title_lines"]


class SweepFacts(Protocol):
    """What the plot reads of a sweep (its report, :class:`~kvoffload.simulate.report.SweepReport`)."""

    source: str  #: the workload's name, in the title
    shape: Any  #: the model shape (its ``describe()`` labels the x axis)
    policies: list[str]
    capacities: list[int]  #: host capacities swept, in offloaded blocks, ascending
    ws: int  #: distinct offloaded blocks in the prompts (the working set)
    block_bytes: int  #: bytes of one offloaded block
    block_tokens: int  #: tokens of one offloaded block


def _by_policy_and_tier(points: list[SimPoint]) -> dict[tuple[str, int], list[SimPoint]]:
    out: dict[tuple[str, int], list[SimPoint]] = {}
    for p in sorted(points, key=lambda p: (p.policy, p.tier_blocks, p.cpu_blocks)):
        out.setdefault((p.policy, p.tier_blocks), []).append(p)
    return out


#: characters per title line that fit the 8-inch figure at the title's font size, and at most this many lines
TITLE_WIDTH, TITLE_LINES = 80, 3


def title_lines(text: str, width: int = TITLE_WIDTH, max_lines: int = TITLE_LINES) -> str:
    """``text`` wrapped into at most ``max_lines`` lines of at most ``width`` characters (a long path
    is cut anywhere); a text too long for them keeps its start and its end around ``...``."""
    import textwrap

    room = width * max_lines
    while True:
        head = room // 3
        short = text if len(text) <= room else f"{text[:head]}...{text[len(text) - (room - head - 3) :]}"
        lines = textwrap.wrap(short, width, break_long_words=True, break_on_hyphens=False)
        if len(lines) <= max_lines:
            return "\n".join(lines)
        room -= width // 4  # breaks at spaces left some lines short: cut a little more


def fit_title(fig: Any, text: str, fontsize: float = 11, smallest: float = 6) -> Any:
    """``text`` as ``fig``'s title, its font made smaller (down to ``smallest``) until the title fits
    the figure's width; lays the figure out (``tight_layout``) around it. Returns the title."""
    title = fig.suptitle(text, fontsize=fontsize)
    while True:
        fig.tight_layout()
        box = title.get_window_extent(fig.canvas.get_renderer())
        if (fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1) or title.get_fontsize() <= smallest:
            return title
        title.set_fontsize(max(smallest, title.get_fontsize() * fig.bbox.width / box.width - 0.5))


def _mark(ax: Any, x: float, linestyle: str, y: float, label: str, left: bool = False) -> None:
    """A vertical grey line at ``x`` with ``label`` beside it at ``y`` (a fraction of the axes'
    height), on its right, or on its left with ``left`` (a line near the axes' right edge)."""
    ax.axvline(x, color="grey", linestyle=linestyle, linewidth=1)
    ax.annotate(
        label,
        (x, y),
        xycoords=("data", "axes fraction"),
        xytext=(-4 if left else 4, 0),
        textcoords="offset points",
        ha="right" if left else "left",
        fontsize=8,
        color="dimgrey",
    )


def _off_axis(ax: Any, x: float, y: float, label: str, span: XSpan) -> None:
    """``label`` of a reference at ``x``, far outside the swept range, written inside the axes at
    the edge it lies beyond (at ``y``, a fraction of the axes' height), with how far it is."""
    beyond = x > span.hi
    far = (
        f"{x / span.hi:,.0f}x the largest capacity →" if beyond else f"← 1/{span.lo / x:,.0f} of the smallest capacity"
    )
    ax.annotate(
        f"{label}\n(off the axis: {far})",
        (1.0 if beyond else 0.0, y),
        xycoords="axes fraction",
        xytext=(-4 if beyond else 4, 0),
        textcoords="offset points",
        ha="right" if beyond else "left",
        fontsize=8,
        color="dimgrey",
    )


def legend_ranges(policy: str, points: list[SimPoint], ref: CacheSweepPoints | None) -> str:
    """``" (0.43-0.95 of Belady, 1.00-2.00x LRU)"``: the ranges over the one-tier capacities of the
    policy's share of Belady's optimum (with ``ref``) and of its hit tokens relative to LRU's (when
    LRU ran), for the plot's legend; ``""`` when there is neither."""
    mine = {p.cpu_blocks: p.cpu_hit_tokens for p in points if p.policy == policy and not p.tier_blocks}
    parts = []
    if ref is not None:
        best = {p.cpu_blocks: p.cpu_hit_tokens for p in ref.belady}
        shares = [h / best[c] for c, h in mine.items() if best.get(c)]
        if shares:
            parts.append(f"{min(shares):.2f}-{max(shares):.2f} of Belady")
    lru = {p.cpu_blocks: p.cpu_hit_tokens for p in points if p.policy == "lru" and not p.tier_blocks}
    if policy != "lru" and lru:
        ratios = [h / lru[c] for c, h in mine.items() if lru.get(c)]
        if ratios:
            parts.append(f"{min(ratios):.2f}-{max(ratios):.2f}x LRU")
    return f" ({', '.join(parts)})" if parts else ""


def plot_hit_rates(
    points: list[SimPoint],
    path: Path,
    report: SweepFacts,
    ref: CacheSweepPoints | None = None,
    tiered: list[SimPoint] | None = None,
) -> Path:
    """Share of prompt tokens loaded from the CPU tier vs host memory (GiB), one line per policy;
    offloaded blocks on the top axis, the prompts' working set as a dashed line (named at the edge
    instead when it lies far beyond the swept capacities, :class:`~kvoffload.simulate.axis_span.XSpan`); with ``ref``,
    Belady's optimum and the infinite cache beside the policies; with ``tiered`` (runs with a
    shared tier), one dash-dotted line per (policy, tier capacity) of the share loaded from host
    memory and the tier together. The x axis spans the swept capacities, logarithmic when they
    span a decade or more."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib_per_block = report.block_bytes / 2**30
    fig, ax = plt.subplots(figsize=(8, 5))
    colors: dict[str, Any] = {}
    for policy in report.policies:
        pts = sorted((p for p in points if p.policy == policy), key=lambda p: p.cpu_blocks)
        (line,) = ax.plot(
            [p.cpu_blocks * gib_per_block for p in pts],
            [100 * p.cpu_hit_rate for p in pts],
            marker="o",
            label=policy + legend_ranges(policy, points, ref),
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
    span = XSpan([c * gib_per_block for c in report.capacities])
    if span.log:
        ax.set_xscale("log")
    ws_gib = report.ws * gib_per_block
    # (x, line style, label height beside the line / at the edge, label): beside a line low down,
    # where the curves, rising with memory, leave room; at the edge, for a sweep far below it, mid-height
    marks = [(ws_gib, "--", (0.06, 0.45), f"prompts' working set\n{report.ws:,} blocks = {ws_gib:,.2f} GiB")]
    top_run = largest_run(points)
    if top_run.cpu_evictions == 0 and top_run.distinct_blocks_stored > report.ws:
        all_gib = top_run.distinct_blocks_stored * gib_per_block
        n_all = top_run.distinct_blocks_stored
        marks.append(
            (
                all_gib,
                ":",
                (0.2, 0.62),
                f"all stored blocks (prompts + generated)\n{n_all:,} blocks = {all_gib:,.2f} GiB",
            )
        )
    for mark in marks:
        if span.near(mark[0]):
            span.include(mark[0])
    ax.set_xlim(*span.limits())
    for x, style, (y_line, y_edge), label in marks:
        if span.near(x):
            _mark(ax, x, style, y_line, label, left=span.share(x) > 0.75)
        else:  # far outside the swept range: named at the edge it lies beyond, not drawn
            _off_axis(ax, x, y_edge, label, span)
    ax.set_xlabel(f"host memory for the CPU tier (GiB) — {report.shape.describe()}")
    ax.set_ylabel("% of prompt tokens loaded" if tiered else "% of prompt tokens loaded from the CPU tier")

    def to_blocks(gib: Any) -> Any:
        return gib / gib_per_block

    def to_gib(blocks: Any) -> Any:
        return blocks * gib_per_block

    top = ax.secondary_xaxis("top", functions=(to_blocks, to_gib))
    top.set_xlabel(f"offloaded blocks of {report.block_tokens} tokens ({size_label(report.block_bytes)} each)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="eviction policy", loc="best", fontsize=8 if tiered else None)
    fit_title(fig, title_lines(f"How much host memory? {report.source}"))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
