"""``kvoffload simulate --replicas``: the fleet report end to end, its figures against the replay."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from kvoffload.app.cli import main
from kvoffload.simulate.engine_time import EngineTime
from kvoffload.simulate.fleet import FleetTrace, replay_fleet
from kvoffload.simulate.fleet_report import peak_rate
from kvoffload.simulate.fleet_sweep import FleetSpec, sweep_fleet
from kvoffload.simulate.gpu_profile import GPU_PROFILES, MODEL_COMPUTE
from kvoffload.simulate.mooncake import read_mooncake_trace
from tests.simulate.mooncake_traces import random_mooncake, system_prompt_headed, write_mooncake
from tests.simulate.test_simulate_trace import assert_refused


def _trace(tmp_path: Path, n: int = 120, seed: int = 4) -> Path:
    lines = random_mooncake(n, seed, block_tokens=64)
    for i, line in enumerate(lines):
        line["timestamp"] = i * 2000  # a request every 2 s
    return write_mooncake(tmp_path / "m.jsonl", lines)


def test_fleet_sweep_writes_the_table_csv_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path)
    out = tmp_path / "o"
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--block-size", "64", "--jobs", "2"]
    rc = main(
        [*argv, "--replicas", "1,3", "--routing", "round-robin,prefix", "--capacities", "4,12", "--tier-capacity",
         "40", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "load model:" in text and "24,633 prefill tokens/s + attention" in text
    with (out / "fleet.csv").open() as f:
        rows = list(csv.DictReader(f))
    # routings x replicas x (host capacities x tier capacities + no offloading)
    assert len(rows) == 2 * 2 * (2 * 2 + 1)
    data = json.loads((out / "fleet.json").read_text())
    assert data["fleet"]["tier_capacities_blocks"] == [0, 40] and len(data["rows"]) == 20
    for name in ("fleet.png", "fleet_hit_rate.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # the figures are the replay's: one row recomputed
    ft = FleetTrace.from_mooncake(read_mooncake_trace(trace, 64), 64, 64)
    got = replay_fleet(ft, "prefix", 3, "lru", 12, 40)
    row = next(r for r in data["rows"] if (r["routing"], r["replicas"], r["host_blocks"], r["tier_blocks"]) == (
        "prefix", 3, 12, 40))  # fmt: skip
    assert row["host_hit_tokens"] == got.host_hit_tokens and row["tier_hit_tokens"] == got.tier_hit_tokens
    assert row["computed_tokens"] == got.prompt_tokens - got.hit_tokens
    et = EngineTime.build(GPU_PROFILES["h100"], MODEL_COMPUTE["8b"], 128 * 1024)
    pt = ft.trace.prompt_tokens
    host, tier = got.token_split(pt, 64)
    saved = et.prefill_s(pt, 0 * pt).sum() - et.prefill_s(pt, host + tier).sum()
    assert row["prefill_gpu_s_saved"] == pytest.approx(saved)
    assert host.sum() == got.host_hit_tokens and tier.sum() == got.tier_hit_tokens
    block_bytes = 64 * 128 * 1024
    assert row["tier_read_gbps"] == pytest.approx(got.tier_reads.sum() * block_bytes / 1e9 / ft.duration_s)
    per = np.bincount(got.replica, minlength=3)
    assert row["requests_max_over_mean"] == pytest.approx(per.max() / per.mean())


def test_one_replica_rows_equal_the_single_node_sweep(tmp_path: Path) -> None:
    trace = _trace(tmp_path, 150, 8)
    out = tmp_path / "one"
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--block-size", "64", "--jobs", "1"]
    assert main([*argv, "--policies", "lru", "--capacities", "5", "--tier-capacity", "30", "--out", str(out)]) == 0
    node = {int(p["tier_blocks"]): p for p in json.loads((out / "results.json").read_text())["points"]}
    fleet = tmp_path / "fleet"
    rc = main([*argv, "--replicas", "1", "--capacities", "5", "--tier-capacity", "30", "--out", str(fleet)])
    assert rc == 0
    rows = [r for r in json.loads((fleet / "fleet.json").read_text())["rows"] if r["host_blocks"]]
    assert {r["routing"] for r in rows} == {"random", "least-loaded", "session", "kv-aware"}
    for r in rows:
        p = node[r["tier_blocks"]]
        assert (r["host_hit_tokens"], r["tier_hit_tokens"]) == (p["cpu_hit_tokens"], p["tier_hit_tokens"])


def test_sweep_on_two_processes_equals_one(tmp_path: Path) -> None:
    ft = FleetTrace.from_mooncake(read_mooncake_trace(_trace(tmp_path, 100, 2), 64), 64, 32)
    spec = FleetSpec(["random", "session", "prefix"], [2, 3], ["lru"], [3, 9], [0, 25], seed=5)
    one = sweep_fleet(ft, spec, 1)
    two = sweep_fleet(ft, spec, 2)
    assert [(r.routing, r.replicas, r.capacity, r.tier_capacity) for r in one] == [
        (r.routing, r.replicas, r.capacity, r.tier_capacity) for r in two
    ]
    for a, b in zip(one, two, strict=True):
        assert a.hits.tolist() == b.hits.tolist() and a.replica.tolist() == b.replica.tolist()
        assert a.tier_reads.tolist() == b.tier_reads.tolist() and a.tier_writes.tolist() == b.tier_writes.tolist()
    assert len(one) == 3 * 2 * 2 * 2


def test_peak_rate_is_the_busiest_window() -> None:
    t = np.array([0.0, 10.0, 30.0, 59.0, 61.0, 200.0])
    amounts = np.array([1.0, 2.0, 3.0, 4.0, 100.0, 7.0])
    # windows [t, t + 60): from 10 s: 2 + 3 + 4 + 100 = 109
    assert peak_rate(t, amounts) == pytest.approx(109 / 60)
    assert peak_rate(np.zeros(0), np.zeros(0)) == 0.0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--replicas", "2", "--routing", "sticky"], "--routing: unknown routing 'sticky'"),
        (["--replicas", "0"], "expected a positive integer"),
        (["--replicas", "2", "--capacities", ""], "--replicas needs --capacities"),
        (["--replicas", "2", "--replay", "engine"], "--replicas needs the cache-level replay"),
        (["--replicas", "2", "--prefill-tokens-per-s", "-1"], "expected a positive number"),
        (["--replicas", "2", "--prefill-tokens-per-s", "1e300"], "--prefill-tokens-per-s must be a positive number"),
        (["--replicas", "2", "--trace-block-view", "0.5"], "--trace-block-view is a single-node figure"),
        (["--replicas", "100000"], "--replicas must be at most 4,096"),
        (
            ["--replicas", "2", "--capacities", "1e30Mtok"],
            "--capacities 1e+30Mtok is more than 2,147,483,647 offloaded blocks",
        ),
        (
            ["--replicas", "2", "--tier-capacity", "1e30Mtok"],
            "--tier-capacity 1e+30Mtok is more than 2,147,483,647 offloaded blocks",
        ),
        (["--replicas", "2", "--rate-scale", "0"], "--rate-scale must be comma-separated positive numbers"),
        (["--replicas", "2", "--rate-scale", "1,x"], "--rate-scale must be"),
        (["--replicas", "2", "--rate-scale", "1e300"], "--rate-scale must be"),
        (["--replicas", "2", "--rate-scale", "nan"], "--rate-scale must be"),
        (["--replicas", "2", "--kv-weight", "-1"], "--kv-weight must be comma-separated numbers in"),
        (["--replicas", "2", "--kv-weight", "1e300"], "--kv-weight must be"),
        (["--replicas", "2", "--ttft-target", "0s"], "--ttft-target must be a positive duration"),
        (["--replicas", "2", "--ttft-target", "soon"], "--ttft-target must be a duration"),
        (["--replicas", "2", "--ttft-target", "1e300"], "--ttft-target must be a positive duration"),
        (["--replicas", "2", "--gpu", "a100"], "--gpu: unknown GPU 'a100'"),
        (["--replicas", "2", "--gpu", "missing.json"], "--gpu missing.json: cannot be read"),
        (["--replicas", "2", "--link-gbps", "0"], "--link-gbps must be"),
        (["--replicas", "2", "--link-gbps", "1e300"], "--link-gbps must be"),
        (["--replicas", "2", "--link-gbps", "1,2"], "--link-gbps and --tier-gbps take one number each"),
        (["--replicas", "2", "--tier-gbps", "-3"], "--tier-gbps must be"),
        (["--replicas", "2", "--chunk-tokens", "0"], "expected a positive integer"),
        (["--replicas", "2", "--chunk-tokens", str(2**40)], "--chunk-tokens must be a positive integer up to"),
        (["--replicas", "2", "--routing", "kv-aware,sticky"], "--routing: unknown routing 'sticky'"),
        (["--replicas", "2", "--routing", ""], "--routing must name at least one of"),
        (["--replicas", "2", "--routing", ","], "--routing must name at least one of"),
        (["--replicas", "2", "--routing", "session,session"], "--routing names 'session' twice"),
        (["--replicas", "2,2"], "--replicas names a count twice"),
        (["--replicas", "2", "--capacities", "8,8"], "--capacities 8 given twice"),
        (["--replicas", "2", "--rate-scale", "1,1.0"], "--rate-scale names 1 twice"),
        (["--replicas", "2", "--kv-weight", "0.5,0.5"], "--kv-weight names 0.5 twice"),
    ],
)
def test_bad_fleet_flags_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert_refused(tmp_path, capsys, ["--capacities", "8", *extra], needle)


def test_the_report_names_a_routing_that_piles_load_onto_one_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one system-prompt block heads every prompt: longest-prefix routing sends everything where the
    # first request went, and the report says so under its table; round-robin stays even
    trace = write_mooncake(tmp_path / "sys.jsonl", system_prompt_headed(60, 12, max_blocks=6, gap_ms=2000))
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--block-size", "64", "--jobs", "1"]
    rc = main([*argv, "--replicas", "1,3", "--routing", "round-robin,prefix", "--capacities", "40", "--no-plot",
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    named = [ln for ln in text.splitlines() if ln.startswith("unbalanced:")]
    assert named == [
        "unbalanced: prefix with 3 replicas sends its busiest replica 3.00x the mean prompt tokens "
        "(3.00x the mean requests: every request on one replica)"
    ]
