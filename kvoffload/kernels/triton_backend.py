"""``"triton"`` backend: one :func:`~kvoffload.kernels.triton_kernels.copy_pages_kernel` launch per job.

On CUDA the kernel is compiled and enqueued on the current stream of the cache's device; the
buffer is the pinned host pool (read/written by the SMs directly) or a GPU staging buffer. The
per-table device tables are built once (:meth:`TritonBackend.prepare`, called by the transfer
worker at construction; else on first use), through pinned memory and non-blocking copies; the
per-job arrays (three int64 per block) the same way, so nothing on the submit path waits for the
device. On CPU tensors the *same* raw kernel runs through Triton's interpreter, which is how CI
tests it.

Word size: the widest of 16/8/4/2/1 bytes dividing every view address, block stride, page size,
the buffer address and every buffer offset of the job. Launch geometry (:func:`tile_geometry`):
tiles of several pages per program iteration, warps sized so that each thread moves >= 16 bytes.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.config import LaunchConfig, launch_config
from kvoffload.kernels.device import upload
from kvoffload.kernels.job import CopyJob
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.triton_launch import ENTRIES, Pointer, TritonBoundKernel, compile_variant
from kvoffload.kernels.triton_support import INTERPRETER_LOCK, interpreter_problem, kernels, triton_module

logger = logging.getLogger(__name__)

__all__ = ["TritonBackend", "TileGeometry", "job_alignment", "tile_geometry", "word_type", "interpreter_problem"]

_BYTES_PER_THREAD = 16


def word_type(alignment: int) -> tuple[str, int]:
    """(triton element type name, VEC words per alignment unit) for an alignment in bytes."""
    return {16: ("int64", 2), 8: ("int64", 1), 4: ("int32", 1), 2: ("int16", 1), 1: ("int8", 1)}[alignment]


def _pow2_alignment(bits: int) -> int:
    a = 16
    while bits % a:
        a //= 2
    return a


def job_alignment(table: KVCacheTable, host: torch.Tensor, host_offsets: np.ndarray) -> int:
    """Largest power of two <= 16 dividing the table's views, the buffer address and every offset."""
    bits = int(np.bitwise_or.reduce(host_offsets)) if len(host_offsets) else 0
    return _pow2_alignment(bits | host.data_ptr() | table.alignment)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass(frozen=True)
class TileGeometry:
    """How one launch moves pages: ``pages`` x ``chunk`` words per step (``vec`` words per aligned unit)."""

    vec: int
    pages: int
    chunk: int
    num_warps: int


