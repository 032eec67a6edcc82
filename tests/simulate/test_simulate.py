"""``kvoffload simulate``: share of prompt tokens loaded from the CPU tier vs host memory, per policy."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.app.cli import main
from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.reference.request import hash_blocks
from kvoffload.engine.reference.workload import ChatWorkload, read_trace, write_trace
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.cli import default_capacities, simulate, working_set_blocks
from kvoffload.simulate.sweep import MODEL_SHAPES, ModelShape

_SMALL = DemoSettings(conversations=8, turns=3, gpu_blocks=48, max_concurrent=4)
_SIM = ["simulate", "--conversations", "4", "--gpu-blocks", "48"]


def test_capacity_sweep_moves_hit_rate() -> None:
    items = list(ChatWorkload(conversations=8, turns=3))
    points = simulate(items, _SMALL, ["lru", "s3fifo"], [1, 400], verbose=False)
    assert [(p.policy, p.cpu_blocks) for p in points] == [("lru", 1), ("lru", 400), ("s3fifo", 1), ("s3fifo", 400)]
    by = {(p.policy, p.cpu_blocks): p for p in points}
    prompt = sum(len(t.prompt_token_ids) for t in items)
    for policy in ("lru", "s3fifo"):
        assert by[(policy, 1)].cpu_hit_tokens == 0  # one slot never holds a whole loadable prefix
        assert by[(policy, 1)].cpu_evictions > 0
        assert by[(policy, 400)].cpu_hit_tokens > 0
        assert by[(policy, 400)].cpu_evictions == 0
        for p in (by[(policy, 1)], by[(policy, 400)]):
            assert p.prompt_tokens == prompt
            assert p.gpu_hit_tokens + p.cpu_hit_tokens + p.computed_prefill_tokens == p.served_tokens
            assert p.served_tokens >= prompt
        # without evictions every offloaded block stored once: the prompts' blocks and then some
        assert by[(policy, 400)].distinct_blocks_stored > working_set_blocks(items, 16, 2)


def test_working_set_counts_offloaded_blocks_by_key(tmp_path: Path) -> None:
    # Two prompts share their first two 16-token blocks. With 32-token offloaded blocks a block is
    # keyed by the hash of its last 16-token block: {b, d} and {b} -> 2 distinct; partial blocks
    # (the trailing e of the second prompt) are not counted. With 16-token blocks: a..e -> 5.
    a, b, c, d, e = (f"{i:02x}" * 16 for i in range(1, 6))
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"block_hashes": [a, b, c, d], "num_tokens": 64})
        + "\n"
        + json.dumps({"block_hashes": [a, b, e], "num_tokens": 50})
        + "\n"
    )
    trace = read_trace(path)
    assert working_set_blocks(trace, 16, 2) == 2
    assert working_set_blocks(trace, 16, 1) == 5
    items = list(ChatWorkload(conversations=8, turns=3))
    write_trace(tmp_path / "chat.jsonl", items)
    assert working_set_blocks(read_trace(tmp_path / "chat.jsonl"), 16, 2) == working_set_blocks(items, 16, 2) > 0
    # reference: distinct chained hashes of every second 16-token block of every prompt
    ref = {h for t in items for h in hash_blocks(t.prompt_token_ids, 16)[1::2]}
    assert working_set_blocks(items, 16, 2) == len(ref)


def test_trace_and_chat_workload_agree(tmp_path: Path) -> None:
    items = list(ChatWorkload(conversations=8, turns=3))
    path = tmp_path / "trace.jsonl"
    write_trace(path, items)
    (p,) = simulate(read_trace(path), _SMALL, ["lru"], [400], verbose=False)
    assert p.prompt_tokens == sum(len(t.prompt_token_ids) for t in items)


def test_default_capacities_span_the_working_set() -> None:
    caps = default_capacities(800)
    assert caps == sorted(caps) and caps[0] == 50 and 800 in caps and caps[-1] == 1600


def test_model_shape_bytes() -> None:
    # 8B-class: 32 layers x (K, V) x 8 KV heads x 128 x 2 bytes = 128 KiB per token
    assert MODEL_SHAPES["8b"].bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert ModelShape(16, 8, 128, "fp8").bytes_per_token == 32 * 1024


def test_cli_writes_plot_csv_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    rc = main([*_SIM, "--policies", "lru,arc", "--capacities", "8,1GiB", "--out", str(out)])
    assert rc == 0
    png = (out / "hit_rate.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out / "hit_rate.png").stat().st_mode & 0o777 == 0o644
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    # 8B-class, 32-token blocks: 4 MiB per offloaded block, so 1 GiB = 256 blocks
    assert [(r["policy"], int(r["cpu_blocks"])) for r in rows] == [("lru", 8), ("lru", 256), ("arc", 8), ("arc", 256)]
    assert [float(r["cpu_gib"]) for r in rows] == [8 / 256, 1.0, 8 / 256, 1.0]
    data = json.loads((out / "results.json").read_text())
    sweep = data["sweep"]
    assert sweep["policies"] == ["lru", "arc"] and sweep["capacities_blocks"] == [8, 256]
    assert sweep["offloaded_block_bytes"] == 4 * 2**20 and sweep["model_shape"]["layers"] == 32
    assert sweep["gpu_blocks"] == 48 and "cpu_blocks" not in sweep and "policy" not in sweep
    assert len(data["points"]) == 4 and data["working_set"]["prompt_blocks"] > 0
    text = capsys.readouterr().out
    assert "128 KiB of KV per token" in text and "offloaded block: 32 tokens = 4 MiB" in text


def test_cli_model_flags_change_bytes(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    argv = [*_SIM, "--policies", "lru", "--layers", "16", "--dtype", "fp8", "--block-size", "64"]
    assert main([*argv, "--capacities", "1GiB", "--out", str(out)]) == 0
    sweep = json.loads((out / "results.json").read_text())["sweep"]
    # 16 layers x 2 x 8 x 128 x 1 byte = 32 KiB per token; 64 tokens = 2 MiB per block
    assert sweep["offloaded_block_bytes"] == 2 * 2**20 and sweep["capacities_blocks"] == [512]


def test_diagnosis_says_what_is_true(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_SIM, "--policies", "lru", "--capacities", "1", "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "no capacity tried kept a block until a request asked for it again" in text
    assert "served all reuse" not in text
    big_gpu = ["simulate", "--conversations", "4", "--gpu-blocks", "2000", "--policies", "lru"]
    assert main([*big_gpu, "--capacities", "512", "--out", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "nothing was evicted and nothing loaded: the GPU prefix cache (2,000 GPU blocks) served all reuse" in text


def test_custom_policy_row_and_alignment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    custom = "kvoffload.cache.policies.lru:LRUPolicy"
    rc = main([*_SIM, "--policies", f"lru,{custom}", "--capacities", "1,16,400", "--out", str(tmp_path)])
    assert rc == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("host memory"))
    table = lines[start : start + 4]
    assert len({len(line) for line in table}) == 1, table  # columns line up under a long policy name
    assert table[0].endswith(custom)
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"{custom}:")]
    assert "best" in line and "95% of that from" in line and "no capacity tried" not in line


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"request_id": "x", "token_ids": [1]}', "request_id 'x' is already used on line 1"),
        ('{"token_ids": []}', "token_ids is empty"),
        ('{"block_hashes": ["aa", "bb"], "num_tokens": 48}', "block_hashes has 2 entries, num_tokens 48 needs 3"),
        ('{"token_ids": [1], "block_hashes": ["aa"], "num_tokens": 16}', "token_ids or block_hashes, not both"),
        ('{"token_ids": [1], "max_token": 3}', "unknown field 'max_token'"),
        ('{"block_hashes": ["aa"]}', "block_hashes needs num_tokens"),
    ],
)
def test_trace_errors_name_file_line_and_field(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": "x", "token_ids": [1, 2]}\n# a comment\n' + line + "\n")
    with pytest.raises(InvalidArgumentError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}:3: ") and needle in str(err.value)


def test_trace_errors_come_before_the_run(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"token_ids": [1, 2, 3]}\n{"token_ids": [4], "max_tokens": 100000}\n')
    argv = [sys.executable, "-m", "kvoffload", "simulate", "--trace", str(path), "--out", str(tmp_path / "o")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    (err,) = proc.stderr.strip().splitlines()
    assert err.startswith(f"kvoffload: error: {path}:2: request_id 'r2' needs 100,001 tokens"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--capacities", "1MiB"], "holds no offloaded block of 4,194,304 bytes"),
        (["--capacities", "2XB"], "positive integer (offloaded blocks), a size such as 2GiB or 512MiB, or tokens"),
        (["--capacities", "20tok"], "--capacities 20tok holds no offloaded block of 32 tokens"),
        (["--trace-block-size", "512"], "--trace-format and --trace-block-size need --trace"),
        (["--replay", "fast"], "invalid choice"),
        (["--block-size", "24"], "--block-size must be a multiple of the 16-token GPU block"),
        (["--dtype", "int4"], "invalid choice"),
    ],
)
def test_bad_sizes_one_line(argv: list[str], needle: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kvoffload", "simulate", *argv, "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (err,) = proc.stderr.strip().splitlines()
    assert err.startswith("kvoffload: error:") and needle in err, err
