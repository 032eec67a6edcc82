"""Summary ratios and the plot of ``bench/bench_transfer.py`` results.

``summary(rows, gpu)``: per target (``bench/bench_transfer.py``'s docstring), the worst case
(over shapes, page sizes and job sizes in the range) of the best kvoffload path (direct, staged,
dma) -- its ratio to ``P`` or to a baseline; targets are only attached on a GPU.
``plot(result, path)``: GB/s and ratio to ``P`` vs page size for every method, baselines included.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["summary", "plot"]

KIB = 1024


def _best(
    rows: list[dict[str, Any]], direction: str, lo: int, hi: int, key: str, min_pages: int = 0
) -> dict[str, Any] | None:
    """The worst case (min over shapes/sizes) of the best kvoffload method per case."""
    cases: dict[tuple, float] = {}
    for r in rows:
        if (
            r["direction"] == direction
            and lo <= r["page_bytes"] <= hi
            and r["pages"] >= min_pages
            and r["method"] in ("direct", "staged", "dma")
            and r.get(key) is not None
        ):
            k = (r["shape"], r["page_bytes"], r["pages"])
            cases[k] = max(cases.get(k, 0.0), r[key])
    if not cases:
        return None
    return {"min": min(cases.values()), "median": statistics.median(cases.values()), "cases": len(cases)}


def summary(rows: list[dict[str, Any]], gpu: bool) -> dict[str, Any]:
    targets = [
        ("pack_P_at_32k", "pack", 28 * KIB, 36 * KIB, "ratio_to_peak", 0, 0.9),
        ("unpack_P_at_32k", "unpack", 28 * KIB, 36 * KIB, "ratio_to_peak", 0, 0.8),
        ("pack_P_at_4k", "pack", 3 * KIB, 5 * KIB, "ratio_to_peak", 0, 0.6),
        ("unpack_P_at_4k", "unpack", 3 * KIB, 5 * KIB, "ratio_to_peak", 0, 0.6),
        ("pack_vs_loop_4_24k", "pack", 3 * KIB, 24 * KIB, "vs_loop", 1000, 5.0),
        ("unpack_vs_loop_4_24k", "unpack", 3 * KIB, 24 * KIB, "vs_loop", 1000, 5.0),
        ("pack_vs_batched_4_24k", "pack", 3 * KIB, 24 * KIB, "vs_batched", 1000, 1.5),
        ("unpack_vs_batched_4_24k", "unpack", 3 * KIB, 24 * KIB, "vs_batched", 1000, 1.5),
    ]
    out: dict[str, Any] = {}
    for name, d, lo, hi, key, min_pages, target in targets:
        got = _best(rows, d, lo, hi, key, min_pages if gpu else 0)
        if got is not None:
            out[name] = {**got, "target": target if gpu else None, "met": got["min"] >= target if gpu else None}
    return out


def plot(result: dict[str, Any], path: Path) -> Path:
    """GB/s (top) and ratio to P (bottom) vs page size, pack and unpack, every method incl. baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for col, direction in enumerate(("pack", "unpack")):
        series: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for r in rows:
            if r["direction"] == direction:
                series.setdefault(r["method"], {}).setdefault(r["page_bytes"], []).append(r)
        for method, points in sorted(series.items()):
            xs = sorted(points)
            base = method in ("P", "memcpy", "loop", "batched")
            style: dict[str, Any] = {"linestyle": "--" if base else "-", "marker": "x" if base else "o"}
            for row, key in ((0, "gbps"), (1, "ratio_to_peak")):
                axes[row][col].plot(
                    [x / KIB for x in xs], [min(p[key] for p in points[x]) for x in xs], label=method, **style
                )
        axes[0][col].set_title(
            f"{direction} ({'GPU->host' if direction == 'pack' else 'host->GPU'})"
            if result["mode"] == "gpu"
            else f"{direction} (CPU copies)"
        )
        axes[0][col].set_ylabel("GB/s (worst case over shapes/job sizes)")
        axes[1][col].set_ylabel("ratio to P" if result["mode"] == "gpu" else "ratio to memcpy")
        axes[1][col].set_xlabel("page size (KiB)")
        axes[0][col].set_yscale("log")
        for row in range(2):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].grid(True, alpha=0.3)
            axes[row][col].legend(fontsize=8)
    fig.suptitle(f"kvoffload transfer — {result.get('device', '?')} — {result.get('max_programs')} programs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
