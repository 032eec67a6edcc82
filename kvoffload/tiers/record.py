"""The tier value format: one object per offloaded block, a header followed by the record bytes.

Header (little-endian, ``FIXED_HEADER_BYTES`` + ``len(key)`` bytes)::

    magic        4s   b"KVOT"
    version      H    RECORD_FORMAT_VERSION
    flags        H    bit 0: ``digest`` is an HMAC-SHA256 (the writer had an integrity key)
    fingerprint  16s  TierNamespace.fingerprint() of the writer
    key_len      H    length of the key that follows the fixed part
    reserved     H    0
    payload_len  Q    record bytes after the header
    digest       32s  XXH3-128 (16 bytes, zero padded) or HMAC-SHA256 over everything else
    key          key_len bytes

The digest covers the header fields (digest zeroed), the key and the payload, so a value copied
under another key, truncated, extended or altered is rejected. A reader with integrity keys
accepts only MAC'd values whose MAC verifies under one of them (the first key signs, the others
are still accepted: keys rotate without emptying the tier); a reader without one rejects MAC'd
values (it cannot check them). A value rejected by the MAC check alone (unsigned, signed with a
key this reader does not hold, or forged) is never deleted: it may be valid for other readers,
and it ages out of the store (see :attr:`ValueRejected.delete`).

XXH3-128 (the ``xxhash`` package) detects corruption and truncation like a CRC with a far
smaller miss rate, at memory speed (over 10 GB/s on one core where zlib's CRC-32 gives ~1.5),
so checking a multi-MiB record costs little next to moving it; it is not a MAC (against a
writer who forges values, use ``integrity_key``). ``xxhash`` comes with the tier extras
(``kvoffload[redis]``, ``kvoffload[disk]``): imported with this module when installed; without
it the tier interface still imports and building a :class:`RecordCodec` (a tier's start) raises
the ``pip install`` line.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.tiers.namespace import RECORD_FORMAT_VERSION

_xxhash: Any
try:  # a tier extra: imported with the module when installed (before a process drops privileges)
    import xxhash as _xxhash
except ImportError:  # not installed: the interface still imports; building a codec says what to install
    _xxhash = None

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "MAGIC",
    "FIXED_HEADER_BYTES",
    "ValueRejected",
    "RecordCodec",
    "IntegrityKeys",
    "integrity_keys",
    "key_in_header",
]

MAGIC = b"KVOT"
_FIXED = struct.Struct("<4sHH16sHHQ32s")
FIXED_HEADER_BYTES = _FIXED.size
_FLAG_MAC = 1
_DIGEST_OFFSET = FIXED_HEADER_BYTES - 32
_ZERO_DIGEST = bytes(32)


#: What a rejection says about a value: from another namespace (``"namespace"``), not
#: verifiable with this reader's keys (``"integrity"``), or damaged (``"corrupt"``).
_KINDS = {
    "fingerprint": "namespace",
    "version": "namespace",
    "mac": "integrity",
    "unsigned": "integrity",
    "mac-unverifiable": "integrity",
}


class ValueRejected(Exception):
    """A stored value failed validation (internal to the tiers: reported as a miss / failed key).

    Attributes:
        reason: short name of the check that failed (``"magic"``, ``"version"``, ``"fingerprint"``,
            ``"key"``, ``"length"``, ``"checksum"``, ``"mac"`` (no accepted key verifies it),
            ``"unsigned"`` (no MAC, one required), ``"mac-unverifiable"`` (a MAC, no key to check
            it), ``"truncated"``, ``"padding"`` for a disk file whose alignment padding is not zero).
        kind: ``"namespace"`` (fingerprint, version), ``"integrity"`` (the MAC checks) or
            ``"corrupt"`` (every other reason).
        delete: whether the value is wrong for every reader (corrupt, or another namespace under
            this namespace's key) and may be deleted; False for integrity rejections, which
            depend on the reader's keys.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = _KINDS.get(reason, "corrupt")
        self.delete = self.kind != "integrity"


#: Integrity keys as given by a user: one secret, several (the first signs), or none.
IntegrityKeys = bytes | str | Sequence[bytes | str] | None


def integrity_keys(value: IntegrityKeys, name: str = "integrity_key") -> tuple[bytes, ...]:
    """``value`` as a tuple of secrets of at least 16 bytes (``str`` encoded as UTF-8); the first
    one signs, all are accepted. ``None`` or an empty sequence: no key."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (bytes, str)) else value
    if not isinstance(items, Sequence):
        raise InvalidTypeError(f"{name} must be bytes, str, a list of them or None, got {type(value).__name__}")
    out = []
    for i, k in enumerate(items):
        if isinstance(k, str):
            k = k.encode()
        if not isinstance(k, bytes):
            raise InvalidTypeError(f"{name}[{i}] must be bytes or str, got {type(k).__name__}")
        if len(k) < 16:
            raise InvalidArgumentError(f"{name} must be at least 16 bytes, got {len(k)} (entry {i})")
        out.append(k)
    return tuple(out)


def key_in_header(read: Callable[[int], bytes]) -> bytes | None:
    """The key a value's header names, read through ``read(n)`` (the next ``n`` bytes of the
    value, e.g. a file's ``read``); ``None`` when it is not a value's header. Nothing is checked
    beyond the magic: for reporting which key a value held, never for trusting it."""
    fixed = read(FIXED_HEADER_BYTES)
    if len(fixed) < FIXED_HEADER_BYTES or fixed[:4] != MAGIC:
        return None
    key_len = _FIXED.unpack_from(fixed)[4]
    key = read(key_len)
    return key if len(key) == key_len and key_len else None


def _xxh3_128() -> Callable[[bytes], Any]:
    """``xxhash.xxh3_128``, or the error naming the extras that install it."""
    if _xxhash is None:
        raise BackendUnavailableError(
            "a tier's value format needs the xxhash package: pip install 'kvoffload[redis]' (or 'kvoffload[disk]')"
        )
    return _xxhash.xxh3_128


class RecordCodec:
    """Builds and checks tier values for one namespace and record size.

    Args:
        fingerprint: the namespace fingerprint (16 bytes) every value carries.
        record_bytes: the payload length of every value.
        integrity_key: optional shared secret(s) (see :func:`integrity_keys`): values are
            signed with an HMAC-SHA256 under the first key and accepted under any of them.
    """

    def __init__(self, fingerprint: bytes, record_bytes: int, integrity_key: IntegrityKeys = None) -> None:
        if not isinstance(fingerprint, bytes) or len(fingerprint) != 16:
            raise InvalidArgumentError(f"fingerprint must be 16 bytes, got {fingerprint!r}")
        self.fingerprint = fingerprint
        self.record_bytes = check_int(record_bytes, "record_bytes", 1)
        self._mac_keys = integrity_keys(integrity_key)
        #: whether values are signed (an integrity key is set)
        self.signs = bool(self._mac_keys)
        self._xxh3_128 = _xxh3_128()

    def header_bytes(self, key: bytes) -> int:
        """Length of the header of ``key``'s value."""
        return FIXED_HEADER_BYTES + len(key)

    def value_bytes(self, key: bytes) -> int:
        """Length of ``key``'s whole value."""
        return FIXED_HEADER_BYTES + len(key) + self.record_bytes

    def _digest(self, fixed_zeroed: bytes, key: bytes, payload: Buffer, mac_key: bytes | None) -> bytes:
        if mac_key is not None:
            mac = hmac.new(mac_key, fixed_zeroed, hashlib.sha256)
            mac.update(key)
            mac.update(payload)
            return mac.digest()
        h = self._xxh3_128(fixed_zeroed)
        h.update(key)
        h.update(payload)
        return h.digest() + bytes(16)

    def header(self, key: bytes, payload: np.ndarray) -> bytes:
        """The header for ``payload`` (``record_bytes`` long) stored under ``key``."""
        signer = self._mac_keys[0] if self._mac_keys else None
        flags = _FLAG_MAC if signer is not None else 0
        fixed = _FIXED.pack(
            MAGIC, RECORD_FORMAT_VERSION, flags, self.fingerprint, len(key), 0, self.record_bytes, _ZERO_DIGEST
        )
        digest = self._digest(fixed, key, payload.data, signer)
        return fixed[:_DIGEST_OFFSET] + digest + key

    def encode(self, key: bytes, payload: np.ndarray) -> bytes:
        """Header + payload as one bytes object (what a Redis ``SET`` sends)."""
        return b"".join((self.header(key, payload), payload.data))

    def check(self, key: bytes, value: Buffer) -> memoryview:
        """The payload of ``value`` (a view into it) after every check, or :class:`ValueRejected`."""
        mv = memoryview(value).cast("B")
        if len(mv) < FIXED_HEADER_BYTES:
            raise ValueRejected("truncated")
        start = FIXED_HEADER_BYTES + _FIXED.unpack_from(mv)[4]
        if len(mv) < start:
            raise ValueRejected("truncated")
        payload = mv[start:]
        self.check_parts(key, mv[:start], payload)
        return payload

    def check_parts(self, key: bytes, header: Buffer, payload: Buffer) -> None:
        """Check a value held as two buffers, ``header`` (exactly the header) and ``payload``.

        The same checks as :meth:`check`, for readers that put the payload straight into its
        destination; raises :class:`ValueRejected`.
        """
        mv = memoryview(header).cast("B")
        body = memoryview(payload).cast("B")
        if len(mv) < FIXED_HEADER_BYTES:
            raise ValueRejected("truncated")
        magic, version, flags, fp, key_len, _res, payload_len, digest = _FIXED.unpack_from(mv)
        if magic != MAGIC:
            raise ValueRejected("magic")
        if version != RECORD_FORMAT_VERSION:
            raise ValueRejected("version")
        if fp != self.fingerprint:
            raise ValueRejected("fingerprint")
        if len(mv) != FIXED_HEADER_BYTES + key_len or bytes(mv[FIXED_HEADER_BYTES:]) != key:
            raise ValueRejected("key")
        if payload_len != self.record_bytes:
            raise ValueRejected("length")
        if len(body) != payload_len:
            raise ValueRejected("truncated" if len(body) < payload_len else "length")
        fixed_zeroed = bytes(mv[:_DIGEST_OFFSET]) + _ZERO_DIGEST
        if not flags & _FLAG_MAC:
            if self._mac_keys:
                raise ValueRejected("unsigned")
            if not hmac.compare_digest(self._digest(fixed_zeroed, key, body, None), digest):
                raise ValueRejected("checksum")
            return
        if not self._mac_keys:
            raise ValueRejected("mac-unverifiable")
        for mac_key in self._mac_keys:
            if hmac.compare_digest(self._digest(fixed_zeroed, key, body, mac_key), digest):
                return
        raise ValueRejected("mac")
