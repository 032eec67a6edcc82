"""NUMA placement of the host pool: put a memory range's pages on the node of the worker's GPU.

Pure Python + ``ctypes`` on Linux (x86_64, aarch64): the ``mbind``, ``get_mempolicy`` and
``move_pages`` system calls through ``libc.syscall`` (no libnuma), the GPU's node from sysfs
(``/sys/bus/pci/devices/<bus id>/numa_node``). Importing it initialises nothing (torch is imported,
and CUDA asked, only by :func:`device_numa_node`).

Private pool (an anonymous ``mmap``): call :func:`place_pool` over the whole mapping after the
``mmap`` and before its first touch and its ``cudaHostRegister`` (which faults every page in: a
page is placed when it is first faulted in, and a page-locked page cannot be moved afterwards).

Shared mapping (vLLM's shared offload region, a ``/dev/shm`` file mapped by several processes):
``mbind`` on a tmpfs mapping sets the *file's* shared policy for that range, seen by every process
mapping it; a page is placed by its first touch, in whichever process. Each worker binds its own
area of every row (:func:`own_ranges`) to its GPU's node before it touches or registers them, so
its rows land there whoever touches them later. Limits: the binding is page granular (areas that
share a page are not bound), one ``mbind`` per row splits the caller's mapping into one VMA per row
(at most :data:`MAX_BIND_RANGES`; ``vm.max_map_count`` is 65530 by default), and a worker that
registers whole rows (the host pool does when leaving the other areas out saves less than
:data:`~kvoffload.transfer.pin_plan.MIN_SAVED_BYTES_PER_ROW` a row) faults in the other workers'
areas: those not bound yet by their own worker are placed by that first touch. ``MPOL_MF_MOVE``
moves only pages mapped by this process alone, so pages another process already mapped stay where
they are.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, NumaError
from kvoffload.transfer.pin_plan import row_pages
from kvoffload.transfer.pinning import runtime_library

logger = logging.getLogger(__name__)

__all__ = [
    "numa_nodes",
    "pci_numa_node",
    "device_numa_node",
    "bind",
    "bound_node",
    "placement",
    "own_ranges",
    "place_pool",
]

PAGE = mmap.PAGESIZE
MPOL_DEFAULT, MPOL_PREFERRED = 0, 1
MPOL_MF_MOVE = 1 << 1
MPOL_F_ADDR = 1 << 1
_SYSCALLS = {  # (mbind, get_mempolicy, move_pages)
    "x86_64": (237, 239, 279),
    "aarch64": (235, 236, 239),  # asm-generic
}
_BATCH = 4096  # pages per move_pages call
_MASK_LONGS = 16  # 1024 nodes: get_mempolicy needs at least the kernel's nr_node_ids bits
_libc: Any = None


def _syscall(index: int, *args: Any) -> int:
    """System call ``index`` of :data:`_SYSCALLS` (0 mbind, 1 get_mempolicy, 2 move_pages): 0 or an errno."""
    global _libc
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return errno.ENOSYS
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = _libc.syscall(ctypes.c_long(numbers[index]), *args)
    return 0 if rc >= 0 else ctypes.get_errno() or errno.EINVAL


def _parse_list(text: str) -> list[int]:
    """A kernel list (``"0-3,8,10-11"``) as sorted ints."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def numa_nodes(sysfs: str | os.PathLike[str] = "/sys") -> list[int]:
    """The machine's online NUMA nodes (``<sysfs>/devices/system/node/online``), sorted; ``[]`` when
    the file is missing (a kernel without NUMA)."""
    try:
        return _parse_list((Path(sysfs) / "devices/system/node/online").read_text())
    except OSError:
        return []


def _mems_allowed() -> list[int] | None:
    """The nodes this process may allocate on (its cpuset's ``Mems_allowed_list``), or None if unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Mems_allowed_list:"):
                return _parse_list(line.split(":", 1)[1])
    except OSError:
        pass
    return None


def pci_numa_node(bus_id: str, sysfs: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node of the PCI device ``bus_id`` (``"0000:3b:00.0"``; upper case and an 8-digit
    domain, as ``cudaDeviceGetPCIBusId`` / ``nvidia-smi`` write it, are accepted) from
    ``<sysfs>/bus/pci/devices/<dddd:bb:dd.f>/numa_node``; None when the file is missing or holds -1
    (no node known, the usual single-node case). A malformed ``bus_id`` is an InvalidArgumentError."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        dev, func = rest.split(".")
        name = f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(func, 16):x}"
    except (AttributeError, ValueError) as exc:
        raise InvalidArgumentError(f"bus_id must be a PCI address like '0000:3b:00.0', got {bus_id!r}") from exc
    try:
        node = int((Path(sysfs) / "bus/pci/devices" / name / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _cuda_bus_id(index: int) -> str | None:
    """The PCI bus id of CUDA device ``index``: from torch's device properties where it has them,
    else ``cudaDeviceGetPCIBusId`` of the runtime library torch loaded; None when neither answers."""
    import torch  # noqa: PLC0415 - only when a CUDA device is asked about

    props = torch.cuda.get_device_properties(index)
    ids = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if all(isinstance(v, int) for v in ids):
        return f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0"
    lib = runtime_library()
    if lib is None:
        return None
    out = ctypes.create_string_buffer(64)
    if lib.cudaDeviceGetPCIBusId(out, ctypes.c_int(64), ctypes.c_int(index)) == 0:
        return out.value.decode()
    return None


def device_numa_node(device: Any, sysfs: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node of ``device`` (a ``torch.device``, ``"cuda:1"`` or a CUDA index): None for a
    CPU device or when no node is known (no bus id, sysfs ``-1`` or missing). Asks CUDA for the
    device's properties (initialises CUDA in this process)."""
    import torch  # noqa: PLC0415

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"device: cannot parse {device!r}: {exc}") from exc
    if dev.type != "cuda":
        return None
    bus_id = _cuda_bus_id(torch.cuda.current_device() if dev.index is None else dev.index)
    return None if bus_id is None else pci_numa_node(bus_id, sysfs)


