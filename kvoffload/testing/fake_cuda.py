"""A CUDA device that is not there: run the transfer worker's CUDA submit path on a CPU-only machine.

:func:`fake_cuda` replaces, for the duration of a ``with`` block, every call the submit path makes
into CUDA with a no-op that records it:

* ``torch.cuda``'s streams, events, current stream/device, graph-capture query, ``cudart()``
  (host registration) and device properties (an sm_90 GPU named ``"kvoffload fake GPU"``);
* device and pinned allocations: ``torch.empty``/``torch.zeros`` on the CUDA device or with
  ``pin_memory=True``, and kvoffload's :func:`~kvoffload.kernels.device.upload`, return plain
  CPU tensors;
* Triton's active driver: kernels are compiled for real (Triton's compiler and the ptxas in its
  wheel, for an sm_90 target; kept in a kernel cache of the block's own, so that neither side
  sees the other's), their modules are "loaded" as dummy handles, and a launch runs
  the real Python side of Triton (the binder, specialisation and cache lookup of
  ``kernel[grid](...)``, or nothing of it through the compiled entry) and stops at the C
  launcher, which only records the call.

* host registration (``cudaHostRegister``/``cudaHostUnregister``): the ranges are recorded, a
  range sharing a page with a live registration is refused as CUDA does, and a chosen call can be
  made to fail (:class:`FakeCuda`'s ``fail_register_at``) or held (``register_hook``).

So everything the host does in Python and numpy per job runs as on a GPU machine, and what the
driver would do does not run at all: :class:`FakeCuda`'s ``launches`` and ``calls`` say what
would have been launched and called. Tensors stay on the CPU; a KV cache is made to look like a
CUDA one with :func:`as_cuda_table`. Nothing moves bytes: byte-exactness is the interpreter's and
the GPU tests' job. Used by the host-path benchmark (``bench/bench_host_path.py``) and tests.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.triton_support import kernels

__all__ = ["FakeCuda", "fake_cuda", "as_cuda_table", "FAKE_DEVICE"]

FAKE_DEVICE = torch.device("cuda", 0)
_CAPABILITY = (9, 0)


@dataclass
class FakeCuda:
    """What the code under :func:`fake_cuda` asked of CUDA.

    Attributes:
        launches: one ``(grid, args)`` per kernel launch that reached the C launcher, ``args``
            being the kernel's arguments in parameter order (pointers as ints where the caller
            passed ints).
        calls: how many times each faked CUDA call ran (``"event.record"``, ``"stream.wait_event"``...).
        registered: the live host registrations, start address -> bytes.
        register_log: every successful ``cudaHostRegister`` as ``(start, bytes)``, in call order.
        fail_register_at: the ``cudaHostRegister`` call (1-based, counting every call) that fails
            with ``cudaErrorMemoryAllocation`` (2), or None.
        register_hook: called as ``hook(call number, start, bytes)`` before each
            ``cudaHostRegister`` (on the calling thread: it may block to hold the registration).
    """

    launches: list[tuple[tuple[int, int, int], tuple[Any, ...]]] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    capturing: bool = False
    registered: dict[int, int] = field(default_factory=dict)
    register_log: list[tuple[int, int]] = field(default_factory=list)
    fail_register_at: int | None = None
    register_hook: Callable[[int, int, int], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def registration_of(self, start: int, nbytes: int) -> tuple[int, int] | None:
        """The live registration ``(start, bytes)`` holding all of ``[start, start + nbytes)``, or None."""
        with self._lock:
            for s, n in self.registered.items():
                if s <= start and start + nbytes <= s + n:
                    return s, n
        return None


_active = FakeCuda()  # the record of the innermost fake_cuda() block


class _Stream:
    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self._fake = _active
        self.cuda_stream = id(self)
        self.device = FAKE_DEVICE

    def wait_event(self, event: Any) -> None:
        self._fake.calls["stream.wait_event"] += 1

    def wait_stream(self, other: Any) -> None:
        self._fake.calls["stream.wait_stream"] += 1

    def synchronize(self) -> None:
        self._fake.calls["stream.synchronize"] += 1

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.cuda_stream == self.cuda_stream

    def __hash__(self) -> int:
        return self.cuda_stream


class _Event:
    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self._fake = _active

    def record(self, stream: Any = None) -> None:
        self._fake.calls["event.record"] += 1

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self._fake.calls["event.synchronize"] += 1

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class _Cudart:
    def __init__(self, fake: FakeCuda) -> None:
        self._fake = fake

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        fake = self._fake
        with fake._lock:
            fake.calls["cudaHostRegister"] += 1
            n = fake.calls["cudaHostRegister"]
        if fake.register_hook is not None:
            fake.register_hook(n, ptr, size)
        if n == fake.fail_register_at:
            return 2  # cudaErrorMemoryAllocation
        page = mmap.PAGESIZE
        lo, hi = ptr // page * page, -(-(ptr + size) // page) * page
        with fake._lock:
            for s, m in fake.registered.items():
                if s // page * page < hi and lo < -(-(s + m) // page) * page:
                    return 712  # cudaErrorHostMemoryAlreadyRegistered
            fake.registered[ptr] = size
            fake.register_log.append((ptr, size))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802 - CUDA's name
        fake = self._fake
        with fake._lock:
            fake.calls["cudaHostUnregister"] += 1
            if fake.registered.pop(ptr, None) is None:
                return 713  # cudaErrorHostMemoryNotRegistered
        return 0

    def cudaGetLastError(self) -> int:  # noqa: N802 - CUDA's name
        self._fake.calls["cudaGetLastError"] += 1
        return 0


@dataclass(frozen=True)
class _Properties:
    name: str = "kvoffload fake GPU"
    major: int = _CAPABILITY[0]
    minor: int = _CAPABILITY[1]
    multi_processor_count: int = 132
    total_memory: int = 80 << 30


class _Launcher:
    """Triton's C launcher, reduced to recording the call (same arguments on Triton 3.6-3.9) in
    the innermost :func:`fake_cuda` block's record (Triton keeps compiled kernels, and so their
    launchers, across blocks)."""

    def __init__(self, src: Any, metadata: Any) -> None:
        pass

    def __call__(self, gx: int, gy: int, gz: int, stream: Any, function: Any, *rest: Any) -> None:
        # rest: packed metadata, launch metadata, enter hook, exit hook, then the kernel's arguments
        _active.launches.append(((gx, gy, gz), tuple(rest[4:])))


class _Utils:
    def __init__(self, fake: FakeCuda) -> None:
        self._fake = fake

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        self._fake.calls["cuModuleLoad"] += 1
        return 1, 1, 32, 0, 1024

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}

    def unload_module(self, module: Any) -> None:
        return None


class _Driver:
    """Triton's driver for a GPU that is not there (only what the runtime calls)."""

    def __init__(self, fake: FakeCuda) -> None:
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415 - lazy, as triton itself

        self.utils = _Utils(fake)
        self.launcher_cls = _Launcher
        self._target = GPUTarget("cuda", _CAPABILITY[0] * 10 + _CAPABILITY[1], 32)

    def is_active(self) -> bool:
        return True

    def get_current_target(self) -> Any:
        return self._target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        return None

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int = 0) -> tuple[int, int]:
        return _CAPABILITY

    def get_active_torch_device(self) -> torch.device:
        return FAKE_DEVICE


