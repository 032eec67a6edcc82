"""Three data paths for one pack/unpack job, chosen per device and job shape.

* ``"direct"`` -- the backend's kernel reads/writes the pinned host pool itself (SMs do the
  host-link traffic): one launch.
* ``"staged"`` -- copy engines do the host-link traffic in large copies, the kernel only moves
  bytes inside GPU memory. Unpack: the job's host records are copied (DMA, one copy per run of
  contiguous records) into a GPU staging segment, then scattered HBM->HBM into the paged cache.
  Pack: gathered HBM->HBM into a staging segment, then one DMA per contiguous run to the host.
  The staging ring is allocated once, bounded (``staging_bytes``, split into
  ``staging_segments`` segments) and reused; a job larger than a segment goes in pieces, the
  copy of one piece overlapping the kernel of the previous one (copy stream + events on CUDA).
* ``"dma"`` -- copy engines only, no SM used for the host link or anything else: one copy per
  (block x view) page, coalesced where pages and records are contiguous on both sides, issued in
  one batch (``cuMemcpyBatchAsync`` when ``cuda.bindings`` has it, else ``cudaMemcpyAsync`` per copy).
  (The uncoalesced per-page copy loop kept as a benchmark baseline is the ``"page_loop"``
  *backend*, not a path.)

Everything is device-agnostic: on CPU tensors the "DMA" is a plain copy and the kernel is the
backend's (torch reference or Triton's interpreter), so every path is tested byte-exact in CI.
``"auto"`` takes the staged path when the job moves at least ``*_staged_min_bytes`` (per-GPU
config, :mod:`kvoffload.kernels.config`), else the direct path. The choice is logged once per
(direction, path, record sizes, job-size bucket). Nothing here waits for the device.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.config import PATH_NAMES, LaunchConfig, launch_config
from kvoffload.kernels.copy_engine import (
    BatchedCopies,
    CopyExecutor,
    CopyList,
    FallbackCopies,
    TorchCopies,
    coalesce,
)
from kvoffload.kernels.job import CopyJob, validate_job
from kvoffload.kernels.layout import KVCacheTable

logger = logging.getLogger(__name__)

__all__ = ["DataPath", "default_copies"]

_SEGMENT_ALIGN = 256


def default_copies(device: torch.device) -> CopyExecutor:
    """Batched copies on CUDA when ``cuda.bindings`` offers them, else one copy per range."""
    if device.type == "cuda":
        try:
            return FallbackCopies(BatchedCopies(), TorchCopies())
        except Exception as exc:  # noqa: BLE001 - optional API missing or different
            logger.info("copy-engine paths use one cudaMemcpyAsync per copy: %s", exc)
    return TorchCopies()


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind ``t`` as a flat uint8 tensor."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


class DataPath:
    """Runs pack/unpack jobs of one KV cache through the direct, staged or copy-engine-only path.

    Args:
        backend: the kernel backend (direct path, and the HBM scatter/gather of the staged path).
        table: the KV cache.
        path: ``"auto"`` (per job from the config), or force ``"direct"``/``"staged"``/``"dma"``.
        config: the device's :class:`LaunchConfig` (default: :func:`launch_config` of the table's device).
        copies: the copy executor (default: :func:`default_copies`).

    The staging ring is allocated here (not on the submit path) when the staged path can be chosen.
    """

    def __init__(
        self,
        backend: KernelBackend,
        table: KVCacheTable,
        path: str = "auto",
        config: LaunchConfig | None = None,
        copies: CopyExecutor | None = None,
    ) -> None:
        if not isinstance(path, str):
            raise InvalidTypeError(f"path must be a str, got {type(path).__name__}")
        if path not in PATH_NAMES:
            raise InvalidArgumentError(f"path must be one of {list(PATH_NAMES)}, got {path!r}")
        self.backend, self.table, self.path = backend, table, path
        self.device = table.device
        self.config = config if config is not None else launch_config(self.device)
        self.copies = copies if copies is not None else default_copies(self.device)
        self._cuda = self.device.type == "cuda"
        cls = type(backend)
        # a backend that overrides pack/unpack may not implement _copy: direct path only, via pack/unpack
        self._own_copy = cls.pack is KernelBackend.pack and cls.unpack is KernelBackend.unpack
        self._logged: set[tuple[Any, ...]] = set()
        self._staging: torch.Tensor | None = None
        self._segment_bytes = 0
        self._seg_free: list[Any] = []
        self._copy_stream: Any = None
        self._next_segment = 0
        self._host_cuts: np.ndarray | None = None
        self._spaces()  # flat views for the copy-engine-only path: built here, not on the submit path
        if self._may_stage():
            self._allocate_staging()

    def split_host_copies(self, cuts: np.ndarray) -> None:
        """Copy-engine copies of the host buffer that the jobs name (one buffer for every job)
        are never merged across these sorted byte offsets into it: where one ``cudaHostRegister``
        range ends and the next begins, which the copy engines refuse to copy across. Set once,
        before the first job; an empty array: no cut."""
        self._host_cuts = np.ascontiguousarray(cuts, dtype=np.int64) if len(cuts) else None

    # ------------------------------------------------------------------ choice
    def _may_stage(self) -> bool:
        """Whether some job, in some direction, takes the staged path (then a staging ring is needed)."""
        return any(self.choose(to_host, sys.maxsize) == "staged" for to_host in (True, False))

    def choose(self, to_host: bool, job_bytes: int) -> str:
        """The path a job of ``job_bytes`` bytes takes in this direction."""
        mode = self.path
        if mode == "auto":
            c = self.config
            mode, threshold = (
                (c.pack_path, c.pack_staged_min_bytes) if to_host else (c.unpack_path, c.unpack_staged_min_bytes)
            )
            if mode == "auto":
                mode = "staged" if 0 <= threshold <= job_bytes else "direct"
        # the staged path needs the backend's own kernel, which can be pointed at a staging buffer
        return "direct" if mode == "staged" and not self._own_copy else mode

    def direct_below(self, to_host: bool) -> int:
        """Jobs moving fewer bytes than this take the direct path in this direction (see :meth:`choose`)."""
        if self.choose(to_host, sys.maxsize) == "direct":
            return sys.maxsize
        if self.choose(to_host, 0) != "direct":
            return 0
        return self.config.pack_staged_min_bytes if to_host else self.config.unpack_staged_min_bytes

    def _log_choice(self, to_host: bool, path: str, job: CopyJob) -> None:
        key = (to_host, path, int(job.total_bytes).bit_length())  # per DataPath: one table
        if key not in self._logged:
            self._logged.add(key)
            logger.info(
                "%s of ~%d KiB (%d records of %s B) on %s: %s path",
                "pack" if to_host else "unpack",
                job.total_bytes >> 10,
                job.n,
                sorted(set(self.table.record_bytes)),
                self.device,
                path,
            )

    # ------------------------------------------------------------------ entry points
    def pack(self, host: torch.Tensor, block_ids: Any, group_ids: Any, host_offsets: Any) -> str:
        """GPU pages -> host records (arguments as :meth:`KernelBackend.pack`); returns the path taken."""
        return self.run(validate_job(self.table, host, block_ids, group_ids, host_offsets, to_host=True), True)

    def unpack(self, host: torch.Tensor, block_ids: Any, group_ids: Any, host_offsets: Any) -> str:
        """Host records -> GPU pages (arguments as :meth:`KernelBackend.unpack`); returns the path taken."""
        return self.run(validate_job(self.table, host, block_ids, group_ids, host_offsets, to_host=False), False)

    def run(self, job: CopyJob, to_host: bool) -> str:
        """Run ``job``, which its caller checked (:func:`~kvoffload.kernels.job.validate_job`, or
        the transfer worker's job mapping): nothing is checked again. Returns the path taken."""
        path = self.choose(to_host, job.total_bytes)
        self._log_choice(to_host, path, job)
        if job.total_bytes == 0:
            return path
        if path == "direct":
            if self._own_copy:  # already validated: straight to the kernel
                self.backend._check_device(self.device)
                self.backend._copy(job, to_host)
            else:
                (self.backend.pack if to_host else self.backend.unpack)(
                    job.table, job.host, job.block_ids, job.group_ids, job.host_offsets
                )
        elif path == "staged":
            self._staged(job, to_host)
        else:
            self._dma(job, to_host)
        return path

    # ------------------------------------------------------------------ copy engines only
    def _spaces(self) -> tuple[list[torch.Tensor], list[np.ndarray]]:
        """Flat storages behind the views; per group ``int64[V, 5]`` (space, offset, stride, page, record_offset)."""
        cached = self.table.cache.get("dma_spaces")
        if cached is None:
            spaces: list[torch.Tensor] = []
            index: dict[int, int] = {}
            per_group = []
            for g in self.table.groups:
                rows = []
                for v in g.views:
                    storage_ptr = v.pages.untyped_storage().data_ptr()
                    if storage_ptr not in index:
                        index[storage_ptr] = len(spaces)
                        spaces.append(_flat(v.pages))
                    rows.append(
                        [index[storage_ptr] + 1, v.ptr - storage_ptr, v.block_stride, v.page_bytes, v.record_offset]
                    )
                per_group.append(np.array(rows, dtype=np.int64).reshape(-1, 5))
            cached = (spaces, per_group)
            self.table.cache["dma_spaces"] = cached
        return cached

    def page_copies(
        self, block_ids: np.ndarray, group_ids: np.ndarray, host_offsets: np.ndarray, to_host: bool
    ) -> CopyList:
        """One copy per page of a job (validated arrays as in :meth:`pack`), not coalesced, over the
        spaces ``[host, *self._spaces()[0]]``."""
        per_group = self._spaces()[1]
        parts = [np.zeros((5, 0), dtype=np.int64)]
        for g in np.unique(group_ids).tolist():
            views = per_group[g]
            if not len(views):
                continue
            sel = group_ids == g
            bids, offs = block_ids[sel], host_offsets[sel]
            cache_space = np.broadcast_to(views[:, 0], (bids.size, len(views)))
            cache_off = views[None, :, 1] + bids[:, None] * views[None, :, 2]
            host_off = offs[:, None] + views[None, :, 4]
            size = np.broadcast_to(views[:, 3], cache_off.shape)
            parts.append(np.stack([cache_space, cache_off, np.zeros_like(cache_off), host_off, size]).reshape(5, -1))
        rows = np.concatenate(parts, axis=1)  # cache side first
        return CopyList(rows[[2, 3, 0, 1, 4]] if to_host else rows)

    def _dma(self, job: CopyJob, to_host: bool) -> None:
        r = self.page_copies(job.block_ids, job.group_ids, job.host_offsets, to_host).rows
        copies = coalesce(r[0], r[1], r[2], r[3], r[4], cuts=self._host_cuts)
        self.copies.run([job.host, *self._spaces()[0]], copies)

    # ------------------------------------------------------------------ staged
    def _allocate_staging(self) -> None:
        c = self.config
        max_record = max(self.table.record_bytes)
        seg = max(c.staging_bytes // c.staging_segments, max_record)
        seg = -(-seg // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
        self._segment_bytes = seg
        self._staging = torch.empty(seg * c.staging_segments, dtype=torch.uint8, device=self.device)
        self._seg_free = [None] * c.staging_segments
        if self._cuda:
            self._copy_stream = torch.cuda.Stream(self.device, priority=-1)
        logger.info("staging ring on %s: %d segments x %d KiB", self.device, c.staging_segments, seg >> 10)

    @property
    def staging_bytes(self) -> int:
        """Bytes of the staging ring (0 when this path never stages)."""
        return 0 if self._staging is None else int(self._staging.numel())

    def _pieces(self, rb: np.ndarray) -> list[tuple[int, int]]:
        """Split entries (in host-offset order, sizes ``rb``) into runs fitting one segment each."""
        ends = np.cumsum(rb)
        out, start, base = [], 0, 0
        while start < rb.size:
            stop = int(np.searchsorted(ends, base + self._segment_bytes, side="right"))
            stop = max(stop, start + 1)
            out.append((start, stop))
            base = int(ends[stop - 1])
            start = stop
        return out

    def _staged(self, job: CopyJob, to_host: bool) -> None:
        staging = self._staging
        assert staging is not None, "the ring is allocated at construction whenever staging can be chosen"
        keep = job.record_bytes > 0
        order = np.argsort(job.host_offsets[keep], kind="stable")
        bids = job.block_ids[keep][order]
        gids = job.group_ids[keep][order]
        hoffs = job.host_offsets[keep][order]
        rb = job.record_bytes[keep][order]
        cur: Any = torch.cuda.current_stream(self.device) if self._cuda else None
        if self._cuda:
            self._copy_stream.wait_stream(cur)  # host bytes / cache pages written before this job
        for start, stop in self._pieces(rb):
            s = self._next_segment
            self._next_segment = (s + 1) % len(self._seg_free)
            seg0 = s * self._segment_bytes
            sizes = rb[start:stop]
            pos = seg0 + np.concatenate(([0], np.cumsum(sizes)[:-1]))
            zeros, ones = np.zeros(sizes.size, dtype=np.int64), np.ones(sizes.size, dtype=np.int64)
            sub = CopyJob(self.table, staging, bids[start:stop], gids[start:stop], pos, sizes, int(sizes.sum()))
            if to_host:
                out = coalesce(zeros, hoffs[start:stop], ones, pos, sizes, cuts=self._host_cuts)
                self._on(cur, s, functools.partial(self.backend._copy, sub, True))
                self._on(self._copy_stream, s, functools.partial(self.copies.run, [job.host, staging], out))
            else:
                into = coalesce(ones, pos, zeros, hoffs[start:stop], sizes, cuts=self._host_cuts)
                self._on(self._copy_stream, s, functools.partial(self.copies.run, [job.host, staging], into))
                self._on(cur, s, functools.partial(self.backend._copy, sub, False))
        if self._cuda:
            cur.wait_stream(self._copy_stream)  # the job is done when the current stream says so

    def _on(self, stream: Any, segment: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` on ``stream`` after the segment's previous user; the segment's next user waits for it."""
        if not self._cuda:
            fn()
            return
        with torch.cuda.stream(stream):
            prev = self._seg_free[segment]
            if prev is not None:
                stream.wait_event(prev)
            fn()
            ev = torch.cuda.Event()
            ev.record(stream)
            self._seg_free[segment] = ev

    def describe(self) -> dict[str, Any]:
        """What this data path will do (for logs and reports)."""
        return {
            "path": self.path,
            "copies": getattr(self.copies, "name", type(self.copies).__name__),
            "staging_bytes": self.staging_bytes,
            "segments": len(self._seg_free),
            "pack_auto": (self.config.pack_path, self.config.pack_staged_min_bytes),
            "unpack_auto": (self.config.unpack_path, self.config.unpack_staged_min_bytes),
        }
