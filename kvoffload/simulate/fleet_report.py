"""The fleet report of ``kvoffload simulate --replicas``: one row per fleet, the table, CSV, JSON and plot.

Per routing x replicas x policy x host capacity (per replica) x tier capacity:

* where the prompt tokens came from: the replica's host pool, the shared tier, computed;
* load balance: the busiest replica's requests and prompt tokens over the mean (1.0: even);
* the shared tier's traffic at the trace's own arrival rate: GB/s read (``GET`` of promoted
  blocks) and written (``SET NX`` of every block written through), averaged over the trace and
  at the peak: the most bytes within any 60 s of arrivals, over 60 s;
* prefill saved: the loaded tokens' prefill, in GPU-seconds at ``prefill_tokens_per_s`` (linear in
  tokens: attention's growth with context is left out, so long prompts save somewhat more).
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.simulate.fleet import FleetResult, FleetTrace
from kvoffload.simulate.units import size_label

__all__ = [
    "PEAK_WINDOW_S",
    "PREFILL_TOKENS_PER_S",
    "UNBALANCED",
    "FleetRow",
    "fleet_rows",
    "fleet_table",
    "imbalance_lines",
    "write_fleet",
]

#: the window of the tier's peak traffic, seconds of arrivals
PEAK_WINDOW_S = 60.0
#: default prefill throughput per GPU of the named model shapes, tokens/s: 2 x parameters FLOPs per
#: token at 40 % of an H100's 989 dense bf16 TFLOP/s (8B: 24.7K, 70B: 2.8K, rounded)
PREFILL_TOKENS_PER_S = {"8b": 25_000.0, "70b": 2_800.0}
#: a fleet whose busiest replica gets at least this many times the mean prompt tokens is named
#: under the table (:func:`imbalance_lines`)
UNBALANCED = 1.5


@dataclass(frozen=True)
class FleetRow:
    """One fleet's figures (shares of all prompt tokens; GB/s = 10^9 bytes per second)."""

    routing: str
    replicas: int
    policy: str
    host_blocks: int
    host_tokens: int
    host_gib: float
    tier_blocks: int
    tier_tokens: int
    tier_gib: float
    prompt_tokens: int
    host_hit_tokens: int
    tier_hit_tokens: int
    computed_tokens: int
    host_share: float
    tier_share: float
    computed_share: float
    requests_max_over_mean: float
    tokens_max_over_mean: float
    tier_read_gbps: float
    tier_read_peak_gbps: float
    tier_write_gbps: float
    tier_write_peak_gbps: float
    prefill_gpu_s_saved: float
    host_evictions: int
    tier_evictions: int
    seconds: float


def peak_rate(times: np.ndarray, amounts: np.ndarray, window_s: float = PEAK_WINDOW_S) -> float:
    """The most of ``amounts`` arriving within any ``window_s`` (``times`` sorted), per second."""
    if not len(times):
        return 0.0
    cs = np.concatenate([[0.0], np.cumsum(amounts, dtype=np.float64)])
    end = np.searchsorted(times, times + window_s, side="left")
    return float((cs[end] - cs[:-1]).max() / window_s)


def _balance(per: np.ndarray) -> float:
    mean = per.mean()
    return float(per.max() / mean) if mean else 1.0


def fleet_rows(
    results: list[FleetResult], ft: FleetTrace, block_bytes: int, prefill_tokens_per_s: float
) -> list[FleetRow]:
    bt = ft.trace.block_tokens
    t, dur = ft.arrival_s, ft.duration_s
    rows = []
    for r in results:
        read, written = r.tier_reads * block_bytes / 1e9, r.tier_writes * block_bytes / 1e9
        pt = r.prompt_tokens or 1
        rows.append(
            FleetRow(
                r.routing,
                r.replicas,
                r.policy,
                r.capacity,
                r.capacity * bt,
                r.capacity * block_bytes / 2**30,
                r.tier_capacity,
                r.tier_capacity * bt,
                r.tier_capacity * block_bytes / 2**30,
                r.prompt_tokens,
                r.host_hit_tokens,
                r.tier_hit_tokens,
                r.prompt_tokens - r.hit_tokens,
                r.host_hit_tokens / pt,
                r.tier_hit_tokens / pt,
                (r.prompt_tokens - r.hit_tokens) / pt,
                _balance(r.per_replica()),
                _balance(r.per_replica(ft.trace.prompt_tokens.astype(np.float64))),
                float(read.sum() / dur),
                peak_rate(t, read),
                float(written.sum() / dur),
                peak_rate(t, written),
                r.hit_tokens / prefill_tokens_per_s,
                r.evictions,
                r.tier_evictions,
                r.seconds,
            )
        )
    return rows


