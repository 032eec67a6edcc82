"""``"triton"`` backend: validate, build the launch, run :func:`copy_records_kernel` once per job.

On CUDA the kernel is compiled and enqueued on the current stream of the cache's device; the
pinned host buffer is read/written by the GPU directly. The per-job arrays (block ids, group ids,
host offsets: three int64 per block) go through PyTorch's pinned caching allocator and a
non-blocking copy, so nothing waits on the device. On CPU tensors the *same* raw kernel runs
through :class:`triton.runtime.interpreter.InterpretedFunction` (no global ``TRITON_INTERPRET``
needed), which is how CI tests it.

Word size: the widest of 16/8/4/2/1 bytes that divides every view address, block stride, page
size, the host buffer address and every host offset of the job.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.kernels.config import LaunchConfig, launch_config
from kvoffload.kernels.job import TransferJob
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import KernelBackend

logger = logging.getLogger(__name__)

__all__ = ["TritonBackend", "job_alignment", "interpreter_problem"]

_interp_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _triton() -> Any:
    import triton  # noqa: PLC0415 - imported lazily: slow, and optional on some platforms

    return triton


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    """(compiled JITFunction, interpreted twin) of the raw kernel."""
    from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

    from kvoffload.kernels.triton_kernels import copy_records_kernel  # noqa: PLC0415

    return copy_records_kernel, InterpretedFunction(copy_records_kernel.fn)


@functools.lru_cache(maxsize=1)
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernel here, or None if it can.

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

        return (
            f"triton {_triton().__version__} interpreter fails with numpy {numpy.__version__} "
            f"({type(exc).__name__}: {str(exc)[:120]}); use triton >= 3.7 or numpy < 2.4"
        )
    return None


def _word(alignment: int) -> tuple[Any, int]:
    """(triton element type, VEC words per alignment unit) for an alignment in bytes."""
    tl = _triton().language
    return {16: (tl.int64, 2), 8: (tl.int64, 1), 4: (tl.int32, 1), 2: (tl.int16, 1), 1: (tl.int8, 1)}[alignment]


def job_alignment(table: KVCacheTable, host: torch.Tensor, host_offsets: np.ndarray) -> int:
    """Largest power of two <= 16 dividing the table's views, the host address and every offset."""
    bits = int(np.bitwise_or.reduce(host_offsets)) if len(host_offsets) else 0
    bits |= host.data_ptr() | table.alignment
    a = 16
    while bits % a:
        a //= 2
    return a


@dataclass(frozen=True)
class _DeviceTables:
    anchor: torch.Tensor  # tensor whose data_ptr is the cache anchor
    views: torch.Tensor  # int64 [V, 4] (delta, stride, page, record_offset) in units
    groups: torch.Tensor  # int64 [G, 2] (first, count)
    max_page_bytes: int


def _device_tables(table: KVCacheTable, unit: int) -> _DeviceTables:
    key = ("triton", unit)
    cached = table.cache.get(key)
    if cached is not None:
        return cached
    views = [v for g in table.groups for v in g.views]
    anchor = views[0]
    rows = []
    for v in views:
        delta = v.ptr - anchor.ptr
        rows.append([delta // unit, v.block_stride // unit, v.page_bytes // unit, v.record_offset // unit])
    groups, first = [], 0
    for g in table.groups:
        groups.append([first, len(g.views)])
        first += len(g.views)
    dev = table.device
    out = _DeviceTables(
        anchor=anchor.pages,
        views=torch.tensor(rows, dtype=torch.int64).to(dev),
        groups=torch.tensor(groups, dtype=torch.int64).to(dev),
        max_page_bytes=max(v.page_bytes for v in views),
    )
    table.cache[key] = out
    return out


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


class TritonBackend(KernelBackend):
    """One Triton launch per job for every layer of every group (compiled on CUDA, interpreted on CPU).

    Args (all optional; default from :func:`kvoffload.kernels.config.launch_config`):
        num_programs: cap on the persistent grid (SM budget left to the model).
        block_bytes: bytes one program moves per loop iteration (power of two >= 16).
        num_warps: warps per program (compiled only).
    """

    name = "triton"

    def __init__(
        self, num_programs: int | None = None, block_bytes: int | None = None, num_warps: int | None = None
    ) -> None:
        over = {
            k: v
            for k, v in (("num_programs", num_programs), ("block_bytes", block_bytes), ("num_warps", num_warps))
            if v is not None
        }
        if over:
            LaunchConfig().merged(over, "TritonBackend")  # validates types and ranges now
        self._overrides = over

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            return False
        try:
            _kernels()
        except Exception as exc:  # noqa: BLE001 - any import problem means "cannot run"
            logger.debug("triton backend unavailable: %s", exc)
            return False
        if device.type == "cuda":
            return torch.cuda.is_available()
        problem = interpreter_problem()
        if problem is not None:
            logger.debug("triton backend unavailable on CPU: %s", problem)
        return problem is None

    def config(self, device: torch.device) -> LaunchConfig:
        """Effective launch parameters for ``device``."""
        return launch_config(device).merged(self._overrides, "TritonBackend")

    def _copy(self, job: TransferJob, to_host: bool) -> None:
        table, host = job.table, job.host
        if not any(g.views for g in table.groups):
            return
        unit = job_alignment(table, host, job.host_offsets)
        tables = _device_tables(table, unit)
        wtype, vec = _word(unit)
        esize = unit // vec
        dev = table.device
        cfg = self.config(dev)
        block = max(vec, min(cfg.block_bytes, _next_pow2(tables.max_page_bytes)) // esize)
        n = job.n
        arr = np.empty((3, n), dtype=np.int64)
        arr[0] = job.block_ids
        arr[1] = job.group_ids
        np.floor_divide(job.host_offsets, unit, out=arr[2])
        units = n * table.max_views
        grid = (max(1, min(cfg.num_programs, units)),)
        triton = _triton()
        cache_arg = triton.reinterpret(tables.anchor, wtype)
        host_arg = triton.reinterpret(host, wtype)
        compiled, interpreted = _kernels()
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                job_t = torch.from_numpy(arr).pin_memory().to(dev, non_blocking=True)
                compiled[grid](
                    cache_arg,
                    host_arg,
                    tables.views,
                    tables.groups,
                    job_t,
                    n,
                    table.max_views,
                    TO_HOST=to_host,
                    VEC=vec,
                    BLOCK=block,
                    num_warps=cfg.num_warps,
                )
        elif dev.type == "cpu":
            job_t = torch.from_numpy(arr)
            with _interp_lock:
                interpreted[grid](
                    cache_arg,
                    host_arg,
                    tables.views,
                    tables.groups,
                    job_t,
                    n,
                    table.max_views,
                    TO_HOST=to_host,
                    VEC=vec,
                    BLOCK=block,
                )
        else:  # pragma: no cover - is_available rejects other devices first
            raise InvalidArgumentError(f"triton backend cannot run on {dev}")
