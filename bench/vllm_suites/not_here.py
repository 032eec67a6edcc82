"""pytest plugin (both runs): skip vLLM's tests that cannot run on a CPU-only machine but do not say so.

Most of vLLM's CUDA-only offloading tests skip themselves without a GPU. The ones in
:data:`NOT_HERE` do not, and fail with vLLM's classes and kvoffload's alike for want of a GPU (or
of model weights, which need one to run): vLLM's own CPU offloading worker run on
``current_platform.device_type`` tensors (``"cpu"`` here) asserts ``gpu_tensor.is_cuda or
gpu_tensor.is_xpu`` (``vllm/v1/kv_offload/cpu/gpu_worker.py``), and the end-to-end tiering tests
start an ``LLM`` on ``meta-llama/Llama-3.2-1B-Instruct``; on vLLM 0.33 (its Python code over
0.32's compiled ops here) an engine cannot start at all. Without CUDA this plugin marks them
skipped (reason ``not on this machine: ...``) in both runs, so that they are counted with the other
skipped tests; with CUDA it does nothing. Node ids are relative to the sdist's root, parameters
left out (every parametrization is skipped).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

logger = logging.getLogger(__name__)

__all__ = ["NOT_HERE"]

_WORKER = "needs CUDA: vLLM's CPUOffloadingWorker asserts CUDA/XPU tensors"
_LLM = "needs CUDA and model weights: an LLM engine on meta-llama/Llama-3.2-1B-Instruct"

_ENGINE_033 = (
    "needs vLLM 0.33's compiled ops: an LLM engine (here 0.33 is its Python code over 0.32's compiled CPU ops; "
    "the CPU worker calls torch.ops._C.init_cpu_memory_env)"
)

_CONNECTOR = "tests/v1/kv_connector/unit/test_offloading_connector.py::"

#: test (node id without parameters) -> why it cannot run here
NOT_HERE: dict[str, str] = {
    "tests/v1/kv_offload/cpu/test_gpu_worker.py::test_transfer": _WORKER,
    "tests/v1/kv_offload/cpu/test_gpu_worker.py::test_transfer_multi_group": _WORKER,
    _CONNECTOR + "test_tiering_offloading": _LLM,
    _CONNECTOR + "test_fs_tiering_offloading": _LLM,
    _CONNECTOR + "test_tiering_cache_reset_resumes_promotions_on_idle_engine": _ENGINE_033,
}


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if _has_cuda():
        return
    for item in items:
        reason = NOT_HERE.get(item.nodeid.split("[", 1)[0])
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not on this machine: {reason}"))
