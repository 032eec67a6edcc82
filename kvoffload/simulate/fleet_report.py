"""The fleet report's rows: one per fleet and arrival rate, written to ``fleet.csv`` and ``fleet.json``.

Per routing (and ``kv-aware`` weight) x replicas x policy x host capacity (per replica; 0: no
offloading) x tier capacity x arrival-rate scale:

* where the prompt tokens came from: the replica's host pool, the shared tier, computed;
* load balance: the busiest replica's requests and prompt tokens over the mean (1.0: even);
* the shared tier's traffic at the trace's own arrival rate: GB/s read (``GET`` of promoted
  blocks) and written (``SET NX`` of every block written through), averaged over the trace and
  at the peak: the most bytes within any 60 s of arrivals, over 60 s;
* prefill saved: the GPU-seconds of prefill the loaded tokens did not need (the engine-time model's
  prefill of every prompt without and with its hits);
* time (:mod:`kvoffload.simulate.engine_time`) at ``rate_scale`` x the trace's arrival rate: TTFT
  p50 / p90 / p99 and mean, queueing delay (mean, p99), time in service (p99: the TTFT p99 no
  number of replicas goes below), utilisation and decode share per replica
  (mean and max in the CSV, every replica's in the JSON and the CSV's ``;``-joined columns).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.simulate.engine_time import EngineTime, percentile, time_requests
from kvoffload.simulate.fleet import FleetResult, FleetTrace

__all__ = ["PEAK_WINDOW_S", "FleetRow", "fleet_rows", "peak_rate", "write_rows"]

#: the window of the tier's peak traffic, seconds of arrivals
PEAK_WINDOW_S = 60.0


@dataclass(frozen=True)
class FleetRow:
    """One fleet at one arrival rate (shares of all prompt tokens; GB/s = 10^9 bytes per second;
    times in seconds; ``kv_weight`` None for routings other than ``kv-aware``)."""

    routing: str
    kv_weight: float | None
    replicas: int
    policy: str
    host_blocks: int
    host_tokens: int
    host_gib: float
    tier_blocks: int
    tier_tokens: int
    tier_gib: float
    rate_scale: float
    requests_per_s: float
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
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    queue_mean_s: float
    queue_p99_s: float
    service_p99_s: float
    util_mean: float
    util_max: float
    decode_share_max: float
    util_per_replica: tuple[float, ...]
    decode_share_per_replica: tuple[float, ...]
    queue_mean_per_replica_s: tuple[float, ...]
    host_evictions: int
    tier_evictions: int
    seconds: float

    @property
    def loaded_share(self) -> float:
        return self.host_share + self.tier_share


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
    results: list[FleetResult], ft: FleetTrace, block_bytes: int, et: EngineTime, rate_scales: list[float]
) -> list[FleetRow]:
    """The rows of ``results``: a fleet whose routes depend on the rate (``kv-aware``) at its own
    rate scale, every other fleet at each of ``rate_scales``."""
    trace = ft.trace
    bt, pt_arr = trace.block_tokens, trace.prompt_tokens
    t, dur = ft.arrival_s, ft.duration_s
    full_prefill = float(et.prefill_s(pt_arr, np.zeros_like(pt_arr)).sum())
    rows = []
    for r in results:
        host_tok, tier_tok = r.token_split(pt_arr, bt)
        saved = full_prefill - float(et.prefill_s(pt_arr, host_tok + tier_tok).sum())
        read, written = r.tier_reads * block_bytes / 1e9, r.tier_writes * block_bytes / 1e9
        pt = r.prompt_tokens or 1
        cache = (
            r.prompt_tokens,
            r.host_hit_tokens,
            r.tier_hit_tokens,
            r.prompt_tokens - r.hit_tokens,
            r.host_hit_tokens / pt,
            r.tier_hit_tokens / pt,
            (r.prompt_tokens - r.hit_tokens) / pt,
            _balance(r.per_replica()),
            _balance(r.per_replica(pt_arr.astype(np.float64))),
            float(read.sum() / dur),
            peak_rate(t, read),
            float(written.sum() / dur),
            peak_rate(t, written),
            saved,
        )
        for scale in [r.rate_scale] if r.rate_scale else rate_scales:
            tm = time_requests(et, t, r.replica, r.replicas, pt_arr, ft.outputs, host_tok, tier_tok, dur, scale)
            rows.append(
                FleetRow(
                    r.routing,
                    r.kv_weight,
                    r.replicas,
                    r.policy,
                    r.capacity,
                    r.capacity * bt,
                    r.capacity * block_bytes / 2**30,
                    r.tier_capacity,
                    r.tier_capacity * bt,
                    r.tier_capacity * block_bytes / 2**30,
                    scale,
                    trace.num_requests * scale / dur,
                    *cache,
                    tm.ttft_p(50),
                    tm.ttft_p(90),
                    tm.ttft_p(99),
                    float(tm.ttft.mean()) if len(tm.ttft) else 0.0,
                    float(tm.queue.mean()) if len(tm.queue) else 0.0,
                    percentile(tm.queue, 99),
                    percentile(tm.service, 99),
                    float(tm.util.mean()),
                    float(tm.util.max()),
                    float(tm.decode_share.max()),
                    tuple(float(x) for x in tm.util),
                    tuple(float(x) for x in tm.decode_share),
                    tuple(float(x) for x in tm.queue_mean),
                    r.evictions,
                    r.tier_evictions,
                    r.seconds,
                )
            )
    return rows


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (tuple, list)):
        return [_json_safe(x) for x in v]
    return v


def write_rows(rows: list[FleetRow], settings: dict[str, Any], out: Path) -> list[Path]:
    """``fleet.csv`` (per-replica columns ``;``-joined) and ``fleet.json`` (infinite times as
    ``"inf"``) in ``out``; returns their paths."""
    csv_path, json_path = out / "fleet.csv", out / "fleet.json"
    fields = list(FleetRow.__dataclass_fields__)
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            d = asdict(row)
            w.writerow({k: ";".join(f"{x:.6g}" for x in v) if isinstance(v, tuple) else v for k, v in d.items()})
    data = {"fleet": settings, "rows": [{k: _json_safe(v) for k, v in asdict(r).items()} for r in rows]}
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    return [csv_path, json_path]
