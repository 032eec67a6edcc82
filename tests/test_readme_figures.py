"""Every figure the README quotes comes from a committed results file (``bench/results/``) or is
printed by a command shown beside it (an ``output of`` block, which ``tests/test_readme.py`` runs).

``QUOTED`` reads each figure from its file and formats it as the README writes it; the README must
contain it exactly, and every measured-looking number in the README's prose (a ratio, a share, a
time, a rate) must be one of them: a hand-copied number that drifts from its file fails here.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from tests.readme_blocks import README, marked_blocks

RESULTS = README.parent / "bench" / "results"


@cache
def _results(name: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / name).read_text())["sections"])


VLLM_RESULTS = "cpu-amd-epyc-vllm.json"


def _vllm_rows() -> list[dict[str, Any]]:
    return list(_results(VLLM_RESULTS)["vllm"]["results"]["rows"])


def _vllm_manager_ratio() -> str:
    (row,) = [r for r in _vllm_rows() if (r["setting"], r["policy"]) == ("256req-1e5", "lru")]
    return f"{row['manager_ratio']:.2f}×"


def _vllm_table() -> str:
    """The README's cost table: per setting and policy, kvoffload / vLLM per engine step inside vLLM
    (manager's calls, connector's scheduler-side calls; without collections in brackets), then the
    manager against the OrderedDict design (``bench_manager``: requests/s, and the time of evicting
    1,000 blocks with cold caches)."""
    lines = ["kvoffload / vLLM per engine step   manager (no GC)   connector (no GC)"]
    for r in _vllm_rows():
        lines.append(
            f"{r['setting']:<11} {r['policy'].upper():<22} {r['manager_ratio']:.2f}× ({r['manager_ratio_no_gc']:.2f}×)"
            f"     {r['ratio']:.2f}× ({r['ratio_no_gc']:.2f}×)"
        )
    m = _results("cpu-amd-epyc.json")["manager"]["results"]
    trace = " / ".join(f"{t['ratio_batch_vs_baseline']:.2f}×" for t in m["trace"])
    evict = [e for e in m["evict_1000"] if e["pinned_at_old_end"] == 0]
    cold = " / ".join(f"{e['ours_evict_ms'] / e['baseline_evict_ms']:.2f}×" for e in evict)
    lines.append(f"requests/s vs the OrderedDict design at 10^4 / 10^5 / 10^6 blocks: {trace}")
    lines.append(f"time to evict 1,000 blocks (cold) vs that design's at 10^4 / 10^6: {cold}")
    return "\n".join(lines)


def _redis_load_ratios() -> str:
    loads = [r["load_ratio"] for r in _results("cpu-intel-r-xeon-r-processor.json")["tiers"]["results"]["redis"]]
    return f"{min(loads):.2f}–{max(loads):.2f}×"


def _decode_step() -> str:
    decode = _results("cpu-amd-epyc.json")["scheduler"]["results"]["decode"]
    return f"{decode['us_per_step_mean']:.0f} µs"


def _newcomer(step: str) -> Callable[[], str]:
    def figure() -> str:
        return f"{_results('cpu-intel-r-xeon-r-processor-newcomer.json')['newcomer']['results'][step]['wall_s']:.0f} s"

    return figure


def _newcomer_load() -> str:
    steps = _results("cpu-intel-r-xeon-r-processor-newcomer.json")["newcomer"]["results"]
    return f"load average {steps['first_make_demo']['load_average_before']:.0f}"


def _fleet_table() -> str:
    """The README's fleet table, from ``bench/results/fleet-conversation/fleet.csv``: per routing and
    replica count (one replica is the same fleet whatever the routing), the TTFT p99 at the trace's
    arrival rate without offloading, with 1M / 3M tokens of host memory per replica, and with a
    20M-token tier beneath them; then the replicas needed for the run's TTFT target at each rate
    scale (from ``fleet.json``), and the TTFT p99 without queueing (8 replicas at the lowest rate)."""
    with (RESULTS / "fleet-conversation" / "fleet.csv").open() as f:
        rows = list(csv.DictReader(f))
    mem = ("none", "1M", "3M", "1M+20M", "3M+20M")

    def label(r: dict[str, str]) -> str:
        if r["host_blocks"] == "0":
            return "none"
        host = f"{int(r['host_tokens']) / 1e6:.0f}M"
        return host + (f"+{int(r['tier_tokens']) / 1e6:.0f}M" if r["tier_blocks"] != "0" else "")

    def sec(v: str) -> str:
        x = float(v)
        return f"{x:.1f}" if x < 100 else f"{x:,.0f}"

    at1 = {(r["routing"], r["replicas"], label(r)): r for r in rows if float(r["rate_scale"]) == 1.0}
    lines = ["TTFT p99, s, 1x rate | host memory per replica: none / 1M / 3M / 1M+20M tier / 3M+20M tier"]
    keys = [("random", "1")] + [(r, n) for r in ("random", "least-loaded", "session", "kv-aware") for n in ("4", "8")]
    for routing, n in keys:
        cells = " / ".join(sec(at1[(routing, n, m)]["ttft_p99_s"]) for m in mem)
        lines.append(f"{'any' if n == '1' else routing:<13}{n:>2} | {cells}")
    data = json.loads((RESULTS / "fleet-conversation" / "fleet.json").read_text())["fleet"]
    need = {(x["routing"], x["memory"], x["rate_scale"]): x for x in data["replicas_needed"]}
    scales = data["rate_scales"]
    lines.append(
        f"replicas for TTFT p99 <= {data['ttft_target_s']:g} s at "
        + " / ".join(f"{s:g}x" for s in scales)
        + " the rate | none | 3M | 3M+20M tier"
    )
    for routing in ("random", "least-loaded", "session", "kv-aware w=1"):
        cells = []
        for m in ("none", "3M", "3M+20M"):
            got = [need[(routing, m, s)] for s in scales]
            cells.append(" / ".join(str(x["replicas"]) if x["replicas"] else f">{x['most_swept']}" for x in got))
        lines.append(f"{routing:<13} | " + " | ".join(cells))
    low = min(float(r["rate_scale"]) for r in rows)
    floor = {m: min(float(r["service_p99_s"]) for r in rows if r["replicas"] == "8" and float(r["rate_scale"]) == low
                    and label(r) == m) for m in ("none", "3M", "3M+20M")}  # fmt: skip
    lines.append("TTFT p99 with no queueing at all | " + " | ".join(f"{m} {v:.1f} s" for m, v in floor.items()))
    return "\n".join(lines)


GPU_RESULTS = "nvidia-h100-80gb-hbm3.json"


def _gpu_rows() -> list[dict[str, Any]]:
    return list(_results(GPU_RESULTS)["transfer"]["results"]["rows"])


def _gpu_best_vs_peak(page_kib: int, max_pages: int | None = None) -> list[float]:
    """Per case (shape, page, job, direction) at ~``page_kib`` KiB pages: the best data path's ratio
    to the link peak P."""
    best: dict[tuple[Any, ...], float] = {}
    for r in _gpu_rows():
        if r["method"] in ("direct", "staged", "dma") and round(r["page_bytes"] / 1024) == page_kib:
            if max_pages is None or r["pages"] <= max_pages:
                key = (r["shape"], r["pages"], r["direction"])
                best[key] = max(best.get(key, 0.0), r["ratio_to_peak"])
    return list(best.values())


def _gpu_peak() -> str:
    peaks = [r["gbps"] for r in _gpu_rows() if r["method"] == "P"]
    return f"P = {min(peaks):.0f}–{max(peaks):.0f} GB/s"


def _gpu_at(page_kib: int, max_pages: int | None = None) -> Callable[[], str]:
    def figure() -> str:
        ratios = _gpu_best_vs_peak(page_kib, max_pages)
        return f"{min(ratios):.2f}–{max(ratios):.2f} P"

    return figure


def _gpu_vs_loop() -> str:
    summary = _results(GPU_RESULTS)["transfer"]["results"]["summary"]
    return f"at least {int(min(summary[k]['min'] for k in ('pack_vs_loop_4_24k', 'unpack_vs_loop_4_24k')))}×"


def _host_path_rows() -> list[dict[str, Any]]:
    rows = _results("cpu-intel-r-xeon-r-processor.json")["host_path"]["results"]["rows"]
    return [r for r in rows if r["mode"] == "single"]


def _host_path_us() -> str:
    us = [r["us_per_job"] for r in _host_path_rows()]
    return f"{min(us):.0f}–{max(us):.0f} µs"


def _host_path_ratio() -> str:
    ratios = [r["ratio"] for r in _host_path_rows()]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


#: the README's figures: what each is, and how to read it from its results file
QUOTED: dict[str, Callable[[], str]] = {
    "kvoffload's manager / vLLM's per step, LRU, 256req-1e5": _vllm_manager_ratio,
    "the cost table inside vLLM and against the OrderedDict design": _vllm_table,
    "Redis tier loads / redis-benchmark GETs, 1-4 MiB": _redis_load_ratios,
    "scheduler decode step, 256 running requests": _decode_step,
    "first make demo in a fresh clone": _newcomer("first_make_demo"),
    "second make demo": _newcomer("second_make_demo"),
    "machine load during the newcomer run": _newcomer_load,
    "the fleet table on the Mooncake conversation trace": _fleet_table,
    "H100 link peak (one contiguous copy)": _gpu_peak,
    "H100 best data path vs P, 32 KiB pages": _gpu_at(32),
    "H100 best data path vs P, ~1k-page jobs of 4 KiB pages": _gpu_at(4, 1024),
    "H100 data paths vs the per-page loop, 4-24 KiB": _gpu_vs_loop,
    "host work per transfer job, CUDA faked": _host_path_us,
    "host work per transfer job vs before": _host_path_ratio,
}

#: a measured-looking number: a ratio, a share, a time or a rate, or a share of the link peak P (a
#: range counts as one)
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?\s?(?:×|%|µs|ms|GB/s|s\b|min\b|P\b)")


def _prose() -> str:
    """The README without its code blocks, inline code and comments."""
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


@pytest.mark.parametrize("what", sorted(QUOTED))
def test_quoted_figure_matches_its_results_file(what: str) -> None:
    assert QUOTED[what]() in README.read_text(), what


def test_every_figure_in_the_prose_has_a_source() -> None:
    sources = [f() for f in QUOTED.values()] + list(marked_blocks("output of").values())
    found = FIGURE.findall(_prose())
    assert len(found) >= len(QUOTED) - 3  # the load average has no unit; the two tables are code blocks
    assert [f for f in found if not any(f in s for s in sources)] == []
