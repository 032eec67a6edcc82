"""File I/O of the disk tier: the O_DIRECT probe, the two file layouts, whole-value reads and writes.

A value file holds one value (header + payload, :mod:`kvoffload.tiers.record`) in one of two
layouts, told apart by the file's size (they never coincide: a header is under 4 KiB):

* **packed** (buffered I/O): the header, then the payload; ``header + record`` bytes.
* **paged** (O_DIRECT): the header zero-padded to one :data:`ALIGN` page, then the payload
  zero-padded to a whole page; ``ALIGN + round_up(record)`` bytes. The payload starts on a
  page, so with page-aligned host records (the host pool's are) it moves straight between the
  record and the disk with one ``pwritev`` / ``preadv``, no bounce copy.

Both are written with vectored I/O from the header and the record itself; only O_DIRECT with a
record that is not page aligned (address or length) goes through the thread's aligned bounce
buffer. A reader accepts either layout whatever its own mode, and checks the padding is zero,
so every byte of a file is checked.
"""

from __future__ import annotations

import errno
import mmap
import os
import socket
import threading
import time

import numpy as np

from kvoffload.tiers.record import ValueRejected

__all__ = [
    "ALIGN",
    "file_bytes",
    "probe_o_direct",
    "BounceBuffers",
    "is_page_aligned",
    "write_value",
    "open_value",
    "read_value",
    "unlink_if_same",
    "temp_name",
    "is_stale_temp",
]

#: Alignment of O_DIRECT buffers and lengths.
ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_HOST = socket.gethostname().replace("-", "_")
#: Temporary files older than this are removed at start whoever wrote them.
STALE_TEMP_SECONDS = 3600.0


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def file_bytes(header_bytes: int, record_bytes: int, o_direct: bool) -> int:
    """Size of a value file: the paged layout when written with O_DIRECT, else the packed one."""
    return ALIGN + _round_up(record_bytes) if o_direct else header_bytes + record_bytes


def probe_o_direct(directory: str) -> bool:
    """Whether ``directory``'s filesystem accepts an aligned O_DIRECT write (tmpfs and overlayfs do not)."""
    if not _O_DIRECT:
        return False
    path = os.path.join(directory, temp_name())
    buf = mmap.mmap(-1, ALIGN)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    try:
        os.write(fd, buf)
        return True
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
        os.unlink(path)
        buf.close()


def temp_name() -> str:
    """A fresh temporary file name: ``.tmp-<host>-<pid>-<random>`` (never matches a value name)."""
    return f".tmp-{_HOST}-{os.getpid()}-{os.urandom(6).hex()}"


def is_stale_temp(name: str, mtime: float) -> bool:
    """Whether temporary file ``name`` was left by a dead process on this host, or is very old."""
    parts = name.split("-")
    if time.time() - mtime > STALE_TEMP_SECONDS:
        return True
    if len(parts) != 4 or parts[1] != _HOST or not parts[2].isdigit():
        return False
    pid = int(parts[2])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class BounceBuffers:
    """One page-aligned buffer per thread: a header page, then room for a page-rounded record."""

    def __init__(self, record_bytes: int) -> None:
        self.record_bytes = record_bytes
        self.size = ALIGN + _round_up(record_bytes)
        self._local = threading.local()

    def get(self) -> np.ndarray:
        """This thread's buffer as a uint8 array."""
        arr = getattr(self._local, "arr", None)
        if arr is None:
            self._local.mm = mmap.mmap(-1, self.size)
            arr = self._local.arr = np.frombuffer(self._local.mm, dtype=np.uint8)
        return arr


def is_page_aligned(records: np.ndarray) -> bool:
    """Whether every row of ``records`` starts on a page and is whole pages long (O_DIRECT in place)."""
    return records.shape[1] % ALIGN == 0 and records.ctypes.data % ALIGN == 0


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """``views`` without their first ``n`` bytes."""
    i = 0
    while i < len(views) and n >= len(views[i]):
        n -= len(views[i])
        i += 1
    rest = views[i:]
    if rest and n:
        rest[0] = rest[0][n:]
    return rest


def _write_all(fd: int, views: list[memoryview]) -> None:
    off = 0
    while views:
        n = os.pwritev(fd, views, off)
        off += n
        views = _advance(views, n)


