"""A standalone Redis tier's probe answered on the engine thread, within ``probe_wait`` (the step's
probe at ``end_step``, or a lookup's own with :meth:`~kvoffload.tiers.base.Tier.probe_now`).

Handing a step's probe to the tier's lookup thread and waiting for its answer costs two thread
hand-offs (the lookup thread must get a core and the GIL to send, then the engine thread to take
the answer back), each up to a scheduler quantum or the GIL's switch interval on a busy machine.
:class:`InlineProbe` removes them: the engine thread itself writes the step's ``EXISTS`` pipeline
on a connection of its own (a few hundred bytes: the write never blocks) and waits for the reply
with ``select`` up to ``probe_wait`` seconds. A reply in time is read there (tiny: ``:0`` / ``:1``
per key); a late one is left to the lookup thread, which reads it (blocking, under the socket
timeout) and hands the answers back as any probe's, and the connection is not used again until
then. The engine thread never connects: the lookup thread opens the connection as the tier starts
and after a probe it made succeeded, and drops it after any error (the next probes go through the lookup thread).
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable
from typing import Any

import redis

from kvoffload.tiers.health import TierUnavailable
from kvoffload.tiers.redis.io import command, replies, send

__all__ = ["InlineProbe"]

logger = logging.getLogger(__name__)

_ERRORS = (redis.RedisError, OSError, ValueError)


def _found(replies: list[Any]) -> list[bool]:
    return [isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in replies]


class InlineProbe:
    """``EXISTS`` pipelines sent and, when the reply comes within the wait, read on the calling thread.

    Args:
        make: a new, unconnected ``redis.Connection`` to the server (authenticates and selects
            the database when it connects).
        prefix: the tier's store-key prefix.
        first_connect_wait: seconds the first :meth:`ask` waits for the first connect (made by
            the lookup thread as the tier starts) when it is not over yet: once per tier.
    """

    def __init__(self, make: Callable[[], Any], prefix: bytes, first_connect_wait: float) -> None:
        self._make = make
        self._prefix = prefix
        self._first_wait = first_connect_wait
        self._lock = threading.Lock()
        self._conn: Any = None
        self._lent = False  # a late reply is owed on the connection: the lookup thread reads it
        self._tried = threading.Event()  # the first connect (as the tier starts) is over

    def connect(self) -> None:
        """Open the connection if there is none (the lookup thread: as the tier starts, and after a
        probe succeeded; never raises)."""
        with self._lock:
            if self._conn is not None or self._lent:
                return
        conn = self._make()
        try:
            conn.connect()
        except _ERRORS as exc:
            logger.debug("inline probe connection: %s", exc)
            conn.disconnect()
            return
        finally:
            self._tried.set()
        with self._lock:
            if self._conn is None and not self._lent:
                self._conn, conn = conn, None
        if conn is not None:
            conn.disconnect()

    def ask(self, keys: list[bytes], wait: float) -> list[bool] | Callable[[], list[bool]] | None:
        """Probe ``keys`` (the engine thread): per key whether it is there, when the reply came
        within ``wait`` seconds; else a function that reads the late reply (the lookup thread's:
        raises :class:`~kvoffload.tiers.health.TierUnavailable` on an error); None when no
        connection is ready (nothing was sent). The first call waits for the first connect if it
        is not over (at most ``first_connect_wait``: the lookup thread needs the GIL a few times
        to connect, milliseconds on a busy engine thread), so an engine's first lookups are
        probed here too."""
        if not self._tried.is_set():
            self._tried.wait(self._first_wait)
            self._tried.set()  # waited once
        with self._lock:
            conn = None if self._lent else self._conn
            if conn is None or getattr(conn, "_sock", None) is None:
                return None
            self._lent = True
        try:
            send(conn, [command(b"EXISTS", self._prefix + k) for k in keys])
            ready, _, _ = select.select([conn._sock], [], [], wait)
            if not ready:
                return lambda: self._finish(conn, len(keys))
            found = _found(replies(conn, len(keys)))
        except _ERRORS as exc:
            logger.debug("inline probe: %s", exc)
            self._drop(conn)
            return None
        with self._lock:
            self._lent = False
        return found

    def _finish(self, conn: Any, n: int) -> list[bool]:
        """Read a late reply of ``n`` keys (the lookup thread)."""
        try:
            found = _found(replies(conn, n))
        except _ERRORS as exc:
            self._drop(conn)
            raise TierUnavailable(f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            self._lent = False
        return found

    def _drop(self, conn: Any) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
            self._lent = False
        conn.disconnect()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
