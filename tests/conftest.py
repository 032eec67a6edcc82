"""Shared test configuration: markers ``gpu``, ``interpreter`` and ``slow``.

``gpu`` tests are skipped without CUDA; everything else runs on a CPU-only machine (the
Triton kernels through Triton's interpreter).
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
