"""`make gpu-check` on a machine without a GPU: a clear "no GPU" line, the CPU-runnable steps, exit 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU branch")
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_without_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVOFFLOAD_", "MAKE"))}
    proc = subprocess.run(
        ["make", "-s", "gpu-check", f"PYTHON={sys.executable}", f"OUT={out}", "GPU_CHECK_BUDGET=120"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "[gpu-check] no GPU" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("gpu-check summary: no GPU; steps 2/2 ok"), last
    files = sorted(p.name for p in out.iterdir())
    assert files == ["env.txt", "smoke.log", "summary.txt"] and len(files) <= 8
    assert "torch " in (out / "env.txt").read_text()
    smoke = (out / "smoke.log").read_text()
    assert smoke.count("PASS") == 3 and "FAIL" not in smoke
