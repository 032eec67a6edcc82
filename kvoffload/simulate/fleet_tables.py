"""The fleet report's text: the table of every fleet, the replicas needed for a TTFT target, and
the routings that pile load onto one replica."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvoffload.simulate.fleet_report import FleetRow
from kvoffload.simulate.units import tokens_label

__all__ = [
    "UNBALANCED",
    "NeededRow",
    "fleet_table",
    "floor_line",
    "imbalance_lines",
    "memory_label",
    "replicas_needed",
    "replicas_table",
    "routing_label",
    "seconds_label",
]

#: a fleet whose busiest replica gets at least this many times the mean prompt tokens is named
#: under the table (:func:`imbalance_lines`)
UNBALANCED = 1.5


def memory_label(row: FleetRow) -> str:
    """Host memory per replica and tier, e.g. ``1M`` / ``1M+20M`` / ``none``."""
    if not row.host_blocks:
        return "none"
    tier = f"+{tokens_label(row.tier_tokens)}" if row.tier_blocks else ""
    return f"{tokens_label(row.host_tokens)}{tier}"


def routing_label(row: FleetRow) -> str:
    return row.routing if row.kv_weight is None else f"{row.routing} w={row.kv_weight:g}"


def seconds_label(s: float) -> str:
    if not math.isfinite(s):
        return "inf"
    return f"{s:.2f}" if s < 10 else f"{s:,.0f}"


def fleet_table(rows: list[FleetRow]) -> str:
    """One line per row: memory (host per replica + tier tokens), rate scale, where prompt tokens
    came from, TTFT, queueing, utilisation, balance, tier traffic, prefill saved."""
    head = (
        f"{'routing':<16}{'replicas':>8}{'memory':>12}{'rate':>6}{'host':>7}{'tier':>7}{'TTFT p50':>10}{'p90':>8}"
        f"{'p99':>8}{'queue':>8}{'util max':>9}{'tok max/mean':>13}{'tier GB/s rd/wr':>16}{'GPU-s saved':>12}"
    )
    lines = [head]
    for w in rows:
        traffic = f"{w.tier_read_gbps:.2f}/{w.tier_write_gbps:.2f}" if w.tier_blocks else "-"
        lines.append(
            f"{routing_label(w):<16}{w.replicas:>8}{memory_label(w):>12}{w.rate_scale:>5g}x{w.host_share:>7.1%}"
            f"{w.tier_share:>7.1%}{seconds_label(w.ttft_p50_s):>10}{seconds_label(w.ttft_p90_s):>8}"
            f"{seconds_label(w.ttft_p99_s):>8}{seconds_label(w.queue_mean_s):>8}{w.util_max:>9.2f}"
            f"{w.tokens_max_over_mean:>13.2f}{traffic:>16}{w.prefill_gpu_s_saved:>12,.0f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class NeededRow:
    """The fewest swept replicas whose TTFT p99 holds the target (None: none of them), per
    routing, memory and rate scale; ``p99_s`` is that fleet's TTFT p99 (or the largest swept one's)."""

    routing: str
    memory: str
    rate_scale: float
    replicas: int | None
    p99_s: float
    most_swept: int


def replicas_needed(rows: list[FleetRow], target_s: float) -> list[NeededRow]:
    groups: dict[tuple[str, str, float], list[FleetRow]] = {}
    for r in rows:
        groups.setdefault((routing_label(r), memory_label(r), r.rate_scale), []).append(r)
    out = []
    for (routing, memory, scale), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.replicas)
        ok = [r for r in rs if r.ttft_p99_s <= target_s]
        pick = ok[0] if ok else rs[-1]
        out.append(NeededRow(routing, memory, scale, pick.replicas if ok else None, pick.ttft_p99_s, rs[-1].replicas))
    return out


def replicas_table(needed: list[NeededRow], target_s: float) -> str:
    """Per routing and rate scale, the replicas needed under each memory configuration (``>N``:
    more than the largest swept)."""
    memories = list(dict.fromkeys(n.memory for n in needed))
    keyed = {(n.routing, n.rate_scale, n.memory): n for n in needed}
    head = f"{'routing':<16}{'rate':>6}" + "".join(f"{m:>12}" for m in memories)
    lines = [f"replicas needed for TTFT p99 <= {seconds_label(target_s)} s (memory: host tokens per replica + tier):"]
    lines.append(head)
    for routing, scale in dict.fromkeys((n.routing, n.rate_scale) for n in needed):
        cells = []
        for m in memories:
            n = keyed.get((routing, scale, m))
            cells.append("" if n is None else str(n.replicas) if n.replicas else f">{n.most_swept}")
        lines.append(f"{routing:<16}{scale:>5g}x" + "".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def floor_line(rows: list[FleetRow]) -> str:
    """The TTFT p99 no number of replicas goes below (each request alone on its replica), per
    memory: the time in service's p99 of the most replicated fleet at the lowest rate."""
    low = min(r.rate_scale for r in rows)
    most = max(r.replicas for r in rows)
    best: dict[str, float] = {}
    for r in rows:
        if r.rate_scale == low and r.replicas == most:
            m = memory_label(r)
            best[m] = min(best.get(m, math.inf), r.service_p99_s)
    cells = ", ".join(f"{m} {seconds_label(v)} s" for m, v in best.items())
    return f"TTFT p99 without any queueing (time in service alone, {most} replicas at {low:g}x): {cells}"


def imbalance_lines(rows: list[FleetRow], threshold: float = UNBALANCED) -> list[str]:
    """Plain lines naming the routings that unbalance load: per routing and replica count, the
    largest busiest-replica-over-mean prompt tokens (and requests) of its rows when it reaches
    ``threshold``; "all on one replica" when it equals the replica count."""
    worst: dict[tuple[str, int], FleetRow] = {}
    for w in rows:
        key = (routing_label(w), w.replicas)
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