def tile_geometry(max_page_bytes: int, alignment: int, cfg: LaunchConfig) -> TileGeometry:
    """Tile shape for pages of up to ``max_page_bytes`` at ``alignment`` (see the module docstring).

    ``chunk`` covers a whole page when it fits in ``cfg.block_bytes`` (else the page takes several
    steps); ``pages = block_bytes / chunk`` pages share one step, so a program keeps about
    ``block_bytes`` in flight whatever the page size; warps = tile bytes / (16 B x 32 threads),
    capped by ``cfg.num_warps``, so every thread moves at least 16 bytes per step.
    """
    _, vec = word_type(alignment)
    esize = alignment // vec
    block_words = max(vec, cfg.block_bytes // esize)
    chunk = max(vec, min(_next_pow2(max(1, max_page_bytes // esize)), block_words))
    pages = max(1, block_words // chunk)
    warps = max(1, min(cfg.num_warps, pages * chunk * esize // (_BYTES_PER_THREAD * 32)))
    return TileGeometry(vec, pages, chunk, 1 << (warps.bit_length() - 1))


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
    rows = [
        [(v.ptr - anchor.ptr) // unit, v.block_stride // unit, v.page_bytes // unit, v.record_offset // unit]
        for v in views
    ]
    groups, first = [], 0
    for g in table.groups:
        groups.append([first, len(g.views)])
        first += len(g.views)
    out = _DeviceTables(
        anchor=anchor.pages,
        views=upload(np.array(rows, dtype=np.int64), table.device),
        groups=upload(np.array(groups, dtype=np.int64), table.device),
        max_page_bytes=max(v.page_bytes for v in views),
    )
    table.cache[key] = out
    return out


class TritonBackend(KernelBackend):
    """One Triton launch per job for every layer of every group (compiled on CUDA, interpreted on CPU).

    Args (all optional; default from :func:`kvoffload.kernels.config.launch_config`):
        num_programs: cap on the persistent grid (SM budget left to the model).
        block_bytes: bytes one program keeps in flight per loop step (power of two >= 16).
        num_warps: cap on warps per program (compiled only; fewer for small tiles).
        entry: how :meth:`bind`'s launches reach the device on CUDA (``"auto"``, ``"compiled"``,
            ``"plain"``; see :mod:`kvoffload.kernels.triton_launch`).
    """

    name = "triton"

    def __init__(
        self,
        num_programs: int | None = None,
        block_bytes: int | None = None,
        num_warps: int | None = None,
        entry: str = "auto",
    ) -> None:
        over = {
            k: v
            for k, v in (("num_programs", num_programs), ("block_bytes", block_bytes), ("num_warps", num_warps))
            if v is not None
        }
        if over:
            LaunchConfig().merged(over, "TritonBackend")  # validates types and ranges now
        self._overrides = over
        if entry not in ENTRIES:
            raise InvalidArgumentError(f"entry must be one of {list(ENTRIES)}, got {entry!r}")
        self._entry = entry

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            return False
        try:
            kernels()
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

    def prepare(self, table: KVCacheTable, host_alignment: int = 1) -> None:
        """Build the device tables for jobs at ``host_alignment`` and, on CUDA, compile the kernel
        for both directions and both buffer kinds (host pool, GPU staging), without a launch."""
        if not any(g.views for g in table.groups):
            return
        unit = _pow2_alignment(table.alignment | host_alignment)
        table.cache["triton_unit"] = unit  # jobs at least this aligned use exactly this variant
        tables = _device_tables(table, unit)
        if table.device.type != "cuda":
            return
        geo = tile_geometry(tables.max_page_bytes, unit, self.config(table.device))
        word = getattr(torch, word_type(unit)[0])
        tail = (table.max_views, tables.max_page_bytes // unit)
        with torch.cuda.device(table.device):
            for on_host in (True, False):
                # the buffer's address: 16-byte aligned, as the pool and the staging segments are
                pointers = (Pointer(tables.anchor.data_ptr(), word), Pointer(256, word), tables.views, tables.groups)
                consts = {"BUF_ON_HOST": on_host, "VEC": geo.vec, "PAGES": geo.pages, "CHUNK": geo.chunk}
                for to_buf in (True, False):
                    compile_variant(pointers, tail, to_buf, consts, geo.num_warps)

    def bind(self, table: KVCacheTable, host: torch.Tensor, host_alignment: int = 1) -> TritonBoundKernel | None:
        """The kernel bound to ``table`` and ``host`` (see :class:`~kvoffload.kernels.triton_launch.
        TritonBoundKernel`), at the word size of ``host_alignment``; compiles both directions on
        CUDA. None when no group has a view (nothing to move)."""
        if not any(g.views for g in table.groups):
            return None
        unit = _pow2_alignment(table.alignment | host_alignment | host.data_ptr())
        tables = _device_tables(table, unit)
        cfg = self.config(table.device)
        geo = tile_geometry(tables.max_page_bytes, unit, cfg)
        on_cuda = table.device.type == "cuda"
        with torch.cuda.device(table.device) if on_cuda else contextlib.nullcontext():  # kernels load there
            return TritonBoundKernel(
                device=table.device,
                anchor=tables.anchor,
                host=host,
                views=tables.views,
                groups=tables.groups,
                unit=unit,
                word_dtype=getattr(torch, word_type(unit)[0]),
                vec=geo.vec,
                pages=geo.pages,
                chunk=geo.chunk,
                num_warps=geo.num_warps,
                max_views=table.max_views,
                max_page=tables.max_page_bytes // unit,
                num_programs=cfg.num_programs,
                entry=self._entry,
            )

    def _copy(self, job: CopyJob, to_host: bool) -> None:
        table, buf = job.table, job.host
        if not any(g.views for g in table.groups):
            return
        unit = job_alignment(table, buf, job.host_offsets)
        prepared = table.cache.get("triton_unit")
        if prepared is not None and unit >= prepared:
            unit = prepared  # a narrower word is always correct: no new tables, no compile at submit
        tables = _device_tables(table, unit)
        dev = table.device
        cfg = self.config(dev)
        geo = tile_geometry(tables.max_page_bytes, unit, cfg)
        n = job.n
        arr = np.empty((n, 3), dtype=np.int64)
        arr[:, 0] = job.block_ids
        arr[:, 1] = job.group_ids
        np.floor_divide(job.host_offsets, unit, out=arr[:, 2])
        tiles = -(-(n * table.max_views) // geo.pages)
        grid = max(1, min(cfg.num_programs, tiles))
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                self._launch(table, tables, buf, upload(arr, dev), n, to_host, unit, geo, grid)
        else:
            self._launch(table, tables, buf, torch.from_numpy(arr), n, to_host, unit, geo, grid)

    @staticmethod
    def _launch(
        table: KVCacheTable,
        tables: _DeviceTables,
        buf: torch.Tensor,
        job: torch.Tensor,
        n: int,
        to_buf: bool,
        unit: int,
        geo: TileGeometry,
        grid: int,
    ) -> None:
        triton = triton_module()
        wtype = getattr(triton.language, word_type(unit)[0])
        args = (
            triton.reinterpret(tables.anchor, wtype),
            triton.reinterpret(buf, wtype),
            tables.views,
            tables.groups,
            job,
            n,
            table.max_views,
            tables.max_page_bytes // unit,
        )
        consts: dict[str, Any] = {
            "TO_BUF": to_buf,
            "BUF_ON_HOST": buf.device.type == "cpu",
            "VEC": geo.vec,
            "PAGES": geo.pages,
            "CHUNK": geo.chunk,
        }
        compiled, interpreted = kernels()
        if table.device.type == "cuda":
            compiled[(grid,)](*args, **consts, num_warps=geo.num_warps)
        else:
            with INTERPRETER_LOCK:
                interpreted[(grid,)](*args, **consts)
