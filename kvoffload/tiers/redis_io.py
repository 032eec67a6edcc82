"""Pipelined Redis commands for multi-MiB values without redis-py's copies.

redis-py's pipelines pack every argument into one buffer (a copy of each value, plus the copy
that joins header and record), and parse each ``GET`` reply into a new bytes object. Here a
store hands the RESP framing, the value header and a view of the host record to the connection
as separate buffers (the record is read once, by the socket), and a load reads each reply's
bytes straight from the socket into the caller's buffer. Connections come from redis-py's pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

__all__ = ["pools_for_keys", "set_nx", "get_into"]


def pools_for_keys(client: redis.Redis | RedisCluster, store_keys: Sequence[bytes]) -> list[tuple[Any, list[int]]]:
    """``(connection pool, indices of store_keys)`` per server that owns some of the keys."""
    if not isinstance(client, RedisCluster):
        return [(client.connection_pool, list(range(len(store_keys))))]
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, rk in enumerate(store_keys):
        pool = client.get_redis_connection(client.get_node_from_key(rk)).connection_pool
        groups.setdefault(id(pool), (pool, []))[1].append(i)
    return list(groups.values())


def set_nx(pool: Any, items: Sequence[tuple[bytes, bytes, memoryview]]) -> list[bool | None | ResponseError]:
    """Send ``SET rk header+payload NX`` for each ``(rk, header, payload)`` in one pipeline.

    Per item: True (stored), None (the key existed), or the server's error reply. Connection
    errors and timeouts propagate (the connection is then discarded by redis-py).
    """
    chunks: list[bytes | memoryview] = []
    for rk, header, payload in items:
        head = b"*4\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(rk), rk, len(header) + len(payload))
        chunks.append(head + header)
        chunks.append(payload)
        chunks.append(b"\r\n$2\r\nNX\r\n")
    conn = pool.get_connection()
    try:
        conn.send_packed_command(chunks)
        out: list[bool | None | ResponseError] = []
        for _ in items:
            try:
                r = conn.read_response()
            except ResponseError as exc:  # one command's error reply: the connection stays in sync
                out.append(exc)
                continue
            out.append(None if r is None else True)
        return out
    finally:
        pool.release(conn)


class _Reader:
    """Buffered reads of RESP replies from a socket, bulk payloads straight into a caller buffer."""

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


def get_into(pool: Any, store_keys: Sequence[bytes], dest: memoryview, expected: Sequence[int]) -> list[int | None]:
    """``GET`` each key in one pipeline; value ``i`` is read into ``dest`` at ``sum(expected[:i])``.

    Per key: the value's length when it is exactly ``expected[i]`` (its bytes are then in
    ``dest``), ``None`` when absent, ``-1`` when its length is wrong (skipped, not copied) or
    the server replied with an error. ``dest`` must hold ``sum(expected)`` bytes.
    """
    chunks = [b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(rk), rk) for rk in store_keys]
    conn = pool.get_connection()
    ok = False
    try:
        conn.send_packed_command([b"".join(chunks)])
        reader = _Reader(conn._sock)
        out: list[int | None] = []
        offset = 0
        for want in expected:
            line = reader.line()
            if line.startswith(b"$"):
                n = int(line[1:])
                if n < 0:
                    out.append(None)
                elif n == want:
                    reader.read_into(dest[offset : offset + n])
                    reader.skip(2)
                    out.append(n)
                else:
                    reader.skip(n + 2)
                    out.append(-1)
            else:  # an error reply (-ERR ...): one line
                out.append(-1)
            offset += want
        ok = True
        return out
    except OSError as exc:
        raise redis.ConnectionError(f"reading replies: {exc}") from exc
    finally:
        if not ok:
            conn.disconnect()
        pool.release(conn)
