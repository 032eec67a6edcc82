"""The disk tier's in-memory index: value files by file id, their sizes and (when known) the key
each holds, least recently used first."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from kvoffload.tiers.disk.io import is_stale_temp

__all__ = ["DiskIndex", "VALUE_SUFFIX"]

#: Suffix of value files (temporary files start with ".tmp-" and never carry it).
VALUE_SUFFIX = ".kv"


class DiskIndex:
    """Which file ids have value files, their sizes in bytes, their keys (``None`` for a file found
    by the start-up scan and not used since) and their recency (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: OrderedDict[bytes, tuple[int, bytes | None]] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, key: bytes) -> bool:
        return key in self._sizes

    def add(self, fid: bytes, size: int, key: bytes | None = None) -> None:
        """Record file ``fid`` of ``size`` bytes holding ``key`` (most recently used; a key
        already known is kept when ``key`` is ``None``)."""
        with self._lock:
            old = self._sizes.pop(fid, None)
            if old is None:
                self.total_bytes += size
            else:
                self.total_bytes += size - old[0]
                key = old[1] if key is None else key
            self._sizes[fid] = (size, key)

    def touch(self, key: bytes) -> None:
        """Mark ``key`` most recently used (no-op when absent)."""
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)

    def remove(self, key: bytes) -> None:
        """Forget ``key`` (no-op when absent)."""
        with self._lock:
            entry = self._sizes.pop(key, None)
            if entry is not None:
                self.total_bytes -= entry[0]

    def victims(self, budget: int, keep: bytes) -> list[tuple[bytes, bytes | None]]:
        """Remove least recently used files until the total fits ``budget`` (never ``keep``);
        returns their ``(file id, key or None)``."""
        out = []
        with self._lock:
            for fid in list(self._sizes):
                if self.total_bytes <= budget:
                    break
                if fid == keep:
                    continue
                size, key = self._sizes.pop(fid)
                self.total_bytes -= size
                out.append((fid, key))
        return out

    def scan(self, root: str) -> int:
        """Fill the index from the value files under ``root`` (oldest first); returns temp files removed.

        Temporary files left by a dead process (or very old) are deleted.
        """
        found: list[tuple[float, bytes, int]] = []
        removed = 0
        for sub in os.scandir(root):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(sub.path):
                name = entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if name.startswith(".tmp-"):
                    if is_stale_temp(name, st.st_mtime):
                        try:
                            os.unlink(entry.path)
                            removed += 1
                        except FileNotFoundError:
                            pass
                    continue
                if name.endswith(VALUE_SUFFIX):
                    try:
                        key = bytes.fromhex(name[: -len(VALUE_SUFFIX)])
                    except ValueError:
                        continue
                    found.append((st.st_mtime, key, st.st_size))
        found.sort()
        for _, key, size in found:
            self.add(key, size)
        return removed