def _check_range(address: int, length: int) -> tuple[int, int]:
    address = check_int(address, "address", 0)
    length = check_int(length, "length", 1)
    if address % PAGE:
        raise InvalidArgumentError(f"address must be aligned to the {PAGE}-byte page, got 0x{address:x}")
    return address, length


def bind(address: int, length: int, node: int) -> None:
    """Prefer NUMA node ``node`` for the pages of ``[address, address + length)`` (``address`` page
    aligned, the length rounded up to whole pages): ``mbind(MPOL_PREFERRED, MPOL_MF_MOVE)``.

    PREFERRED, not BIND: a pool must not fail to fault in (SIGBUS / the OOM killer under
    ``MPOL_BIND``) because its node is full; it spills to other nodes instead, and
    :func:`placement` shows where pages went. Pages not yet touched are placed on ``node`` when
    first touched; ``MPOL_MF_MOVE`` moves pages already touched that this process alone maps
    (page-locked pages cannot move: bind before ``cudaHostRegister``). Not ``MPOL_MF_STRICT``: a page
    that cannot move is left in place, not an error.

    Raises:
        InvalidTypeError / InvalidArgumentError: a bad ``address`` (negative, not page aligned),
            ``length`` (< 1) or ``node`` (not an online node, or outside this process's cpuset),
            naming the argument; nothing is changed.
        NumaError: the system call failed (an ``OSError`` with its ``errno``: ``EFAULT`` for an
            unmapped range, ``ENOSYS`` without NUMA support, ``EPERM`` under seccomp).
    """
    address, length = _check_range(address, length)
    node = check_int(node, "node", 0)
    online = numa_nodes()
    if online and node not in online:
        raise InvalidArgumentError(f"node must be an online NUMA node {online}, got {node}")
    allowed = _mems_allowed()
    if allowed is not None and node not in allowed:
        raise InvalidArgumentError(f"node {node} is not allowed to this process (Mems_allowed_list {allowed})")
    mask = (ctypes.c_ulong * (node // 64 + 1))()
    mask[node // 64] = 1 << (node % 64)
    err = _syscall(
        0,
        *(ctypes.c_void_p(address), ctypes.c_ulong(length), ctypes.c_int(MPOL_PREFERRED), mask),
        *(ctypes.c_ulong(64 * len(mask) + 1), ctypes.c_uint(MPOL_MF_MOVE)),
    )
    if err:
        raise NumaError(err, f"mbind(0x{address:x}, {length}, node {node}) failed: {os.strerror(err)}")


def bound_node(address: int) -> int | None:
    """The node the memory policy of the mapping at ``address`` prefers or binds to (the lowest
    one if several), None for the default policy (first touch on the touching CPU's node).

    Raises:
        NumaError: ``get_mempolicy`` failed (``EFAULT``: ``address`` is not mapped).
    """
    address = check_int(address, "address", 0)
    mode, mask = ctypes.c_int(), (ctypes.c_ulong * _MASK_LONGS)()
    err = _syscall(
        1,
        *(ctypes.byref(mode), mask, ctypes.c_ulong(64 * _MASK_LONGS + 1)),
        *(ctypes.c_void_p(address), ctypes.c_ulong(MPOL_F_ADDR)),
    )
    if err:
        raise NumaError(err, f"get_mempolicy(0x{address:x}) failed: {os.strerror(err)}")
    if mode.value & 0xFF == MPOL_DEFAULT:
        return None
    nodes = [64 * i + b for i, word in enumerate(mask) for b in range(64) if word >> b & 1]
    return nodes[0] if nodes else None


def placement(address: int, length: int) -> dict[int, int]:
    """Where the pages of ``[address, address + length)`` are: ``{node: pages}``, read with
    ``move_pages(0, pages, NULL, status)`` (nothing moves, nothing is faulted in). ``address`` is
    rounded down and the end up to whole pages. Negative keys count pages with no node, as
    ``-errno``: ``-ENOENT`` (-2) not faulted in yet *through this mapping* (a shared page another
    mapping or process faulted in counts here until this mapping touches it), ``-EFAULT`` (-14) not
    mapped.

    Raises:
        NumaError: ``move_pages`` failed as a whole (``ENOSYS``, ``EPERM``).
    """
    address, length = check_int(address, "address", 0), check_int(length, "length", 1)
    first, end = address - address % PAGE, address + length
    counts: dict[int, int] = {}
    for start in range(first, end, _BATCH * PAGE):
        n = min(_BATCH, -(-(end - start) // PAGE))
        pages = (ctypes.c_void_p * n)(*range(start, start + n * PAGE, PAGE))
        status = (ctypes.c_int * n)()
        err = _syscall(2, ctypes.c_int(0), ctypes.c_ulong(n), pages, None, status, ctypes.c_int(0))
        if err:
            raise NumaError(err, f"move_pages(0x{start:x}, {n} pages) failed: {os.strerror(err)}")
        for s in status:
            counts[s] = counts.get(s, 0) + 1
    return counts


#: Most ranges :func:`own_ranges` binds one by one (each splits the caller's mapping into its own
#: VMA, bounded by ``vm.max_map_count``, 65530 by default).
MAX_BIND_RANGES = 16384


def own_ranges(base: int, num_rows: int, stride: int, used: int, end: int) -> list[tuple[int, int]]:
    """The page-aligned ``(address, length)`` ranges a pool's user touches: ``num_rows`` rows
    ``stride`` bytes apart from ``base``, the first ``used`` bytes of each (up to ``end``).

    One range when the rows are contiguous (``used == stride``); else each row's area rounded out
    to whole pages, or none (logged) when two rows' areas would share a page (the rows' other
    bytes are less than a page: another process's area there could not get its own node) or there
    are more than :data:`MAX_BIND_RANGES` rows.
    """
    lo = base - base % PAGE
    if used >= stride:
        return [(lo, -(-end // PAGE) * PAGE - lo)]
    if stride - used < PAGE:
        logger.debug("host pool: rows %d bytes apart use %d: areas share pages, not bound", stride, used)
        return []
    if num_rows > MAX_BIND_RANGES:
        logger.warning(
            "host pool: %d rows hold other processes' areas; binding each to a NUMA node would take more than "
            "%d ranges: pages placed by first touch",
            num_rows,
            MAX_BIND_RANGES,
        )
        return []
    starts, sizes = row_pages(base, num_rows, stride, used, end, PAGE)
    return list(zip(starts.tolist(), sizes.tolist(), strict=True))


def place_pool(ranges: Sequence[tuple[int, int]], device: Any, numa: bool | int | None = None) -> int | None:
    """Place a host pool's pages on a NUMA node before their first touch; returns the node bound, or
    None when nothing was done. ``ranges``: ``(address, length)`` of the page-aligned ranges the
    pool's user touches (the whole mapping of a private pool; each row's own area in a shared
    region). Call it once, after the ``mmap`` and before the pool is touched or registered
    (``cudaHostRegister``); see the module docstring for a shared mapping.

    ``numa``: None (default) -- the node of ``device`` when one is known, else nothing (logged at
    debug), and a refused system call (``ENOSYS``, ``EPERM``) is logged at debug, not raised;
    True -- the node of ``device``, and an unknown node is an InvalidArgumentError; False -- do
    nothing; an int -- that node. A bad range is an error whatever ``numa`` is (all are checked
    before any is bound); errors of :func:`bind` propagate except as said for None.
    """
    for address, length in ranges:
        _check_range(address, length)
    if numa is False or not ranges:
        return None
    if numa is not None and numa is not True:
        node = check_int(numa, "numa", 0)
    else:
        found = device_numa_node(device)
        if found is None:
            if numa is True:
                raise InvalidArgumentError(
                    f"numa=True but the NUMA node of device {device} is not known (no PCI bus id, or sysfs "
                    "numa_node is -1 or missing): give the node as numa=<int>, or numa=None"
                )
            logger.debug("host pool: no NUMA node known for device %s; pages placed by first touch", device)
            return None
        node = found
        allowed = _mems_allowed()
        usable = [n for n in numa_nodes() if allowed is None or n in allowed]
        if numa is None and node not in usable:
            logger.debug("host pool: NUMA node %d of device %s is not usable here (%s)", node, device, usable)
            return None
    try:
        for address, length in ranges:
            bind(address, length, node)
    except NumaError as exc:
        if numa is None and exc.errno in (errno.ENOSYS, errno.EPERM):
            logger.debug("host pool: NUMA binding refused (%s); pages placed by first touch", exc)
            return None
        raise
    logger.debug("host pool: %d range(s) from 0x%x prefer NUMA node %d", len(ranges), ranges[0][0], node)
    return node
