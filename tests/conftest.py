"""Shared test configuration: markers ``gpu``, ``interpreter`` and ``slow``.

``gpu`` tests are skipped without CUDA; everything else runs on a CPU-only machine (the
Triton kernels through Triton's interpreter). Where that interpreter cannot run the kernel
(no triton, or Triton <= 3.6 beside NumPy >= 2.4), the CPU tests of the Triton backend -- those
marked ``interpreter`` or with ``triton`` in their id -- are skipped with the reason.
"""

from __future__ import annotations

import pytest
import torch


def _interpreter_problem() -> str | None:
    try:
        from kvoffload.kernels.triton_backend import interpreter_problem
    except Exception as exc:  # noqa: BLE001 - no usable triton at all
        return f"triton unavailable: {exc}"
    return interpreter_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cpu_triton = [
        it for it in items if "gpu" not in it.keywords and ("interpreter" in it.keywords or "triton" in it.nodeid)
    ]
    problem = _interpreter_problem() if cpu_triton else None
    if problem is not None:
        skip_interp = pytest.mark.skip(reason=f"Triton interpreter unusable here: {problem}")
        for item in cpu_triton:
            item.add_marker(skip_interp)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
