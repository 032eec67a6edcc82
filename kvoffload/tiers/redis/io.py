"""Pipelined Redis commands on one connection, RESP2 or RESP3, multi-MiB values without copies.

redis-py's pipelines pack every argument into one buffer (a copy of each value) and parse each
``GET`` reply into a new bytes object. Here a command's arguments go to the socket as separate
buffers (a record is read once, by the socket), and a bulk reply can be read straight from the
socket into a caller's buffer. Connections come from redis-py's pools (which authenticate,
select the database and say ``HELLO 3`` when asked for RESP3).

Replies are parsed for both protocols: an absent value is ``$-1`` (RESP2) or ``_`` (RESP3);
``MOVED`` and ``ASK`` error replies become :class:`Redirect` values for the caller to follow
(:mod:`kvoffload.tiers.redis.nodes`); RESP3 push messages between replies are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import ResponseError

__all__ = [
    "Redirect",
    "Mismatch",
    "pipeline",
    "command",
    "send",
    "replies",
    "exists",
    "set_nx",
    "get_into",
    "delete_if_head",
    "Dest",
]

#: Bytes of a value kept by :class:`Mismatch` (the record header and key fit in them).
HEAD_BYTES = 256

_ASKING = b"*1\r\n$6\r\nASKING\r\n"
_SMALL = 1 << 16  # arguments up to this size are joined into one send buffer

#: Deletes KEYS[1] only while it is still the value that was read: same length, same first bytes.
_DELETE_IF_HEAD = (
    b"if redis.call('STRLEN', KEYS[1]) == tonumber(ARGV[1]) and "
    b"redis.call('GETRANGE', KEYS[1], 0, #ARGV[2] - 1) == ARGV[2] then "
    b"return redis.call('DEL', KEYS[1]) end return 0"
)


@dataclass(frozen=True)
class Redirect:
    """A ``MOVED`` (``ask=False``) or ``ASK`` reply: ``slot`` is served by ``host:port``."""

    ask: bool
    slot: int
    host: str
    port: int


@dataclass(frozen=True)
class Mismatch:
    """A bulk reply whose length is not the expected one: its ``length`` and first ``head`` bytes."""

    length: int
    head: bytes


def command(*args: bytes | memoryview) -> list[bytes | memoryview]:
    """One command in RESP framing, as buffers (arguments over 64 KiB stay separate, uncopied)."""
    out: list[bytes | memoryview] = []
    small = bytearray(b"*%d\r\n" % len(args))
    for a in args:
        small += b"$%d\r\n" % len(a)
        if len(a) > _SMALL:
            out.append(bytes(small))
            out.append(a)
            small = bytearray(b"\r\n")
        else:
            small += a
            small += b"\r\n"
    out.append(bytes(small))
    return out


def _parse_redirect(msg: str) -> Redirect | None:
    kind, _, rest = msg.partition(" ")
    if kind not in ("MOVED", "ASK"):
        return None
    slot_s, _, addr = rest.partition(" ")
    host, _, port_s = addr.rpartition(":")
    if not slot_s.isdigit() or not port_s.isdigit():
        return None
    return Redirect(kind == "ASK", int(slot_s), host, int(port_s))


#: Where a bulk reply goes: one buffer, or several filled in order.
Dest = memoryview | tuple[memoryview, ...]


class _Reader:
    """Buffered reads of RESP2/RESP3 replies from a socket, bulk payloads straight into a caller buffer."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = bytearray(1 << 16)
        self._start = 0
        self._end = 0

    def _fill(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            if self._start == 0:  # a line longer than the buffer
                self._buf.extend(bytes(len(self._buf)))
            else:
                n = self._end - self._start
                self._buf[:n] = self._buf[self._start : self._end]
                self._start, self._end = 0, n
        got = self._sock.recv_into(memoryview(self._buf)[self._end :])
        if got == 0:
            raise redis.ConnectionError("connection closed by the server")
        self._end += got

    def line(self) -> bytes:
        while True:
            i = self._buf.find(b"\r\n", self._start, self._end)
            if i >= 0:
                out = bytes(self._buf[self._start : i])
                self._start = i + 2
                return out
            self._fill()

    def read_into(self, dest: memoryview) -> None:
        n = len(dest)
        have = min(n, self._end - self._start)
        dest[:have] = self._buf[self._start : self._start + have]
        self._start += have
        while have < n:
            got = self._sock.recv_into(dest[have:])
            if got == 0:
                raise redis.ConnectionError("connection closed by the server")
            have += got

    def skip(self, n: int) -> None:
        scratch = memoryview(bytearray(min(n, 1 << 20)))
        while n:
            k = min(n, len(scratch))
            self.read_into(scratch[:k])
            n -= k

    def bulk(self, n: int) -> bytes:
        buf = bytearray(n + 2)
        self.read_into(memoryview(buf))
        return bytes(buf[:n])

    def reply(self, dest: Dest | None = None) -> Any:
        """The next reply (push messages skipped). A bulk string goes into ``dest`` when given (a
        buffer, or several filled in order: a value's header, then its payload straight into the
        host record): its length is returned when it is the buffers' total length, else a
        :class:`Mismatch` (not copied)."""
        while True:
            line = self.line()
            if line[:1] != b">":
                return self._value(line, dest)
            for _ in range(int(line[1:])):  # a RESP3 push message: not a reply
                self.reply()

    def _value(self, line: bytes, dest: Dest | None = None) -> Any:
        t, body = line[:1], line[1:]
        if t in (b"$", b"=", b"!"):
            n = int(body)
            if n < 0:
                return None
            if t == b"$" and dest is not None:
                parts = dest if isinstance(dest, tuple) else (dest,)
                if n == sum(len(d) for d in parts):
                    for d in parts:
                        self.read_into(d)
                    self.skip(2)
                    return n
                head = self.bulk(n) if n <= HEAD_BYTES else self._head_then_skip(n)
                return Mismatch(n, head)
            data = self.bulk(n)
            if t == b"!":
                return self._error(data.decode(errors="replace"))
            return data[4:] if t == b"=" else data
        if t == b"+":
            return body
        if t == b"-":
            return self._error(body.decode(errors="replace"))
        if t in (b":", b"("):
            return int(body)
        if t == b"_":
            return None
        if t == b"#":
            return body == b"t"
        if t == b",":
            return float(body)
        if t in (b"*", b"~", b"%", b"|"):
            n = int(body)
            if n < 0:
                return None
            items = [self.reply() for _ in range(2 * n if t in b"%|" else n)]
            if t == b"|":  # attributes precede the reply they describe
                return self.reply(dest)
            return items
        raise redis.ConnectionError(f"unexpected RESP reply {line[:32]!r}")

    def _head_then_skip(self, n: int) -> bytes:
        head = bytearray(HEAD_BYTES)
        self.read_into(memoryview(head))
        self.skip(n - HEAD_BYTES + 2)
        return bytes(head)

    @staticmethod
    def _error(msg: str) -> Redirect | ResponseError:
        return _parse_redirect(msg) or ResponseError(msg)


def pipeline(
    pool: Any,
    commands: Sequence[list[bytes | memoryview]],
    asking: Sequence[bool],
    dests: Sequence[Dest | None] | None = None,
) -> list[Any]:
    """Send ``commands`` (each from :func:`command`) on one connection of ``pool`` and read their replies.

    ``asking[i]`` sends ``ASKING`` before command ``i`` (its ``+OK`` is consumed). A bulk reply
    of command ``i`` goes into ``dests[i]`` when that is not None (see :meth:`_Reader.reply`).
    Per command: its reply (``None`` for an absent value, a :class:`Redirect`, a
    ``ResponseError``...). A connection error is tried once more on a new connection (a pooled
    one may have been closed by a restarted server); then connection errors and timeouts
    propagate (``redis.ConnectionError`` / ``redis.TimeoutError``), the connection closed, so a
    half-read reply never reaches the next user.
    """
    chunks: list[bytes | memoryview] = []
    for cmd, ask in zip(commands, asking, strict=True):
        if ask:
            chunks.append(_ASKING)
        chunks.extend(cmd)
    chunks = _coalesce(chunks)
    try:
        return _exchange(pool, chunks, asking, dests)
    except redis.TimeoutError:
        raise
    except redis.ConnectionError:  # a pooled connection the server closed (restart, idle timeout):
        return _exchange(pool, chunks, asking, dests)  # once more on a new one; every command is idempotent


def _exchange(
    pool: Any, chunks: list[bytes | memoryview], asking: Sequence[bool], dests: Sequence[Dest | None] | None
) -> list[Any]:
    conn = pool.get_connection()
    ok = False
    try:
        conn.send_packed_command(chunks)
        reader = _Reader(conn._sock)
        out = []
        for i, ask in enumerate(asking):
            if ask:
                reader.reply()
            out.append(reader.reply(dests[i] if dests is not None else None))
        ok = True
        return out
    except TimeoutError as exc:
        raise redis.TimeoutError(f"reading replies: {exc!r}") from exc
    except OSError as exc:
        raise redis.ConnectionError(f"reading replies: {exc!r}") from exc
    finally:
        if not ok:
            conn.disconnect()
        pool.release(conn)


def send(conn: Any, commands: Sequence[list[bytes | memoryview]]) -> None:
    """Write ``commands`` (each from :func:`command`) on the connection ``conn``; no reply is read."""
    conn.send_packed_command(_coalesce([c for cmd in commands for c in cmd]), check_health=False)


def replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn`` (as :func:`pipeline` returns them); blocks under its socket timeout."""
    reader = _Reader(conn._sock)
    return [reader.reply() for _ in range(n)]


def _coalesce(chunks: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Adjacent small buffers joined (fewer send calls); large ones kept as they are."""
    out: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    for c in chunks:
        if len(c) > _SMALL:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(c)
        else:
            small.append(c)
    if small:
        out.append(b"".join(small))
    return out


def exists(pool: Any, keys: Sequence[bytes], asking: Sequence[bool]) -> list[Any]:
    """``EXISTS`` per key: 1 / 0, or a :class:`Redirect` / ``ResponseError``."""
    return pipeline(pool, [command(b"EXISTS", k) for k in keys], asking)


def set_nx(pool: Any, items: Sequence[tuple[bytes, bytes, memoryview]], asking: Sequence[bool]) -> list[Any]:
    """``SET rk header+payload NX`` per ``(rk, header, payload)``: ``b"OK"`` (stored), None (the key
    existed), or a :class:`Redirect` / ``ResponseError``. The payload is sent uncopied."""
    cmds: list[list[bytes | memoryview]] = []
    for rk, header, payload in items:
        n = len(header) + len(payload)
        cmds.append(
            [b"*4\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s" % (len(rk), rk, n, header), payload, b"\r\n$2\r\nNX\r\n"]
        )
    return pipeline(pool, cmds, asking)


def get_into(pool: Any, keys: Sequence[bytes], dests: Sequence[Dest], asking: Sequence[bool]) -> list[Any]:
    """``GET`` per key into ``dests[i]``: ``len(dests[i])`` (the bytes are there), None (absent), a
    :class:`Mismatch` (another length; not copied), or a :class:`Redirect` / ``ResponseError``."""
    return pipeline(pool, [command(b"GET", k) for k in keys], asking, dests)


def delete_if_head(pool: Any, items: Sequence[tuple[bytes, int, bytes]], asking: Sequence[bool]) -> list[Any]:
    """Delete each ``(rk, length, head)`` only while the value is still ``length`` bytes long and
    starts with ``head`` (the value that was read, not one written since): 1 deleted, 0 not."""
    cmds = [command(b"EVAL", _DELETE_IF_HEAD, b"1", rk, b"%d" % n, head) for rk, n, head in items]
    return pipeline(pool, cmds, asking)
