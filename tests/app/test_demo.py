"""The demo: a small chat run verifies every loaded block; bad flags give one error line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.app.cli import main
from kvoffload.app.demo import run_chat
from kvoffload.app.demo_report import format_header, format_summary, summary_dict
from kvoffload.engine.reference.demo_settings import DemoSettings
from kvoffload.engine.reference.workload import ChatWorkload


def test_small_chat_run_loads_from_cpu_and_verifies() -> None:
    settings = DemoSettings(
        conversations=8, turns=3, num_layers=2, num_heads=2, head_dim=16, gpu_blocks=48, cpu_blocks=96, max_concurrent=4
    )
    stats, engine = run_chat(settings, progress=False)
    assert stats.requests_finished == 24
    assert stats.loaded_tokens > 0 and stats.blocks_loaded > 0
    assert stats.verified_blocks > 0 and stats.verification_failures == 0
    assert stats.bytes_loaded > 0 and stats.bytes_stored > 0
    text = format_summary(summary_dict(settings, stats, engine))
    assert f"verified: all {stats.verified_blocks:,} GPU blocks (16 tokens) written by loads hold exactly" in text


def _row(text: str, label: str) -> int:
    """The number at the start of the value of the row ``label``."""
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(label)]
    return int(re.match(r"\s*([\d,]+)", line.strip()[len(label) :]).group(1).replace(",", ""))


def test_summary_rows_add_up() -> None:
    settings = DemoSettings(
        conversations=8, turns=3, num_layers=1, num_heads=1, head_dim=16, gpu_blocks=48, cpu_blocks=96, max_concurrent=4
    )
    workload = list(ChatWorkload(conversations=8, turns=3, system_prompts=settings.system_prompts))
    stats, engine = run_chat(settings, progress=False)
    text = format_summary(summary_dict(settings, stats, engine))
    prompt = _row(text, "prompt tokens")
    assert prompt == sum(len(t.prompt_token_ids) for t in workload)
    assert stats.preemptions > 0  # this small GPU cache preempts: re-admitted tokens get their own row
    readmitted = _row(text, "+ generated tokens re-admitted")
    labels = ("from the GPU prefix cache", "loaded from the CPU tier", "computed (prefill)")
    parts = [_row(text, label) for label in labels]
    assert all(p > 0 for p in parts) and sum(parts) == prompt + readmitted
    assert _row(text, "decode tokens computed") + readmitted == sum(t.max_tokens - 1 for t in workload)
    for label, value in zip(labels, parts, strict=True):
        line = text.split(label)[1].splitlines()[0]
        assert f"{value / (prompt + readmitted):6.1%} of admitted tokens" in line


def test_header_states_block_sizes_and_pool() -> None:
    text = format_header(DemoSettings())
    # 8 layers x K,V x 8 heads x 64 x 2 bytes = 16 KiB per token; 16-token GPU blocks; 32-token CPU slots
    assert "= 16 KiB" in text
    assert "512 GPU blocks of 16 tokens (256 KiB each) = 0.12 GiB" in text
    assert "1,536 offloaded blocks of 32 tokens (2 GPU blocks, 512 KiB each) = host pool of 0.75 GiB" in text


def test_smaller_gpu_means_more_cpu_hits() -> None:
    base = {
        "conversations": 8,
        "turns": 3,
        "num_layers": 1,
        "num_heads": 1,
        "head_dim": 16,
        "cpu_blocks": 256,
        "max_concurrent": 4,
    }
    big, _ = run_chat(DemoSettings(gpu_blocks=400, **base), progress=False)
    small, _ = run_chat(DemoSettings(gpu_blocks=48, **base), progress=False)
    assert small.loaded_tokens > big.loaded_tokens


def test_demo_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "folder" / "demo.json"  # folders are created
    rc = main(
        [
            "demo",
            "--conversations",
            "4",
            "--gpu-blocks",
            "400",
            "--cpu-blocks",
            "64",
            "--no-progress",
            "--policy",
            "arc",
            "--backend",
            "torch",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["settings"]["policy"] == "arc" and data["backend"] == "torch" and data["torch_threads"] == 1
    assert data["geometry"]["offloaded_block_bytes"] == 2 * data["geometry"]["gpu_block_bytes"]
    out_text = capsys.readouterr().out
    assert "verified:" in out_text
    assert data["stats"]["preemptions"] == 0 and "of prompt tokens" in out_text and "re-admitted" not in out_text


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["demo", "--cpu-blocks", "-5"], "positive integer"),
        (["demo", "--gpu-blocks", "abc"], "positive integer"),
        (["demo", "--policy", "nope"], "nope"),
        (["demo", "--backend", "nope"], "nope"),
        (["demo", "--conversations", "0"], "positive integer"),
        (["demo", "--threads", "0"], "positive integer"),
        (["demo", "--json", "/proc/version/x.json"], "--json /proc/version/x.json"),
        (["demo", "--json", "/"], "is a directory"),
        (["demo", "--tier", "http://127.0.0.1:6379"], "unknown scheme 'http'; expected one of disk:, redis:"),
        (["demo", "--tier", "redis://127.0.0.1:notaport"], "notaport"),
        (["demo", "--tier", "disk:/tmp/kv?bogus=1"], "unknown disk tier option 'bogus'"),
        (["demo", "--tier", "redis://u:secret@127.0.0.1:6379?cluster=maybe"], "cluster"),
        (["simulate", "--trace", "/nonexistent/trace.jsonl"], "cannot be read"),
        (["simulate", "--capacities", "10,-3"], "positive integer"),
        (["simulate", "--policies", "lru,nope"], "nope"),
        (["bench", "--only", "nothing"], "nothing"),
    ],
)
def test_bad_flags_one_line_no_traceback(argv: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "kvoffload", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error:") and needle in lines[0], proc.stderr
    assert "requests finished" not in proc.stdout  # rejected before the run
    assert "secret" not in proc.stderr  # a tier URL's password is never printed


def test_a_tier_that_cannot_work_stops_the_demo_at_start() -> None:
    """A configuration error found by the tier's check at start (here a host name that does not
    resolve): exit 2, one error line naming the tier without its password, no traceback."""
    argv = ["demo", "--tier", "redis://u:secret@no-such-host.invalid:6379/0"]
    proc = subprocess.run([sys.executable, "-m", "kvoffload", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "secret" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("kvoffload: error:")]
    assert len(errors) == 1 and "no-such-host.invalid" in errors[0] and "does not resolve" in errors[0]
    assert "requests finished" not in proc.stdout