def _upload(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr))


def _on_cpu(alloc: Any) -> Any:
    """``alloc`` (``torch.empty``/``torch.zeros``) with the CUDA device and pinning dropped."""

    def wrapped(*size: Any, device: Any = None, pin_memory: bool = False, **kw: Any) -> torch.Tensor:
        if device is not None and torch.device(device).type != "cuda":
            kw["device"] = device
        return alloc(*size, **kw)

    return wrapped


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeCuda]:
    """Within the block, CUDA calls are faked (see the module docstring); yields the record."""
    import sys  # noqa: PLC0415

    import triton  # noqa: PLC0415 - lazy, as everywhere in kvoffload

    # the modules that import upload by name, imported first so that theirs is patched (and restored)
    from kvoffload.kernels import config, device, torch_ref, triton_backend  # noqa: F401, PLC0415

    global _active
    outer, fake = _active, FakeCuda()
    _active = fake
    current = _Stream()
    cuda = torch.cuda
    patches: list[tuple[Any, str, Any]] = [
        (cuda, "is_available", lambda: True),
        (cuda, "current_device", lambda: 0),
        (cuda, "device_count", lambda: 1),
        (cuda, "device", lambda d=None: contextlib.nullcontext()),
        (cuda, "stream", lambda s=None: contextlib.nullcontext()),
        (cuda, "Stream", _Stream),
        (cuda, "Event", _Event),
        (cuda, "current_stream", lambda device=None: current),
        (cuda, "is_current_stream_capturing", lambda: fake.capturing),
        (cuda, "synchronize", lambda device=None: None),
        (cuda, "cudart", lambda: _Cudart(fake)),
        (cuda, "get_device_properties", lambda device=None: _Properties()),
        (torch, "empty", _on_cpu(torch.empty)),
        (torch, "zeros", _on_cpu(torch.zeros)),
    ]
    # upload, where it was imported by name too (the kernels' device tables)
    original_upload = device.upload
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("kvoffload.") and getattr(mod, "upload", None) is original_upload:
            patches.append((mod, "upload", _upload))
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    for obj, attr, value in patches:
        setattr(obj, attr, value)
    config._cuda_config.cache_clear()
    drivers = triton.runtime.driver
    previous = drivers._active  # None until first used: reset_active() would build the real one
    drivers.set_active(_Driver(fake))
    # kernels compiled in the block (with fake launchers) stay in it, and real ones stay out of it
    jit, _ = kernels()
    real_caches = jit.device_caches
    jit.device_caches = collections.defaultdict(jit.create_binder)
    try:
        yield fake
    finally:
        jit.device_caches = real_caches
        drivers._active = previous
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
        config._cuda_config.cache_clear()
        _active = outer


def as_cuda_table(table: KVCacheTable) -> KVCacheTable:
    """``table`` (CPU tensors) labelled as a KV cache on :data:`FAKE_DEVICE`; use under :func:`fake_cuda`."""
    table.device = FAKE_DEVICE
    table.cache.clear()
    return table
