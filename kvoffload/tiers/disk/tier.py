"""DiskTier: one content-addressed file per block in a directory (local disk or a shared filesystem).

Files live in ``<path>/kvoffload-<fingerprint hex>/<id[:2]>/<id>.kv`` where ``id`` is the hex
BLAKE2b-128 of the key (the key itself is in the value's header and checked on every load). A
file is the value (header + record): packed with buffered I/O; with O_DIRECT the header and the
record each start on a 4 KiB page, so page-aligned host records (the host pool's) are written
and read in place with no copy (:mod:`kvoffload.tiers.disk.io`). A load checks the header and
the XXH3/MAC digest of the bytes it read into the slot before reporting it ok.
Values are written under a temporary name in the same directory and renamed, so no reader ever
sees a partial value; temporary files left by a crash are removed at start. The index of files
(size, recency) is rebuilt from a directory scan at start, so a restart keeps the cache; files
written by another process sharing the directory are found by the lookup probe.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from typing import Any, ClassVar
from urllib.parse import parse_qsl

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.tiers.args import check_records, tier_options_from_query
from kvoffload.tiers.base import Tier
from kvoffload.tiers.disk.index import VALUE_SUFFIX, DiskIndex
from kvoffload.tiers.disk.io import (
    BounceBuffers,
    file_bytes,
    is_page_aligned,
    open_value,
    probe_o_direct,
    read_value,
    unlink_if_same,
    write_value,
)
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.record import ValueRejected, key_in_header
from kvoffload.tiers.types import FAILED, PRESENT, STORED

__all__ = ["DiskTier", "parse_disk_spec"]

logger = logging.getLogger(__name__)


def parse_disk_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``disk:/path?max_bytes=N&o_direct=0`` -> ``("/path", {"max_bytes": N, "o_direct": False})``;
    the options of every tier (``integrity_key``, ``io_threads``...) are accepted too."""
    rest = spec[len("disk:") :]
    if rest.startswith("//"):
        rest = rest[2:]
    path, _, query = rest.partition("?")
    if not path:
        raise InvalidArgumentError(f"tier spec {spec!r}: a disk tier needs a directory, e.g. disk:/var/cache/kv")
    opts, backend_pairs = tier_options_from_query(spec, parse_qsl(query, keep_blank_values=True))
    for k, v in backend_pairs:
        if k == "max_bytes":
            try:
                opts[k] = int(v)
            except ValueError:
                raise InvalidArgumentError(f"tier spec {spec!r}: {k} must be an integer, got {v!r}") from None
        elif k == "o_direct":
            if v.lower() not in ("0", "1", "true", "false", "auto"):
                raise InvalidArgumentError(f"tier spec {spec!r}: o_direct must be 0, 1 or auto, got {v!r}")
            opts[k] = None if v.lower() == "auto" else v.lower() in ("1", "true")
        else:
            raise InvalidArgumentError(f"tier spec {spec!r}: unknown disk tier option {k!r}")
    return path, opts


