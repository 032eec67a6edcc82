"""``kvoffload simulate`` on Mooncake traces: the cache-level sweep end to end, and the engine replay."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.app.cli import main
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.mooncake import read_mooncake_trace
from kvoffload.simulate.optimal import BeladyPlan, replay_belady, replay_infinite
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


def test_cache_sweep_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(150, 5, block_tokens=64))
    out = tmp_path / "o"
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "2"]
    rc = main([*argv, "--policies", "lru,arc", "--capacities", "4,16,2000tok", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "Mooncake trace" in text and "cache-level replay (no GPU tier)" in text
    assert sum(line.strip().startswith("[") and "/9]" in line for line in text.splitlines()) == 9  # progress
    assert "each policy's share of Belady's optimum" in text and "infinite cache:" in text
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    caps = [4, 16, 62]  # 2000 tokens = 62 blocks of 32 tokens
    assert [(r["policy"], int(r["cpu_blocks"])) for r in rows[:-1]] == [
        *[("lru", c) for c in caps],
        *[("arc", c) for c in caps],
        *[("belady", c) for c in caps],
    ]
    reqs = read_mooncake_trace(trace, 64)
    bt = BlockTrace.from_mooncake(reqs, 64, 32)
    plan = BeladyPlan(bt)
    inf = replay_infinite(bt)
    assert rows[-1]["policy"] == "infinite" and int(rows[-1]["cpu_hit_tokens"]) == inf.hit_tokens
    for row in rows[:-1]:
        cap = int(row["cpu_blocks"])
        want = replay_belady(plan, cap) if row["policy"] == "belady" else replay_cache(bt, row["policy"], cap)
        assert int(row["cpu_hit_tokens"]) == want.hit_tokens
        assert int(row["cpu_evictions"]) == want.evictions
        assert int(row["prompt_tokens"]) == sum(r.input_length for r in reqs)
        best = replay_belady(plan, cap).hit_tokens
        assert float(row["share_of_belady"]) == pytest.approx(want.hit_tokens / best)
    data = json.loads((out / "results.json").read_text())
    assert data["sweep"]["replay"] == "cache" and data["sweep_seconds"] > 0
    assert len(data["points"]) == 6 and len(data["belady"]) == 3 and data["infinite"]["policy"] == "infinite"
    assert (out / "hit_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_small_mooncake_trace_runs_through_the_engine_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = random_mooncake(12, 9, block_tokens=64, max_blocks=5, max_output=8)
    trace = write_mooncake(tmp_path / "m.jsonl", lines)
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--policies", "lru"]
    assert main([*argv, "--capacities", "8,64", "--gpu-blocks", "64", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "GPU KV cache: 64 GPU blocks" in text and "belady" not in text
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert data["sweep"]["replay"] == "engine" and "belady" not in data
    assert data["points"][0]["prompt_tokens"] == sum(int(x["input_length"]) for x in lines)  # type: ignore[call-overload]


def test_tier_capacities_split_the_hits_between_host_memory_and_the_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(150, 8, block_tokens=64))
    out = tmp_path / "o"
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--jobs", "2", "--policies", "lru,s3fifo"]
    rc = main(
        [*argv, "--capacities", "6,20", "--tier-capacity", "0,30", "--tier-capacity", "1280tok", "--out", str(out)]
    )
    assert rc == 0  # auto picked the cache-level replay: tiers need it
    text = capsys.readouterr().out
    assert "prompt tokens loaded with a shared tier beneath host memory" in text
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    pol = [r for r in rows if r["policy"] in ("lru", "s3fifo")]
    tiers = [0, 30, 40]  # 1280 tokens = 40 blocks of 32 tokens; 0 is always there
    assert [(r["policy"], int(r["tier_blocks"]), int(r["cpu_blocks"])) for r in pol] == [
        (p, t, c) for p in ("lru", "s3fifo") for t in tiers for c in (6, 20)
    ]
    bt = BlockTrace.from_mooncake(read_mooncake_trace(trace, 64), 64, 32)
    for r in pol:
        t, cap = int(r["tier_blocks"]), int(r["cpu_blocks"])
        want = replay_cache(bt, r["policy"], cap, tier_capacity=t)
        assert int(r["tier_hit_tokens"]) == want.tier_hit_tokens
        assert int(r["cpu_hit_tokens"]) == want.host_hit_tokens
        assert float(r["hit_rate"]) == pytest.approx(want.hit_tokens / want.prompt_tokens)
        assert int(r["computed_prefill_tokens"]) == want.prompt_tokens - want.hit_tokens
        assert (r["share_of_belady"] == "") == (t > 0)
    assert any(int(r["tier_hit_tokens"]) > 0 for r in pol)
    data = json.loads((out / "results.json").read_text())
    assert data["sweep"]["tier_capacities_blocks"] == tiers and len(data["points"]) == 12
    assert (out / "hit_rate.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--replay", "engine", "--tier-capacity", "64"], "--tier-capacity needs the cache-level replay"),
        (["--tier-capacity", "10tok"], "--tier-capacity 10tok holds no offloaded block"),
        (["--tier-capacity", "-3"], "expected 0, a positive integer"),
    ],
)
def test_bad_tier_capacity_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert_refused(tmp_path, capsys, ["--policies", "lru", "--capacities", "8", *extra], needle)


def assert_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    """``simulate`` on a small trace with ``args`` exits 2, says ``needle`` and writes nothing."""
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(10, 1, block_tokens=64))
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", *args]
    try:
        rc = main([*argv, "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # argparse rejects a malformed value itself
        rc = int(exc.code or 0)
    assert rc == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_no_plot_run_imports_neither_torch_nor_matplotlib(tmp_path: Path) -> None:
    """The cache-level sweep with ``--no-plot``: the same CSV as with the plot, no PNG, and neither
    torch nor matplotlib imported (a fresh interpreter, so that no other test's imports count)."""
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(80, 4, block_tokens=64))
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1"]
    argv += ["--policies", "lru", "--capacities", "4,16"]
    probe = (
        "import sys; from kvoffload.app.cli import main; rc = main(sys.argv[1:]); "
        "print('IMPORTED', sorted(m for m in ('torch', 'matplotlib') if m in sys.modules)); sys.exit(rc)"
    )
    runs = {}
    for name, extra in (("plain", []), ("no_plot", ["--no-plot"])):
        out = tmp_path / name
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv, "--out", str(out), *extra], capture_output=True, text=True, check=True
        )
        runs[name] = (out, done.stdout)
    plain, no_plot = runs["plain"], runs["no_plot"]
    assert "IMPORTED ['matplotlib']" in plain[1] and (plain[0] / "hit_rate.png").exists()
    assert "IMPORTED []" in no_plot[1] and not (no_plot[0] / "hit_rate.png").exists()
    assert "hit_rate.png" not in no_plot[1]

    def rows(out: Path) -> list[dict[str, str]]:
        with (out / "results.csv").open() as f:
            return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]

    assert rows(plain[0]) == rows(no_plot[0]) and len(rows(plain[0])) == 5
