"""Lazy access to Triton: the module itself, the raw kernels, and whether the interpreter works here.

Importing this module imports neither triton nor CUDA; the functions do, on first use, and cache
the result for the process.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

__all__ = ["triton_module", "kernels", "interpreter_problem", "INTERPRETER_LOCK"]

#: Held around every interpreted launch: Triton's interpreter is not thread-safe.
INTERPRETER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def triton_module() -> Any:
    """The ``triton`` package (imported on first call)."""
    import triton  # noqa: PLC0415 - imported lazily: slow, and optional on some platforms

    return triton


@functools.lru_cache(maxsize=1)
def kernels() -> tuple[Any, Any]:
    """(compiled JITFunction, interpreted twin) of :func:`~kvoffload.kernels.triton_kernels.copy_pages_kernel`."""
    from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

    from kvoffload.kernels.triton_kernels import copy_pages_kernel  # noqa: PLC0415

    return copy_pages_kernel, InterpretedFunction(copy_pages_kernel.fn)


@functools.lru_cache(maxsize=1)
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernels here, or None if it can.

    Runs a tiny kernel with a run-time loop bound through the interpreter once per process:
    Triton <= 3.6's interpreter converts such bounds with ``int()`` on a 1-element array, which
    NumPy >= 2.4 refuses, so the CPU path needs a newer Triton or an older NumPy.
    """
    try:
        from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

        from kvoffload.kernels.triton_kernels import interpreter_probe_kernel  # noqa: PLC0415

        out = torch.zeros(1, dtype=torch.int64)
        InterpretedFunction(interpreter_probe_kernel.fn)[(1,)](out, 3)
        if int(out.item()) != 3:
            return f"the interpreter computed {int(out.item())} instead of 3"
    except Exception as exc:  # noqa: BLE001 - any failure means the interpreter cannot be used
        import numpy  # noqa: PLC0415

        try:
            version = str(triton_module().__version__)
        except Exception:  # noqa: BLE001 - triton itself cannot be imported
            version = "(not importable)"
        return (
            f"triton {version} interpreter fails with numpy {numpy.__version__} "
            f"({type(exc).__name__}: {str(exc)[:120]}); use triton >= 3.7 or numpy < 2.4"
        )
    return None