def _tokens(n: int) -> str:
    return "-" if not n else f"{n / 1e6:.3g}M" if n >= 10**6 - 10**3 else f"{n / 1e3:.3g}K" if n >= 1000 else str(n)


def fleet_table(rows: list[FleetRow]) -> str:
    """The report's table, one line per row."""
    head = (
        f"{'routing':<13}{'replicas':>8}{'host/replica':>13}{'tier':>7}{'host':>8}{'tier':>7}{'computed':>9}"
        f"{'req max/mean':>13}{'tok max/mean':>13}{'tier GB/s rd (peak)':>21}{'wr (peak)':>15}"
        f"{'prefill GPU-s saved':>21}"
    )
    lines = [head]
    for w in rows:
        rd = f"{w.tier_read_gbps:.2f} ({w.tier_read_peak_gbps:.2f})" if w.tier_blocks else "-"
        wr = f"{w.tier_write_gbps:.2f} ({w.tier_write_peak_gbps:.2f})" if w.tier_blocks else "-"
        lines.append(
            f"{w.routing:<13}{w.replicas:>8}{_tokens(w.host_tokens) + ' tok':>13}{_tokens(w.tier_tokens):>7}"
            f"{w.host_share:>8.1%}{w.tier_share:>7.1%}{w.computed_share:>9.1%}{w.requests_max_over_mean:>13.2f}"
            f"{w.tokens_max_over_mean:>13.2f}{rd:>21}{wr:>15}{w.prefill_gpu_s_saved:>21,.0f}"
        )
    return "\n".join(lines)


def imbalance_lines(rows: list[FleetRow], threshold: float = UNBALANCED) -> list[str]:
    """Plain lines naming the routings that unbalance load: per routing and replica count, the
    largest busiest-replica-over-mean prompt tokens (and requests) of its rows when it reaches
    ``threshold``; "all on one replica" when it equals the replica count."""
    worst: dict[tuple[str, int], FleetRow] = {}
    for w in rows:
        key = (w.routing, w.replicas)
        if w.replicas > 1 and (key not in worst or w.tokens_max_over_mean > worst[key].tokens_max_over_mean):
            worst[key] = w
    out = []
    for (routing, n), w in worst.items():
        if w.tokens_max_over_mean >= threshold:
            alone = ": every request on one replica" if w.requests_max_over_mean >= n - 1e-9 else ""
            out.append(
                f"unbalanced: {routing} with {n} replicas sends its busiest replica {w.tokens_max_over_mean:.2f}x "
                f"the mean prompt tokens ({w.requests_max_over_mean:.2f}x the mean requests{alone})"
            )
    return out


def write_fleet(rows: list[FleetRow], settings: dict[str, Any], out: Path, plot: bool = True) -> list[Path]:
    """``fleet.csv``, ``fleet.json`` and (``plot``) ``fleet.png`` in ``out``; returns their paths."""
    csv_path, json_path, png_path = out / "fleet.csv", out / "fleet.json", out / "fleet.png"
    fields = list(FleetRow.__dataclass_fields__)
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow(asdict(row))
    json_path.write_text(json.dumps({"fleet": settings, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    if not plot:
        return [csv_path, json_path]
    _plot(rows, settings, png_path)
    return [csv_path, json_path, png_path]


def _plot(rows: list[FleetRow], settings: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = sorted({r.tier_blocks for r in rows})
    fig, axes = plt.subplots(1, len(tiers), figsize=(5.5 * len(tiers), 4.2), sharey=True, squeeze=False)
    routings = list(dict.fromkeys(r.routing for r in rows))
    hosts = sorted({r.host_blocks for r in rows})
    styles = ["-", "--", ":", "-."]
    for ax, tier in zip(axes[0], tiers, strict=True):
        for ci, routing in enumerate(routings):
            for si, host in enumerate(hosts):
                pts = sorted(
                    (r.replicas, 100 * (r.host_share + r.tier_share))
                    for r in rows
                    if r.tier_blocks == tier and r.routing == routing and r.host_blocks == host
                )
                if not pts:
                    continue
                one = next(r for r in rows if r.host_blocks == host)
                ax.plot(
                    *zip(*pts, strict=True),
                    marker="o",
                    color=f"C{ci}",
                    linestyle=styles[si % len(styles)],
                    label=f"{routing}, {_tokens(one.host_tokens)} tok/replica",
                )
        one_tier = next(r for r in rows if r.tier_blocks == tier)
        ax.set_title(
            "no shared tier"
            if not tier
            else f"shared tier {_tokens(one_tier.tier_tokens)} tok ({size_label(int(one_tier.tier_gib * 2**30))})",
            fontsize=10,
        )
        ax.set_xlabel("replicas")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("prompt tokens loaded (host + tier), %")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"fleet: {Path(str(settings.get('source', ''))).name[:60]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
