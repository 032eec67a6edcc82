"""``python -m kvoffload info``."""

from __future__ import annotations

import subprocess
import sys

from kvoffload.app.info import collect_info, format_info


def test_info_fields() -> None:
    info = collect_info()
    for field in (
        "kvoffload",
        "python",
        "torch",
        "triton",
        "numpy",
        "device",
        "backends",
        "kernel_mode",
        "pinned_memory",
    ):
        assert field in info
    text = format_info(info)
    assert "torch" in text and "device" in text


def test_info_command_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "kvoffload", "info"], capture_output=True, text=True, check=True)
    assert "kvoffload" in out.stdout and "device" in out.stdout