def _read_all(fd: int, views: list[memoryview], want: int) -> None:
    """Fill ``views`` from offset 0 until ``want`` bytes are read; ValueRejected if the file ends first."""
    got = 0
    while got < want:
        n = os.preadv(fd, views, got)
        if n == 0:
            raise ValueRejected("truncated")
        got += n
        views = _advance(views, n)


def write_value(
    final: str, header: bytes, payload: np.ndarray, bufs: BounceBuffers, o_direct: bool, in_place: bool
) -> None:
    """Write the value ``header + payload`` to ``final`` atomically: a temp file, then rename.

    ``o_direct`` writes the paged layout with O_DIRECT (``in_place``: ``payload`` is page aligned
    and written from where it is), else the packed layout with buffered I/O. A failure removes the
    temporary file and raises the ``OSError``.
    """
    hb = len(header)
    if o_direct:
        buf = bufs.get()
        buf[:hb] = np.frombuffer(header, dtype=np.uint8)
        buf[hb:ALIGN] = 0
        if in_place:
            views = [buf.data[:ALIGN], payload.data]
        else:
            end = ALIGN + payload.size
            buf[ALIGN:end] = payload
            buf[end:] = 0
            views = [buf.data]
    else:
        views = [memoryview(header), payload.data]
    tmp = os.path.join(os.path.dirname(final), temp_name())
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if o_direct else 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        try:
            _write_all(fd, views)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def open_value(path: str, o_direct: bool) -> int:
    """A read-only file descriptor of the value file at ``path`` (the caller closes it);
    ``FileNotFoundError`` when there is none."""
    return os.open(path, os.O_RDONLY | (_O_DIRECT if o_direct else 0))


def read_value(
    fd: int, header_bytes: int, row: np.ndarray, bufs: BounceBuffers, o_direct: bool, in_place: bool
) -> tuple[memoryview, memoryview | None]:
    """Read the value file open as ``fd`` (either layout; ``o_direct``: opened with O_DIRECT):
    its header, and its payload unless in ``row``.

    The payload is read straight into ``row`` (the destination record; then ``None`` is returned
    for it) when the layout and mode allow, else into this thread's bounce buffer, returned for
    the caller to copy after checking. Nothing is checked but the layout. Raises
    :class:`ValueRejected` for a file of neither layout's size, that ends early, or whose padding
    is not zero; ``OSError`` as it comes.
    """
    rb = row.size
    buf = bufs.get()
    size = os.fstat(fd).st_size
    if size == ALIGN + _round_up(rb):  # paged
        end = ALIGN + rb
        if o_direct and not in_place:
            views, payload = [buf.data[:size]], buf.data[ALIGN:end]
        else:
            views, payload = [buf.data[:ALIGN], row.data], None
            if size > end:
                views.append(buf.data[end:size])
        _read_all(fd, views, size)
        if buf[header_bytes:ALIGN].any() or buf[end:size].any():
            raise ValueRejected("padding")
        return buf.data[:header_bytes], payload
    if size == header_bytes + rb:  # packed
        if o_direct:  # aligned reads only: the whole file into the bounce buffer
            _read_all(fd, [buf.data[: _round_up(size)]], size)
            return buf.data[:header_bytes], buf.data[header_bytes:size]
        _read_all(fd, [buf.data[:header_bytes], row.data], size)
        return buf.data[:header_bytes], None
    raise ValueRejected("truncated" if size < header_bytes + rb else "length")


def unlink_if_same(path: str, fd: int) -> bool:
    """Delete the file at ``path`` if it is the file open as ``fd``; True when deleted.

    Another process sharing the directory may have replaced it since it was opened (a new value
    renamed over it): that file is kept. The file is first renamed to a temporary name, so the
    check and the deletion see the same file; one found not to be ``fd``'s (same device and inode,
    which cannot be reused while ``fd`` is open) is renamed back. ``OSError`` as it comes.
    """
    mine = os.fstat(fd)
    tmp = os.path.join(os.path.dirname(path), temp_name())
    try:
        os.rename(path, tmp)
    except FileNotFoundError:  # removed meanwhile
        return False
    moved = os.stat(tmp)
    if (moved.st_dev, moved.st_ino) == (mine.st_dev, mine.st_ino):
        os.unlink(tmp)
        return True
    os.replace(tmp, path)  # another writer's value of the same key: back where it was
    return False
