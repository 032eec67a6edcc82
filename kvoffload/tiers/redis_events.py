"""Keys a Redis server forgets on its own or by another client, from its keyspace notifications.

Redis publishes ``__keyevent@<db>__:evicted`` (``maxmemory`` eviction), ``:expired``, ``:del`` and
``:unlink`` with the key as the message when its ``notify-keyspace-events`` setting includes
``E`` (key-event channels) and the classes ``e`` (evicted), ``x`` (expired) and ``g`` (generic
commands: ``DEL``, ``UNLINK``) -- e.g. ``notify-keyspace-events Egex`` (``KEA`` includes them).
:class:`KeyspaceWatcher` subscribes to those channels on its own connection and thread and hands
each key under the tier's prefix to a callback. It never fails the tier: when the setting lacks
what it needs (or ``CONFIG GET`` is refused) it says so once, through ``report_off``, and still
listens (the setting may be changed later); a lost connection is retried every second.
Standalone servers only (a cluster publishes per node).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["KeyspaceWatcher", "EVENTS", "REQUIRED_FLAGS"]

logger = logging.getLogger(__name__)

#: the key events that mean a value is gone
EVENTS = ("evicted", "expired", "del", "unlink")
#: ``notify-keyspace-events`` flags needed: key-event channels, evicted, expired, generic commands
REQUIRED_FLAGS = "Eexg"


def notifications_missing(setting: str) -> str:
    """The flags of :data:`REQUIRED_FLAGS` that ``setting`` (a ``notify-keyspace-events`` value) lacks."""
    have = set(setting)
    if "A" in have:  # alias of "g$lshzxetd"
        have |= set("g$lshzxetd")
    return "".join(f for f in REQUIRED_FLAGS if f not in have)


class KeyspaceWatcher:
    """A thread that calls ``on_removed(keys)`` for the keys under ``prefix`` the server removes.

    Args:
        connect: a new ``redis.Redis`` client for the server (its own connection).
        db: the database whose key events are watched.
        prefix: the tier's store-key prefix (stripped from the keys passed on).
        on_removed: called on the watcher's thread with the removed keys (prefix stripped).
        report_off: called once with the missing flags when notifications are not fully on.
        name: the tier's name (thread name, logs).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        db: int,
        prefix: bytes,
        on_removed: Callable[[list[bytes]], None],
        report_off: Callable[[str], None],
        name: str,
    ) -> None:
        self._connect = connect
        self._channels = [f"__keyevent@{db}__:{e}" for e in EVENTS]
        self._prefix = prefix
        self._on_removed = on_removed
        self._report_off = report_off
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._checked = False
        self._thread = threading.Thread(target=self._run, name=f"kvoffload-tier-{name}-events", daemon=True)
        self._thread.start()

    def wait_subscribed(self, timeout: float) -> bool:
        """Whether the watcher is subscribed (waits up to ``timeout`` seconds)."""
        return self._subscribed.wait(timeout)

    def _check(self, client: Any) -> None:
        if self._checked:
            return
        self._checked = True
        try:
            setting = client.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
        except redis.RedisError as exc:
            self._report_off(f"CONFIG GET refused ({exc})")
            return
        missing = notifications_missing(str(setting))
        if missing:
            self._report_off(f"notify-keyspace-events is {setting!r}, lacks {missing!r}")

    def _run(self) -> None:
        plen = len(self._prefix)
        while not self._stop.is_set():
            client = pubsub = None
            try:
                client = self._connect()
                self._check(client)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*self._channels)
                self._subscribed.set()
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.2)
                    keys = []
                    while msg is not None:
                        data = msg.get("data")
                        if isinstance(data, bytes) and data.startswith(self._prefix):
                            keys.append(data[plen:])
                        msg = pubsub.get_message(timeout=0)
                    if keys:
                        self._on_removed(keys)
            except (redis.RedisError, OSError) as exc:
                self._subscribed.clear()
                logger.debug("keyspace watcher: %s; retrying in 1 s", exc)
                self._stop.wait(1.0)
            finally:
                for c in (pubsub, client):
                    if c is not None:
                        try:
                            c.close()
                        except Exception:  # closing a broken connection must not kill the thread
                            logger.debug("closing the watcher's connection failed", exc_info=True)

    def close(self) -> None:
        """Stop the thread (waits for it)."""
        self._stop.set()
        self._thread.join(timeout=5)
