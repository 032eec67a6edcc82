"""The demo: a small chat run verifies every loaded block; bad flags give one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.demo import DemoSettings, format_summary, run_chat, summary_dict


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
    assert f"verified: {stats.verified_blocks} GPU blocks loaded, all byte-identical" in text


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
    out = tmp_path / "demo.json"
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
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["settings"]["policy"] == "arc" and data["backend"] == "torch"
    assert "verified:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["demo", "--cpu-blocks", "-5"], "positive integer"),
        (["demo", "--gpu-blocks", "abc"], "positive integer"),
        (["demo", "--policy", "nope"], "nope"),
        (["demo", "--backend", "nope"], "nope"),
        (["demo", "--conversations", "0"], "positive integer"),
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
