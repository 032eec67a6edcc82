"""The copy kernel bound once to a KV cache and a host buffer: a launch costs only what changes per job.

:class:`TritonBoundKernel` resolves at construction everything a launch of
:func:`~kvoffload.kernels.triton_kernels.copy_pages_kernel` needs that is fixed for the pair
(cache, host buffer): the word size, the tile geometry, the device tables, the fixed pointer
arguments and, on CUDA, the compiled kernel of each direction (compiled here, not on a submit).
A launch then takes a job table by address (``int64[n, 3]`` rows, see the kernel) and does one
launch. How it reaches the device -- the *entry* -- is chosen once per instance and logged once
per process:

* ``"compiled"``: the compiled kernel's own launcher (``CompiledKernel.run``), called with
  integer pointers. Triton's binder (argument binding, specialisation, cache lookup) and the
  launcher's per-pointer attribute query do not run. Chosen on the Triton versions whose
  launcher takes the call below (:data:`COMPILED_ENTRY_VERSIONS`) when no launch hook is set.
* ``"plain"``: Triton's public launch, ``kernel[grid](...)`` -- every other Triton version, or
  when a profiler set Triton's launch hooks.
* ``"interpreter"``: a cache on CPU tensors runs the same kernel through Triton's interpreter.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.kernels.backend import BoundKernel
from kvoffload.kernels.triton_support import INTERPRETER_LOCK, kernels, triton_module

logger = logging.getLogger(__name__)

__all__ = [
    "TritonBoundKernel",
    "COMPILED_ENTRY_VERSIONS",
    "ENTRIES",
    "compiled_entry_supported",
    "compile_variant",
    "Pointer",
]

#: Triton versions (major, minor) whose compiled-kernel launcher takes ``run(grid_x, grid_y,
#: grid_z, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``
#: with every kernel argument, constexprs included, in parameter order (read in 3.6 and 3.9).
COMPILED_ENTRY_VERSIONS = ((3, 6), (3, 7), (3, 8), (3, 9))
#: The ``entry`` argument: ``"auto"`` picks ``"compiled"`` where supported, else ``"plain"``.
ENTRIES = ("auto", "compiled", "plain")

_logged: set[str] = set()


class Pointer:
    """A pointer argument as Triton's binder reads it (like its ``MockTensor``): an address and a
    torch element type. Lets the plain entry and compiles take addresses, not tensors."""

    __slots__ = ("_address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self._address = address
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self._address


def compile_variant(
    pointers: tuple[Any, ...], tail: tuple[int, int], to_buf: bool, consts: dict[str, Any], num_warps: int
) -> Any:
    """One variant of the copy kernel compiled for the current CUDA device without launching it
    (Triton's own cache answers a variant compiled before), its module loaded: the compiled kernel.

    ``pointers``: the cache, buffer, views and groups pointer arguments (tensors or addresses as
    :class:`Pointer`); the job table is taken 16-byte aligned, as every launch passes it.
    ``tail``: ``(max_views, max_page)``; ``consts``: the constexprs but ``TO_BUF``.
    """
    jit, _ = kernels()
    table = Pointer(16, torch.int64)
    kernel = jit.warmup(*pointers, table, 1 << 20, *tail, TO_BUF=to_buf, **consts, num_warps=num_warps, grid=(1,))
    _ = kernel.run  # loads the module and builds the launcher now, not at the first job
    return kernel


def compiled_entry_supported() -> str | None:
    """Why the compiled entry cannot be used with the installed Triton, or None if it can."""
    triton = triton_module()
    try:
        version = tuple(int(x) for x in str(triton.__version__).split(".")[:2])
    except ValueError:
        return f"triton version {triton.__version__!r} not understood"
    if version not in COMPILED_ENTRY_VERSIONS:
        return f"triton {triton.__version__}: its compiled-kernel launcher is not one this entry knows"
    from triton import knobs  # noqa: PLC0415 - lazy, as triton itself

    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # a HookChain with hooks, or a hook
            return "a Triton launch hook is set (a profiler): its hooks need the public launch"
    return None


def _log_once(message: str, *args: Any) -> None:
    text = message % args
    if text not in _logged:
        _logged.add(text)
        logger.info(text)


class TritonBoundKernel(BoundKernel):
    """:func:`~kvoffload.kernels.triton_kernels.copy_pages_kernel` bound to one cache and host buffer.

    Built by :meth:`TritonBackend.bind <kvoffload.kernels.triton_backend.TritonBackend.bind>`,
    which resolves the pieces below once.

    Args:
        device: the cache's device.
        anchor: tensor whose address is the cache anchor; ``host``: the host buffer.
        views / groups: the device tables (``int64[V, 4]`` / ``int64[G, 2]``, in ``unit`` units).
        unit: the word size in bytes; ``word_dtype``: the torch integer type of a word
            (``vec`` words per unit); ``pages`` / ``chunk`` / ``num_warps``: the tile geometry.
        max_views / max_page: the table's most views per group and largest page (in units).
        num_programs: the grid cap.
        entry: one of :data:`ENTRIES`.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        anchor: torch.Tensor,
        host: torch.Tensor,
        views: torch.Tensor,
        groups: torch.Tensor,
        unit: int,
        word_dtype: torch.dtype,
        vec: int,
        pages: int,
        chunk: int,
        num_warps: int,
        max_views: int,
        max_page: int,
        num_programs: int,
        entry: str = "auto",
    ) -> None:
        if entry not in ENTRIES:
            raise InvalidArgumentError(f"entry must be one of {list(ENTRIES)}, got {entry!r}")
        self.unit = unit
        self._device = device
        self._pages = pages
        self._max_views = max_views
        self._programs = num_programs
        self._keep = (anchor, host, views, groups)  # the addresses below stay valid while bound
        self._tail = (max_views, max_page)
        self._consts = {"BUF_ON_HOST": True, "VEC": vec, "PAGES": pages, "CHUNK": chunk}
        if device.type != "cuda":
            self.entry = "interpreter"
            triton = triton_module()
            wtype = getattr(triton.language, str(word_dtype).rsplit(".", 1)[-1])
            self._interp_args = (triton.reinterpret(anchor, wtype), triton.reinterpret(host, wtype), views, groups)
            return
        why = compiled_entry_supported() if entry != "plain" else "asked for"
        if entry == "compiled" and why is not None:
            raise InvalidArgumentError(f"entry='compiled' cannot be used: {why}")
        self.entry = "compiled" if why is None else "plain"
        self._ptrs = (
            Pointer(anchor.data_ptr(), word_dtype),
            Pointer(host.data_ptr(), word_dtype),
            Pointer(views.data_ptr(), torch.int64),
            Pointer(groups.data_ptr(), torch.int64),
        )
        self._num_warps = num_warps
        self._stream: Any = None
        self._handle = 0
        # both directions compiled now; the compiled entry keeps each one's launcher
        self._compiled: dict[bool, tuple[Any, ...]] = {}
        fixed = tuple(p.data_ptr() for p in self._ptrs)
        for to_host in (True, False):
            kernel = compile_variant(self._ptrs, self._tail, to_host, self._consts, num_warps)
            consts = (to_host, True, vec, pages, chunk)
            try:
                self._compiled[to_host] = (kernel.run, kernel.function, kernel.packed_metadata, fixed, consts)
            except AttributeError as exc:  # a compiled kernel without the pieces this entry calls
                if entry == "compiled":
                    raise InvalidArgumentError(f"entry='compiled' cannot be used: {exc}") from exc
                self.entry, why = "plain", str(exc)
        if self.entry == "plain":
            _log_once("triton kernels launch through kernel[grid](...) (%s)", why)
        else:
            _log_once("triton kernels launch through the compiled kernel's launcher")

    def launch(self, table: np.ndarray, address: int, n: int, to_host: bool, stream: Any = None) -> None:
        tiles = -(-(n * self._max_views) // self._pages)
        grid = tiles if tiles < self._programs else self._programs
        if self.entry == "compiled":
            if stream is None:
                handle = int(torch.cuda.current_stream(self._device).cuda_stream)
            elif stream is self._stream:  # the last stream named: a launcher's streams rarely change
                handle = self._handle
            else:
                self._stream, handle = stream, int(stream.cuda_stream)
                self._handle = handle
            run, function, packed, fixed, consts = self._compiled[to_host]
            run(grid, 1, 1, handle, function, packed, None, None, None, *fixed, address, n, *self._tail, *consts)
            return
        if self.entry == "plain":
            jit, _ = kernels()
            args = (*self._ptrs, Pointer(address, torch.int64), n, *self._tail)
            if stream is None:
                jit[(grid,)](*args, TO_BUF=to_host, **self._consts, num_warps=self._num_warps)
            else:
                with torch.cuda.stream(stream):
                    jit[(grid,)](*args, TO_BUF=to_host, **self._consts, num_warps=self._num_warps)
            return
        _, interpreted = kernels()
        job = torch.from_numpy(table[:n])
        with INTERPRETER_LOCK:
            interpreted[(grid,)](*self._interp_args, job, n, *self._tail, TO_BUF=to_host, **self._consts)