def _file_id(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def _key_of_file(path: str) -> bytes | None:
    """The key in the header of the value file at ``path`` (``None`` if unreadable or not a value)."""
    try:
        with open(path, "rb", buffering=0) as f:
            return key_in_header(f.read)
    except OSError:
        return None


class DiskTier(Tier):
    """A tier on a directory (docs/contract.md §8); opened from ``disk:/path?…`` by :func:`open_tier`.

    Args:
        records: the host pool's records (see :class:`~kvoffload.tiers.Tier`).
        namespace: the namespace; its fingerprint names the tier's subdirectory.
        path: the directory (created if missing; may be shared by several engines).
        max_bytes: byte budget of the value files this tier keeps (least recently used evicted
            first); ``None`` for no budget.
        o_direct: ``None`` probes the filesystem once (O_DIRECT where accepted, else buffered
            I/O); ``True`` requires O_DIRECT; ``False`` uses buffered I/O.
        removal_events: report by :meth:`take_removed` every key whose file the ``max_bytes``
            budget evicts and every key whose value a load rejects (namespace, integrity or
            corruption check), once per eviction or rejection.
        **tier_options: ``name``, ``integrity_key``, ``io_threads``, ``batch_keys``… of
            :class:`~kvoffload.tiers.Tier`.
    """

    locality: ClassVar[str] = "LOCAL"

    def __init__(
        self,
        records: np.ndarray | memoryview,
        namespace: TierNamespace,
        path: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        o_direct: bool | None = None,
        removal_events: bool = False,
        **tier_options: Any,
    ) -> None:
        recs = check_records(records)
        if not isinstance(removal_events, bool):
            raise InvalidTypeError(f"removal_events must be a bool, got {type(removal_events).__name__}")
        self.removal_events = removal_events
        if not isinstance(namespace, TierNamespace):
            raise InvalidTypeError(f"namespace must be a TierNamespace, got {type(namespace).__name__}")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidTypeError(f"path must be a non-empty str or path, got {path!r}")
        self.max_bytes = None if max_bytes is None else check_int(max_bytes, "max_bytes", 1)
        if o_direct is not None and not isinstance(o_direct, bool):
            raise InvalidTypeError(f"o_direct must be a bool or None, got {type(o_direct).__name__}")
        base = os.path.abspath(os.fspath(path))
        if os.path.exists(base) and not os.path.isdir(base):
            raise InvalidArgumentError(f"path {base!r} exists and is not a directory")
        self.root = os.path.join(base, f"kvoffload-{namespace.fingerprint().hex()}")
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise InvalidArgumentError(f"path {base!r}: cannot create the tier directory ({exc.strerror})") from None
        try:
            probed = probe_o_direct(self.root)
        except OSError as exc:  # not writable here: stores will fail (counted), loads still work
            logger.warning("disk tier %s: cannot write (%s); stores will fail", self.root, exc.strerror)
            probed = False
        if o_direct and not probed:
            raise InvalidArgumentError(f"o_direct=True but the filesystem at {base!r} does not accept O_DIRECT")
        self.o_direct = probed if o_direct is None else o_direct
        if o_direct is None and not probed:
            logger.info("disk tier %s: O_DIRECT not supported, using buffered I/O", self.root)
        self.index = DiskIndex()
        self.temp_files_removed = self.index.scan(self.root)
        tier_options.setdefault("name", f"disk:{base}")
        super().__init__(recs, namespace, **tier_options)
        self._bufs = BounceBuffers(self.record_bytes)
        self._in_place = is_page_aligned(self.records)
        self._subdirs: set[str] = set()
        self._make_subdirs()

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """``disk:/path?max_bytes=N&o_direct=0`` -> ``{"path": "/path", "max_bytes": N, "o_direct": False}``."""
        path, opts = parse_disk_spec(url)
        return {"path": path, **opts}

    def _make_subdirs(self) -> None:
        """Create the 256 ``<id[:2]>`` subdirectories now, off the store path (best effort: a
        directory that cannot be created here is tried again by the store that needs it)."""
        for i in range(256):
            sub = os.path.join(self.root, f"{i:02x}")
            try:
                os.makedirs(sub, exist_ok=True)
            except OSError:
                return
            self._subdirs.add(sub)

    def file_bytes(self, key: bytes) -> int:
        """Bytes on disk of ``key``'s value file (what ``max_bytes`` counts)."""
        return file_bytes(self.codec.header_bytes(key), self.record_bytes, self.o_direct)

    def value_path(self, key: bytes) -> str:
        """The file that holds ``key``'s value."""
        h = _file_id(key).hex()
        return os.path.join(self.root, h[:2], h + VALUE_SUFFIX)

    # ------------------------------------------------------------------ backend hooks
    def _index_file(self, fid: bytes, path: str, key: bytes) -> bool:
        """Count the file at ``path`` in the index at its size on disk (a file another process
        sharing the directory wrote); False, and out of the index, when there is none."""
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            self.index.remove(fid)
            return False
        self.index.add(fid, size, key)
        return True

    def _check_store(self) -> None:
        """Write, read back and remove a small file in the tier's directory."""
        probe = os.path.join(self.root, f".kvoffload-check-{os.getpid()}")
        try:
            with open(probe, "wb") as f:
                f.write(b"kvoffload")
            with open(probe, "rb") as f:
                same = f.read() == b"kvoffload"
            os.unlink(probe)
        except OSError as exc:
            raise InvalidArgumentError(
                f"tier {self.name}: cannot write and read back a file in {self.root!r} ({exc.strerror})"
            ) from None
        if not same:
            raise InvalidArgumentError(f"tier {self.name}: a file written in {self.root!r} read back different")

    def _probe(self, keys: list[bytes]) -> list[bool]:
        return [_file_id(k) in self.index or self._index_file(_file_id(k), self.value_path(k), k) for k in keys]

    def _store_batch(self, keys: list[bytes], slots: np.ndarray) -> list[int]:
        out = []
        for key, slot in zip(keys, slots, strict=True):
            fid, path = _file_id(key), self.value_path(key)
            if fid in self.index or self._index_file(fid, path, key):
                self.index.touch(fid)
                out.append(PRESENT)
                continue
            size = self.file_bytes(key)
            if self.max_bytes is not None and size > self.max_bytes:
                self.counters.error("store", OSError(errno.EFBIG, f"a value of {size} bytes exceeds max_bytes"))
                out.append(FAILED)
                continue
            payload = self.records[slot]
            sub = os.path.dirname(path)
            try:
                if sub not in self._subdirs:
                    os.makedirs(sub, exist_ok=True)
                    self._subdirs.add(sub)
                header = self.codec.header(key, payload)
                write_value(path, header, payload, self._bufs, self.o_direct, self._in_place)
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # the subdirectory was removed: re-create it next time
                    self._subdirs.discard(sub)
                self.counters.error("store", exc)
                out.append(FAILED)
                continue
            self.index.add(fid, size, key)
            out.append(STORED)
            if self.max_bytes is not None and self.index.total_bytes > self.max_bytes:
                self._evict(fid)
        return out

    def _evict(self, keep: bytes) -> None:
        assert self.max_bytes is not None
        victims = self.index.victims(self.max_bytes, keep)
        removed = []
        for fid, key in victims:
            h = fid.hex()
            path = os.path.join(self.root, h[:2], h + VALUE_SUFFIX)
            if self.removal_events and key is None:  # a file of the start-up scan: its header names it
                key = _key_of_file(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            if key is not None:
                removed.append(key)
        self.counters.count("evictions", len(victims))
        if self.removal_events and removed:
            self.counters.removed(removed)

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        return [self._load_one(key, self.records[slot]) for key, slot in zip(keys, slots, strict=True)]

    def _load_one(self, key: bytes, row: np.ndarray) -> bool:
        """Load ``key``'s value into ``row`` after checking it; a rejected value's file is deleted
        when the rejection says so and only if it is still the file read (another engine sharing
        the directory may have replaced it meanwhile)."""
        fid, path = _file_id(key), self.value_path(key)
        try:
            fd = open_value(path, self.o_direct)
        except FileNotFoundError:
            self.index.remove(fid)
            self.counters.count("absent")
            return False
        except OSError as exc:
            self.counters.error("load", exc)
            return False
        try:
            header, payload = read_value(
                fd, self.codec.header_bytes(key), row, self._bufs, self.o_direct, self._in_place
            )
            self.codec.check_parts(key, header, row.data if payload is None else payload)
        except ValueRejected as rej:
            self.counters.rejected(rej)
            if self.removal_events:  # forgotten for this reader, whether deleted or not
                self.counters.removed([key])
            if rej.delete:
                try:
                    if unlink_if_same(path, fd):
                        self.counters.count("deleted_values")
                except OSError:
                    pass
                self._index_file(fid, path, key)  # another writer's value kept there still counts
            return False
        except OSError as exc:
            self.counters.error("load", exc)
            return False
        finally:
            os.close(fd)
        if payload is not None:  # read into the bounce buffer: copied once checked
            row[:] = np.frombuffer(payload, dtype=np.uint8)
        self.index.touch(fid)
        return True

    def _close_backend(self) -> None:
        """Nothing to release: files are opened and closed per value."""
