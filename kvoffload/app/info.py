"""Environment report behind ``python -m kvoffload info``."""

from __future__ import annotations

import importlib
import platform
import sys
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
    return info


def format_info(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`collect_info`'s result."""
    lines = [f"{k:<14} {v}" for k, v in info.items() if k != "device"]
    dev = info["device"]
    if isinstance(dev, dict):
        lines.insert(
            5, f"{'device':<14} {dev['name']} (sm_{dev['compute_capability'].replace('.', '')}, {dev['sm_count']} SMs)"
        )
    else:
        lines.insert(5, f"{'device':<14} {dev}")
    lines.append(f"{'platform':<14} {platform.platform()} / {sys.implementation.name}")
    return "\n".join(lines)
