"""The host pool: one page-locked CPU buffer holding ``num_slots`` offloaded blocks.

Layout (docs/contract.md §4)::

    buffer: 1-D torch.uint8, exactly num_slots * slot_bytes bytes
    slot s  = buffer[s * slot_bytes : (s + 1) * slot_bytes]
            = block_size_factor GPU-block *records* back to back (a record = every page of its
              KV-cache group, packed), zero-padded up to slot_bytes for the smaller groups

The bytes come from an anonymous ``mmap`` (page aligned, the size rounded up to whole OS pages;
no power-of-two rounding, which ``torch.empty(..., pin_memory=True)`` does through its caching
host allocator; transparent huge pages requested for large pools) and are then page-locked with
ONE ``cudaHostRegister`` call over the whole mapping, so a pool of hundreds of GiB does not double
its footprint. One registration, not several: the copy engines (``cudaMemcpyAsync``,
``cuMemcpyBatchAsync``) refuse a host range that crosses from one registration into the next
with ``cudaErrorInvalidValue`` (measured on an H100, CUDA 13.0), and the data paths coalesce
neighbouring records into copies of any length. The kernels address the pool with its host
pointer (unified virtual addressing), so the registration's device pointer is checked to equal
its host pointer (``cudaHostGetDevicePointer``, when ``cuda.bindings`` or the CUDA runtime
library can be reached); a mismatch is an error.

Without CUDA there is nothing to pin: the pool falls back to pageable memory and logs ONE warning
per process.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import weakref
from typing import Any

import torch

from kvoffload.checks import check_bool, check_int
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError, TransferError

logger = logging.getLogger(__name__)

__all__ = ["HostPool"]

_OS_PAGE = mmap.PAGESIZE
_HUGEPAGE_MIN_BYTES = 1 << 30
# cudaHostRegisterPortable | cudaHostRegisterMapped: usable from every CUDA context, and mapped into
# the device address space (with UVA the device address equals the host address).
_REGISTER_FLAGS = 0x01 | 0x02

_warned_pageable = False
_warn_lock = threading.Lock()


def _warn_pageable_once(reason: str) -> None:
    global _warned_pageable
    with _warn_lock:
        if _warned_pageable:
            return
        _warned_pageable = True
    logger.warning("kvoffload host pool: %s; using pageable host memory (transfers will be slower)", reason)


def _cuda_ok(rc: Any) -> bool:
    try:
        return int(rc) == 0
    except (TypeError, ValueError):
        return str(rc).rsplit(".", 1)[-1].lower() == "success"


def _device_pointer(ptr: int) -> int | None:
    """``cudaHostGetDevicePointer`` of a registered host address, or None when it cannot be asked."""
    try:
        from cuda.bindings import runtime  # noqa: PLC0415 - optional

        err, dptr = runtime.cudaHostGetDevicePointer(ptr, 0)
        return int(dptr) if int(err) == 0 else None
    except Exception:  # noqa: BLE001 - try the runtime library torch loaded
        pass
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        out = ctypes.c_void_p()
        if lib.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(ptr), 0) == 0:
            return int(out.value or 0)
        return None
    return None


def _allocate(nbytes: int) -> tuple[torch.Tensor, mmap.mmap]:
    """``nbytes`` bytes of page-aligned anonymous memory (mapping rounded up to whole pages)."""
    size = -(-nbytes // _OS_PAGE) * _OS_PAGE
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= _HUGEPAGE_MIN_BYTES and hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return torch.frombuffer(mm, dtype=torch.uint8, count=nbytes), mm


def _unregister(ptrs: list[int]) -> None:
    """Unregister every registration start in ``ptrs`` (idempotent: empties the list)."""
    if not ptrs:
        return
    try:
        cudart = torch.cuda.cudart()
    except Exception as exc:  # noqa: BLE001 - the runtime is gone (interpreter exit): nothing to undo
        logger.warning("host pool: cannot unregister %d registration(s): %s", len(ptrs), exc)
        ptrs.clear()
        return
    while ptrs:
        ptr = ptrs.pop()
        rc = cudart.cudaHostUnregister(ptr)
        if not _cuda_ok(rc):
            logger.warning("cudaHostUnregister(0x%x) failed: %s", ptr, rc)


class HostPool:
    """One host buffer of ``num_slots`` equally sized slots.

    Args:
        num_slots: number of slots (offloaded blocks), ``>= 1``.
        slot_bytes: bytes per slot, ``>= 1``; the buffer is exactly ``num_slots * slot_bytes`` bytes.
        device: the device whose KV cache the pool mirrors (the buffer itself is always host
            memory). A CUDA device *requires* a pinned pool: ``pin=False`` is an error and a
            failure to pin raises :class:`~kvoffload.errors.TransferError`.
        pin: True: page-lock or raise; False: pageable memory; None (default): pin when CUDA is
            available, else pageable with one warning per process.
        memory: memory to use instead of a fresh anonymous mapping: a shared mapping (an
            ``mmap.mmap`` of a ``/dev/shm`` file mapped by several processes). The pool then
            starts ``offset`` bytes into it and the whole mapping is page-locked; the mapping
            stays the caller's (never closed here). The pool ends where the mapping ends, so its
            last slot may be shorter than ``slot_bytes`` (a worker's area in a shared region
            whose rows hold every worker's records): it must cover at least one byte of it.
        offset: byte offset of slot 0 in ``memory``.

    Attributes:
        buffer: 1-D ``torch.uint8`` CPU tensor of ``num_slots * slot_bytes`` bytes, page aligned.
        mapped_bytes: bytes actually mapped (and registered): ``nbytes`` rounded up to the OS page.
        pinned: whether ``buffer`` is page-locked (registered with CUDA).
        num_slots, slot_bytes, nbytes, device: as given / derived.

    Raises:
        InvalidTypeError / InvalidArgumentError: bad sizes, a device that is neither CPU nor CUDA,
            ``pin=False`` for a CUDA device.
        BackendUnavailableError: pinning was required (``pin=True`` or a CUDA device) but CUDA
            is not available.
        TransferError: pinning was required and ``cudaHostRegister`` failed.
    """

    def __init__(
        self,
        num_slots: int,
        slot_bytes: int,
        device: torch.device | str = "cpu",
        pin: bool | None = None,
        memory: mmap.mmap | None = None,
        offset: int = 0,
    ) -> None:
        self.num_slots = check_int(num_slots, "num_slots", 1)
        self.slot_bytes = check_int(slot_bytes, "slot_bytes", 1)
        offset = check_int(offset, "offset", 0)
        if memory is not None and not isinstance(memory, mmap.mmap):
            raise InvalidTypeError(f"memory must be an mmap.mmap or None, got {type(memory).__name__}")
        if memory is None and offset:
            raise InvalidArgumentError("offset is only meaningful with memory")
        if memory is not None and len(memory) - offset <= (self.num_slots - 1) * self.slot_bytes:
            raise InvalidArgumentError(
                f"memory of {len(memory)} bytes from offset {offset} cannot hold {self.num_slots} slots "
                f"{self.slot_bytes} bytes apart"
            )
        if pin is not None:
            pin = check_bool(pin, "pin")
        if not isinstance(device, (torch.device, str)):
            raise InvalidTypeError(f"device must be a torch.device or str, got {type(device).__name__}")
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise InvalidArgumentError(f"device: cannot parse {device!r}: {exc}") from exc
        if dev.type not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"device must be a CPU or CUDA device, got {dev}")
        self.device = dev
        self.nbytes = self.num_slots * self.slot_bytes
        if memory is not None:
            self.nbytes = min(self.nbytes, len(memory) - offset)

        needs_pin = dev.type == "cuda"
        if needs_pin and pin is False:
            raise InvalidArgumentError(
                f"pin=False is not allowed for device {dev}: the GPU kernels need a pinned host pool"
            )
        cuda = torch.cuda.is_available()
        must_pin = needs_pin or pin is True
        if must_pin and not cuda:
            raise BackendUnavailableError(
                f"a pinned host pool was required ({'device ' + str(dev) if needs_pin else 'pin=True'}) "
                "but CUDA is not available"
            )
        want_pin = must_pin or (pin is None and cuda)

        self._registered: list[int] = []
        if memory is None:
            buf, self._mapping = _allocate(self.nbytes)
            whole = buf
        else:
            self._mapping = memory
            whole = torch.frombuffer(memory, dtype=torch.uint8)
            buf = whole[offset : offset + self.nbytes]
        self.mapped_bytes = len(self._mapping)
        self.pinned = False
        if want_pin:
            err = self._register(whole)
            if err is None:
                self.pinned = True
            elif must_pin:
                raise TransferError(f"cannot pin a host pool of {self.nbytes} bytes: {err}")
            else:
                _warn_pageable_once(f"pinning {self.nbytes} bytes failed ({err})")
        elif pin is None:
            _warn_pageable_once("CUDA is not available, nothing to pin")
        self._buffer: torch.Tensor | None = buf
        # Unregister even if the owner forgets shutdown(); holds the buffer, never self.
        self._finalizer = weakref.finalize(self, _release, self._registered, [buf, self._mapping])

    def _register(self, buf: torch.Tensor) -> str | None:
        """Page-lock the whole mapping behind ``buf`` in one call; on failure undo it and return why."""
        try:
            cudart = torch.cuda.cudart()
        except Exception as exc:  # noqa: BLE001 - no usable CUDA runtime
            return f"CUDA runtime unavailable: {exc}"
        ptr, size = buf.data_ptr(), self.mapped_bytes
        rc = cudart.cudaHostRegister(ptr, size, _REGISTER_FLAGS)
        if not _cuda_ok(rc):
            return f"cudaHostRegister(0x{ptr:x}, {size}) returned {rc}"
        self._registered.append(ptr)
        dptr = _device_pointer(ptr)
        if dptr is None:
            logger.debug("host pool: device pointer not checked (no cudaHostGetDevicePointer)")
        elif dptr != ptr:
            _unregister(self._registered)
            return (
                f"the pool at host 0x{ptr:x} maps to device address 0x{dptr:x}; the kernels need "
                "them equal (unified virtual addressing)"
            )
        return None

    @property
    def buffer(self) -> torch.Tensor:
        """The whole pool, a 1-D ``torch.uint8`` CPU tensor (raises after :meth:`shutdown`)."""
        if self._buffer is None:
            raise TransferError("the host pool has been shut down")
        return self._buffer

    @property
    def is_shutdown(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._buffer is None

    def _check_slot(self, slot: int) -> int:
        s = check_int(slot, "slot", 0)
        if s >= self.num_slots:
            raise InvalidArgumentError(f"slot must be < num_slots={self.num_slots}, got {s}")
        return s

    def records(self) -> Any:
        """The pool as a writable ``np.uint8`` array ``(num_slots, slot_bytes)``: row ``s`` is slot
        ``s`` (a view of :attr:`buffer`, no copy). This is what a secondary tier reads and writes
        (``kvoffload.tiers``); it must not be used after :meth:`shutdown`."""
        return self.buffer.numpy().reshape(self.num_slots, self.slot_bytes)

    def slot_offset(self, slot: int) -> int:
        """Byte offset of ``slot`` in :attr:`buffer` (``slot * slot_bytes``)."""
        return self._check_slot(slot) * self.slot_bytes

    def slot_view(self, slot: int) -> torch.Tensor:
        """The ``slot_bytes`` bytes of ``slot``: a view into :attr:`buffer` (writes go to the pool)."""
        off = self.slot_offset(slot)
        return self.buffer[off : off + self.slot_bytes]

    def shutdown(self) -> None:
        """Unregister the memory and drop the buffer. Idempotent. The caller must make sure no
        transfer still uses the pool (the transfer worker synchronises before calling this)."""
        self._buffer = None
        self._finalizer()

    def __repr__(self) -> str:
        state = "shut down" if self._buffer is None else ("pinned" if self.pinned else "pageable")
        return f"HostPool(num_slots={self.num_slots}, slot_bytes={self.slot_bytes}, {state})"


def _release(registered: list[int], holder: list[Any]) -> None:
    """Finalizer: unregister the memory, then let the buffer go."""
    try:
        _unregister(registered)
    finally:
        holder.clear()
