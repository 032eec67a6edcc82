"""File I/O of the disk tier: the O_DIRECT probe, aligned bounce buffers, whole-value reads and writes."""

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
    "write_value",
    "read_value",
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


def file_bytes(value_bytes: int, o_direct: bool) -> int:
    """Size of the file holding a value of ``value_bytes`` (O_DIRECT files are padded to :data:`ALIGN`)."""
    return _round_up(value_bytes) if o_direct else value_bytes


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
    """One page-aligned buffer per thread, large enough for the biggest value (O_DIRECT needs alignment)."""

    def __init__(self, max_value_bytes: int) -> None:
        self.size = _round_up(max_value_bytes)
        self._local = threading.local()

    def get(self) -> np.ndarray:
        """This thread's buffer as a uint8 array."""
        arr = getattr(self._local, "arr", None)
        if arr is None:
            self._local.mm = mmap.mmap(-1, self.size)
            arr = self._local.arr = np.frombuffer(self._local.mm, dtype=np.uint8)
        return arr


def write_value(final: str, header: bytes, payload: np.ndarray, buf: np.ndarray, o_direct: bool) -> None:
    """Write ``header + payload`` to ``final`` atomically: a temp file in its directory, then rename.

    With ``o_direct`` the file is the value zero-padded to a multiple of :data:`ALIGN` (readers
    take the value's length from what they expect: :func:`file_bytes`).
    A failure removes the temporary file and raises the ``OSError``.
    """
    n = len(header) + payload.size
    buf[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    buf[len(header) : n] = payload
    tmp = os.path.join(os.path.dirname(final), temp_name())
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if o_direct else 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        try:
            length = _round_up(n) if o_direct else n
            view = buf.data[:length]
            done = 0
            while done < length:
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_value(path: str, buf: np.ndarray, o_direct: bool) -> memoryview:
    """The whole file at ``path`` read into ``buf`` (a view of its first ``size`` bytes).

    Raises :class:`ValueRejected` for a file longer than ``buf`` (no valid value is).
    """
    fd = os.open(path, os.O_RDONLY | (_O_DIRECT if o_direct else 0))
    try:
        size = os.fstat(fd).st_size
        if size > buf.size:
            raise ValueRejected("length")
        length = _round_up(size) if o_direct else size
        view = buf.data[:length]
        done = 0
        while done < size:
            got = os.readv(fd, [view[done:]])
            if got == 0:
                break
            done += got
        return buf.data[: min(done, size)]
    finally:
        os.close(fd)
