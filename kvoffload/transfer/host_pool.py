"""The host pool: one page-locked CPU buffer holding ``num_slots`` offloaded blocks.

Layout (docs/contract.md §4)::

    buffer: 1-D torch.uint8, exactly num_slots * slot_bytes bytes
    slot s  = buffer[s * slot_bytes : (s + 1) * slot_bytes]
            = block_size_factor GPU-block *records* back to back (a record = every page of its
              KV-cache group, packed), zero-padded up to slot_bytes for the smaller groups

The bytes come from an anonymous ``mmap`` (page aligned, the size rounded up to whole OS pages;
no power-of-two rounding, which ``torch.empty(..., pin_memory=True)`` does through its caching
host allocator; transparent huge pages requested for large pools), or from a caller's shared
mapping, and are page-locked with ``cudaHostRegister`` in place, so a pool of hundreds of GiB
does not double its footprint.

Registrations (:mod:`kvoffload.transfer.pin_plan`): only the rows the pool's user touches, in
row-aligned chunks of at most ``max_register_bytes`` (64 GiB by default: one registration of
>= 512 GiB fails). In a shared region whose rows also hold other workers' areas (``used_bytes <
slot_bytes``), each row's used range alone, rounded out to pages, when that saves at least
``max(OS page, 3 MiB)`` per row; else whole rows. The copy engines (``cudaMemcpyAsync``,
``cuMemcpyBatchAsync``) refuse a host range that crosses from one registration into the next
(``cudaErrorInvalidValue``, measured on an H100, CUDA 13.0): no record straddles two
registrations, and the data paths split their coalesced copies at :attr:`HostPool.copy_cuts`.
The kernels address the pool by its host pointer (unified virtual addressing), so the first
registration's device pointer is checked to equal its host pointer (``cudaHostGetDevicePointer``,
when ``cuda.bindings`` or the CUDA runtime library can be reached); a mismatch is an error.

Pinning policy:

* a CUDA device needs a pinned pool: ``pin=False`` is an error, and a failed registration undoes
  every registration of the pool and raises :class:`~kvoffload.errors.TransferError` naming the
  size -- never a pageable fallback;
* ``pin=True``: the same for a CPU device (CUDA must be available);
* ``pin=None`` with a CPU device: pin when CUDA is available; a failure undoes every registration
  and logs a WARNING naming the size and the reason, for every such pool, and the pool stays
  pageable (the KV cache is on the CPU: nothing needs the pool pinned). Without CUDA there is
  nothing to pin: pageable, with ONE warning per process.

``background=True`` (the transfer worker's choice) takes pinning off the start-up path for a pool
that must be pinned: the constructor registers the first chunk and returns; a daemon thread
registers the rest in ascending order (:mod:`kvoffload.transfer.pinning`). Rows ``[0,``
:attr:`HostPool.ready_rows` ``)`` are usable by the device; :meth:`HostPool.wait_rows` blocks
for more. A failure on that thread is raised by :meth:`HostPool.check_pinning` and
:meth:`HostPool.wait_rows` from then on; the owner undoes the registrations with
:meth:`HostPool.unpin` once no transfer uses the pool (they may be in use when it fails).
:meth:`HostPool.shutdown` stops the thread and unregisters everything.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
import weakref
from typing import Any

import numpy as np
import torch

from kvoffload.checks import check_bool, check_int
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError, TransferError
from kvoffload.transfer import numa as numa_placement
from kvoffload.transfer import pin_plan
from kvoffload.transfer.pinning import Pinning, runtime_library

logger = logging.getLogger(__name__)

__all__ = ["HostPool"]

_OS_PAGE = mmap.PAGESIZE
_HUGEPAGE_MIN_BYTES = 1 << 30
_NO_CUTS = np.zeros(0, dtype=np.int64)

_warned_pageable = False
_warn_lock = threading.Lock()


def _warn_pageable_once(reason: str) -> None:
    global _warned_pageable
    with _warn_lock:
        if _warned_pageable:
            return
        _warned_pageable = True
    logger.warning("kvoffload host pool: %s; using pageable host memory (transfers will be slower)", reason)


def _device_pointer(ptr: int) -> int | None:
    """``cudaHostGetDevicePointer`` of a registered host address, or None when it cannot be asked."""
    try:
        from cuda.bindings import runtime  # noqa: PLC0415 - optional

        err, dptr = runtime.cudaHostGetDevicePointer(ptr, 0)
        return int(dptr) if int(err) == 0 else None
    except Exception:  # noqa: BLE001 - try the runtime library torch loaded
        pass
    lib = runtime_library()
    if lib is None:
        return None
    out = ctypes.c_void_p()
    if lib.cudaHostGetDevicePointer(ctypes.byref(out), ctypes.c_void_p(ptr), 0) == 0:
        return int(out.value or 0)
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


class HostPool:
    """One host buffer of ``num_slots`` equally sized slots (see the module docstring for how it
    is page-locked).

    Args:
        num_slots: number of slots (offloaded blocks), ``>= 1``.
        slot_bytes: bytes from one slot to the next, ``>= 1``; the buffer is exactly
            ``num_slots * slot_bytes`` bytes.
        device: the device whose KV cache the pool mirrors (the buffer itself is always host
            memory). A CUDA device *requires* a pinned pool: ``pin=False`` is an error and a
            failure to pin raises :class:`~kvoffload.errors.TransferError`.
        pin: True: page-lock or raise; False: pageable memory; None (default): as the device
            requires, else (CPU device) pin when CUDA is available, pageable with a warning if
            that fails.
        memory: memory to use instead of a fresh anonymous mapping: a shared mapping (an
            ``mmap.mmap`` of a ``/dev/shm`` file mapped by several processes). The pool then
            starts ``offset`` bytes into it; the mapping stays the caller's (never closed
            here). The pool ends where the mapping ends, so its last slot may be shorter than
            ``slot_bytes`` (a worker's area in a shared region whose rows hold every worker's
            records): it must cover at least one byte of it.
        offset: byte offset of slot 0 in ``memory``.
        used_bytes: bytes at the start of each slot that transfers touch (default: all of
            ``slot_bytes``); only those are page-locked when that saves enough (module docstring).
        max_register_bytes: largest ``cudaHostRegister`` call (default:
            :data:`~kvoffload.transfer.pin_plan.MAX_REGISTER_BYTES`); chunks are row aligned, so
            one exceeds it only where no page-aligned row boundary lies within it.
        background: for a pool that must be pinned, register the first chunk now and the rest on
            a background thread (see :meth:`wait_rows`); False: everything before returning.
        numa: NUMA placement of the pages the pool uses, before they are first touched or
            registered (:func:`~kvoffload.transfer.numa.place_pool`): None (default) -- the node of
            ``device`` where one is known, else first touch places them; True -- that node or an
            error; False -- not placed; an int -- that node. In a shared mapping only this pool's
            area of each row is placed (:func:`~kvoffload.transfer.numa.own_ranges`).

    Attributes:
        buffer: 1-D ``torch.uint8`` CPU tensor of ``num_slots * slot_bytes`` bytes, page aligned.
        mapped_bytes: bytes of the mapping behind the pool.
        pinned: whether the pool is page-locked, or being page-locked in the background (then
            only rows below :attr:`ready_rows` are registered yet).
        plan: the :class:`~kvoffload.transfer.pin_plan.RegisterPlan`, or None when pageable.
        numa_node: the NUMA node the pool's pages prefer, or None when not placed.
        num_slots, slot_bytes, used_bytes, nbytes, device: as given / derived.

    Raises:
        InvalidTypeError / InvalidArgumentError: bad sizes, a device that is neither CPU nor CUDA,
            ``pin=False`` for a CUDA device. Nothing is allocated before they are checked.
        BackendUnavailableError: pinning was required (``pin=True`` or a CUDA device) but CUDA
            is not available.
        TransferError: pinning was required and a registration failed (all undone).
    """

    def __init__(
        self,
        num_slots: int,
        slot_bytes: int,
        device: torch.device | str = "cpu",
        pin: bool | None = None,
        memory: mmap.mmap | None = None,
        offset: int = 0,
        used_bytes: int | None = None,
        max_register_bytes: int | None = None,
        background: bool = False,
        numa: bool | int | None = None,
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
        self.used_bytes = self.slot_bytes if used_bytes is None else check_int(used_bytes, "used_bytes", 1)
        if self.used_bytes > self.slot_bytes:
            raise InvalidArgumentError(f"used_bytes must be <= slot_bytes={self.slot_bytes}, got {self.used_bytes}")
        if max_register_bytes is None:
            max_register_bytes = pin_plan.MAX_REGISTER_BYTES
        self._max_register = check_int(max_register_bytes, "max_register_bytes", 1)
        background = check_bool(background, "background")
        if numa is not None and not isinstance(numa, bool):
            check_int(numa, "numa", 0)
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

        if memory is None:
            buf, self._mapping = _allocate(self.nbytes)
        else:
            self._mapping = memory
            buf = torch.frombuffer(memory, dtype=torch.uint8)[offset : offset + self.nbytes]
        self.mapped_bytes = len(self._mapping)
        base = buf.data_ptr()
        ranges = (
            [(base, self.mapped_bytes)]
            if memory is None
            else numa_placement.own_ranges(base, self.num_slots, self.slot_bytes, self.used_bytes, base + self.nbytes)
        )
        self.numa_node = numa_placement.place_pool(ranges, dev, numa)  # before the first touch
        self.pinned = False
        self.plan: pin_plan.RegisterPlan | None = None
        self._pinning: Pinning | None = None
        self._buffer: torch.Tensor | None = buf
        # Unregister even if the owner forgets shutdown(); holds the buffer and the pinning, never self.
        self._holder: list[Any] = [buf, self._mapping, None]
        self._finalizer = weakref.finalize(self, _release, self._holder)
        if want_pin:
            try:
                self._pin(buf, background and must_pin)
            except TransferError as exc:
                if must_pin:
                    self.shutdown()
                    raise
                logger.warning("host pool of %d bytes (device %s) stays pageable: %s", self.nbytes, dev, exc)
        elif pin is None:
            _warn_pageable_once("CUDA is not available, nothing to pin")

    def _pin(self, buf: torch.Tensor, background: bool) -> None:
        """Page-lock the pool: the first chunk (``background``) or all of it now, the rest on a thread.

        Raises:
            TransferError: a registration failed, or the pool's device address is not its host
                address; nothing stays registered.
        """
        try:
            cudart = torch.cuda.cudart()
        except Exception as exc:  # noqa: BLE001 - no usable CUDA runtime
            raise TransferError(f"cannot page-lock a host pool of {self.nbytes} bytes: no CUDA runtime: {exc}") from exc
        base = buf.data_ptr()
        plan = pin_plan.plan_registrations(
            base, self.num_slots, self.slot_bytes, self.used_bytes, base + self.nbytes, self._max_register
        )
        device = None
        if background and len(plan) > plan.first_chunk:
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            device = torch.cuda.device(index)  # made current on the pinning thread
        pinning = Pinning(
            plan,
            cudart,
            device,
            what=f"a host pool of {self.nbytes} bytes ({self.num_slots} slots x {self.slot_bytes})",
        )
        self._holder[2] = pinning
        pinning.register_now(plan.first_chunk if background else None)
        ptr = int(plan.starts[0])
        dptr = _device_pointer(ptr)
        if dptr is None:
            logger.debug("host pool: device pointer not checked (no cudaHostGetDevicePointer)")
        elif dptr != ptr:
            pinning.unregister()
            raise TransferError(
                f"cannot use a pinned host pool of {self.nbytes} bytes: host 0x{ptr:x} maps to device address "
                f"0x{dptr:x}; the kernels need them equal (unified virtual addressing)"
            )
        self.plan, self._pinning, self.pinned = plan, pinning, True
        if pinning.done:
            logger.debug("host pool: %s page-locked", plan.describe())
            return
        logger.info(
            "host pool: %s; first %d bytes page-locked, the rest in the background",
            plan.describe(),
            pinning.registered_bytes,
        )
        pinning.start()

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

    # ------------------------------------------------------------------ pinning progress
    @property
    def copy_cuts(self) -> np.ndarray:
        """Sorted ``int64`` byte offsets into :attr:`buffer` that no copy-engine copy may run
        across (one registration ends, the next begins); empty when there is none."""
        return self.plan.cuts if self.plan is not None else _NO_CUTS

    @property
    def ready_rows(self) -> int:
        """Slots ``[0, ready_rows)`` may be used by a transfer now: all of them, unless background
        pinning is still under way (or failed: see :meth:`check_pinning`)."""
        return self.num_slots if self._pinning is None else self._pinning.rows

    @property
    def pinning_done(self) -> bool:
        """No registration is pending: the pool is pageable or wholly page-locked."""
        return self._pinning is None or self._pinning.done

    def check_pinning(self) -> int:
        """:attr:`ready_rows`.

        Raises:
            TransferError: background pinning failed (every call from then on).
        """
        return self.num_slots if self._pinning is None else self._pinning.check()

    def wait_rows(self, rows: int, timeout: float | None = None) -> bool:
        """Block until slots ``[0, rows)`` are registered; False if ``timeout`` seconds passed first.

        Raises:
            InvalidArgumentError / InvalidTypeError: ``rows`` not an int in ``[0, num_slots]``.
            TransferError: background pinning failed or was stopped before they were registered.
        """
        rows = check_int(rows, "rows", 0)
        if rows > self.num_slots:
            raise InvalidArgumentError(f"rows must be <= num_slots={self.num_slots}, got {rows}")
        if self._pinning is None:
            return True
        if self._pinning.check() >= rows:
            return True
        return self._pinning.wait_rows(rows, timeout)

    def unpin(self) -> None:
        """Stop background pinning and undo every registration; the pool is pageable from then on
        (:meth:`check_pinning` still raises a background failure). For the owner after a
        background failure, once no transfer uses the pool. Idempotent."""
        if self._pinning is not None:
            self._pinning.unregister()
        self.pinned = False

    # ------------------------------------------------------------------ slots
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
        """Stop background pinning (waiting for the registration in progress), unregister the
        memory and drop the buffer. Idempotent. The caller must make sure no transfer still uses
        the pool (the transfer worker synchronises before calling this)."""
        self._buffer = None
        self.pinned = False
        self._finalizer()

    def __repr__(self) -> str:
        if self._buffer is None:
            state = "shut down"
        elif not self.pinned:
            state = "pageable"
        else:
            state = "pinned" if self.pinning_done else f"pinning, {self.ready_rows} rows ready"
        return f"HostPool(num_slots={self.num_slots}, slot_bytes={self.slot_bytes}, {state})"


def _release(holder: list[Any]) -> None:
    """Finalizer: stop pinning and unregister the memory, then let the buffer go."""
    try:
        pinning = holder[2]
        if pinning is not None:
            pinning.unregister()
    finally:
        holder.clear()
