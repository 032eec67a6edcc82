"""The RESP2 / RESP3 reply reader of the Redis tier on every reply type, fed through a real socket
pair (a server's byte stream, as written in the RESP specification), one byte per send to cross
every buffer boundary."""

from __future__ import annotations

import socket
import threading

import pytest
from redis.exceptions import ResponseError

from kvoffload.tiers.redis.io import HEAD_BYTES, Mismatch, Redirect, _Reader

BIG = bytes(range(256)) * 5  # 1280 bytes, longer than HEAD_BYTES


def _read(stream: bytes, dests: list[memoryview | None]) -> list[object]:
    a, b = socket.socketpair()

    def feed() -> None:
        for i in range(len(stream)):
            b.sendall(stream[i : i + 1])

    th = threading.Thread(target=feed)
    th.start()
    try:
        reader = _Reader(a)
        return [reader.reply(d) for d in dests]
    finally:
        th.join()
        a.close()
        b.close()


def test_every_reply_type_of_both_protocols() -> None:
    stream = (
        b"+OK\r\n" b"$-1\r\n" b"_\r\n" b":42\r\n" b"(12345678901234567890\r\n" b"#t\r\n" b",1.5\r\n"
        b"$3\r\nabc\r\n" b"=7\r\ntxt:abc\r\n" b"*-1\r\n"
        b"*2\r\n$1\r\na\r\n:1\r\n" b"%1\r\n+k\r\n:2\r\n" b"~1\r\n+x\r\n"
        b">2\r\n+pubsub\r\n+ignored\r\n:7\r\n"  # a push message, then the reply it preceded
        b"|1\r\n+ttl\r\n:3\r\n:8\r\n"  # attributes, then the reply
        b"-MOVED 3999 127.0.0.1:6381\r\n" b"-ASK 12 :7000\r\n" b"-ERR nope\r\n" b"!5\r\nERR x\r\n"
    )  # fmt: skip
    got = _read(stream, [None] * 19)
    assert got[:15] == [
        b"OK", None, None, 42, 12345678901234567890, True, 1.5, b"abc", b"abc", None,
        [b"a", 1], [b"k", 2], [b"x"], 7, 8,
    ]  # fmt: skip
    assert got[15] == Redirect(False, 3999, "127.0.0.1", 6381) and got[16] == Redirect(True, 12, "", 7000)
    assert isinstance(got[17], ResponseError) and str(got[17]) == "ERR nope"
    assert isinstance(got[18], ResponseError) and str(got[18]) == "ERR x"


@pytest.mark.parametrize("absent", [b"$-1\r\n", b"_\r\n"], ids=["resp2", "resp3"])
def test_bulk_into_buffer_absent_and_mismatch(absent: bytes) -> None:
    dest = [memoryview(bytearray(len(BIG))), memoryview(bytearray(4)), memoryview(bytearray(9))]
    dest.append(memoryview(bytearray(3)))
    stream = b"$%d\r\n%s\r\n" % (len(BIG), BIG) + absent + b"$%d\r\n%s\r\n" % (len(BIG), BIG) + b"$2\r\nhi\r\n"
    got = _read(stream + b"+OK\r\n", [*dest, None])
    assert got[0] == len(BIG) and bytes(dest[0]) == BIG
    assert got[1] is None and bytes(dest[1]) == bytes(4)  # absent: nothing written
    assert got[2] == Mismatch(len(BIG), BIG[:HEAD_BYTES]) and bytes(dest[2]) == bytes(9)  # skipped, not copied
    assert got[3] == Mismatch(2, b"hi") and got[4] == b"OK"  # the stream stays in step
