"""Keys a Redis server forgets on its own or by another client, from its keyspace notifications.

Redis publishes ``__keyevent@<db>__:evicted`` (``maxmemory`` eviction), ``:expired``, ``:del`` and
``:unlink`` with the key as the message when its ``notify-keyspace-events`` setting includes
``E`` (key-event channels) and the classes ``e`` (evicted), ``x`` (expired) and ``g`` (generic
commands: ``DEL``, ``UNLINK``) -- e.g. ``notify-keyspace-events Egex`` (``KEA`` includes them).
:class:`KeyspaceWatcher` subscribes to those channels on its own connection and thread and hands
each key under the tier's prefix to a callback. It never fails the tier: when the setting lacks
what it needs (or ``CONFIG GET`` is refused) it says so once, through ``report_off``, and still
listens (the setting may be changed later); a lost connection is retried every second.

A Redis Cluster node publishes the events of its own keys only: :class:`ClusterWatchers` keeps one
:class:`KeyspaceWatcher` on every master of the slot map, re-read every second, so a replica
promoted by a failover or a master added by a reshard is watched from then on and a node that is no
longer a master is not (replicas repeat their master's deletions: watching them would report each
key twice). A node's notifications off, on any node, is reported like a standalone server's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import redis

from kvoffload.tiers.health import TierUnavailable

__all__ = ["KeyspaceWatcher", "ClusterWatchers", "EVENTS", "REQUIRED_FLAGS"]

logger = logging.getLogger(__name__)

#: the key events that mean a value is gone
EVENTS = ("evicted", "expired", "del", "unlink")
#: ``notify-keyspace-events`` flags needed: key-event channels, evicted, expired, generic commands
REQUIRED_FLAGS = "Eexg"

Addr = tuple[str, int]


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
        self._delivering = threading.Lock()  # held while on_removed runs
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
                        with self._delivering:
                            if not self._stop.is_set():
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

    def stop(self) -> None:
        """Stop reporting: once this returns ``on_removed`` is not called again (the thread ends soon after)."""
        with self._delivering:
            self._stop.set()

    def close(self) -> None:
        """Stop the thread (waits for it)."""
        self.stop()
        self._thread.join(timeout=5)


class ClusterWatchers:
    """A :class:`KeyspaceWatcher` on every master of a Redis Cluster, following its slot map.

    Args:
        masters: the masters of the current slot map (re-read from the cluster; may raise
            :class:`~kvoffload.tiers.health.TierUnavailable`).
        connect: a new ``redis.Redis`` client for a node (its own connection).
        prefix, on_removed, report_off, name: as :class:`KeyspaceWatcher` (``on_removed`` is
            called on the watchers' threads).
        interval: seconds between two reads of the slot map.
    """

    def __init__(
        self,
        masters: Callable[[], set[Addr]],
        connect: Callable[[Addr], Any],
        prefix: bytes,
        on_removed: Callable[[list[bytes]], None],
        report_off: Callable[[str], None],
        name: str,
        interval: float = 1.0,
    ) -> None:
        self._masters = masters
        self._connect = connect
        self._prefix = prefix
        self._on_removed = on_removed
        self._report_off = report_off
        self._name = name
        self._interval = interval
        self._watchers: dict[Addr, KeyspaceWatcher] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvoffload-tier-{name}-events", daemon=True)
        self._thread.start()

    def watching(self) -> set[Addr]:
        """The nodes whose watcher is subscribed now."""
        with self._lock:
            return {a for a, w in self._watchers.items() if w.wait_subscribed(0)}

    def wait_subscribed(self, timeout: float) -> bool:
        """Whether every master of the last slot map read is watched (waits up to ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                watchers = list(self._watchers.values())
            if watchers and all(w.wait_subscribed(max(0.0, deadline - time.monotonic())) for w in watchers):
                return True
            if time.monotonic() >= deadline:
                return False
            self._stop.wait(0.05)

    def _follow(self, masters: set[Addr]) -> None:
        with self._lock:
            gone = [self._watchers.pop(a) for a in list(self._watchers) if a not in masters]
            for w in gone:
                w.stop()  # a demoted master repeats its new master's deletions: not one more report
            for addr in masters - self._watchers.keys():
                self._watchers[addr] = KeyspaceWatcher(
                    partial(self._connect, addr),
                    0,
                    self._prefix,
                    self._on_removed,
                    partial(self._node_off, addr),
                    f"{self._name}-{addr[1]}",
                )
        for w in gone:
            w.close()

    def _node_off(self, addr: Addr, why: str) -> None:
        self._report_off(f"node {addr[0]}:{addr[1]}: {why}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow(self._masters())
            except TierUnavailable as exc:  # no node answered: keep the watchers there are
                logger.debug("keyspace watchers: slot map not read: %s", exc)
            except Exception:  # a bug here must not kill the thread (the tier keeps serving)
                logger.debug("keyspace watchers: following the slot map failed", exc_info=True)
            self._stop.wait(self._interval)

    def close(self) -> None:
        """Stop every watcher and the thread that follows the slot map (waits for them)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            watchers, self._watchers = list(self._watchers.values()), {}
        for w in watchers:
            w.close()
