"""The servers behind a Redis tier: a connection pool and a health per node, a cluster's slot map,
and pipelined commands routed per node with ``MOVED`` and ``ASK`` followed.

A standalone server is the whole tier: when it cannot be reached :meth:`RedisNodes.run` raises
:class:`~kvoffload.tiers.health.TierUnavailable` (the tier backs off). A cluster's nodes fail
alone: the keys of an unreachable node answer :data:`DOWN` (in back-off, not tried) or
:data:`FAILED` (tried: refused, reset, timed out), that node backs off on its own, and the slot
map is refreshed (at most every ``refresh_interval`` seconds) so the keys follow a promoted
replica; the other nodes keep serving.

A ``MOVED`` reply updates that slot in the map, refreshes the whole map and sends the command to
the named node; an ``ASK`` reply sends it there once, after ``ASKING``. A command still
redirected after :data:`MAX_REDIRECTS` rounds answers its last :class:`Redirect`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from kvoffload.tiers.health import Health, TierUnavailable
from kvoffload.tiers.redis.io import Redirect, command, pipeline
from kvoffload.tiers.redis.url import RedisConfig

__all__ = ["Unreached", "DOWN", "FAILED", "MAX_REDIRECTS", "RedisNodes", "UNAVAILABLE"]

#: Exceptions that mean a node could not be reached (refused, reset, timed out, auth failed).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, OSError)

#: Redirect rounds followed per command.
MAX_REDIRECTS = 5

Addr = tuple[str, int]
#: ``send(pool, indices, asking)``: one pipeline of the commands of ``keys[indices]`` on ``pool``,
#: ``ASKING`` first where ``asking[j]``; one reply per index.
Send = Callable[[Any, list[int], list[bool]], list[Any]]


class Unreached(enum.Enum):
    """Why a command got no reply: its node was in back-off (not tried) or failed while asked."""

    DOWN = "down"
    FAILED = "failed"


DOWN = Unreached.DOWN
FAILED = Unreached.FAILED


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, (redis.TimeoutError, TimeoutError))


class RedisNodes:
    """Connection pools, node health and (for a cluster) the slot map of one Redis tier.

    Args:
        config: the checked URL and options.
        name: the tier's name (for log lines).
        pool_size: connections per node.
        backoff: ``(initial, maximum)`` back-off of an unreachable cluster node, seconds.
        count: ``count(counter, n)`` adds ``n`` to the tier counter ``"redirected"`` or ``"timed_out"``.
        refresh_interval: least seconds between two slot-map refreshes.
    """

    def __init__(
        self,
        config: RedisConfig,
        name: str,
        pool_size: int,
        backoff: tuple[float, float],
        count: Callable[[str, int], None],
        refresh_interval: float = 0.1,
    ) -> None:
        self.config = config
        self._name = name
        self._pool_size = pool_size
        self._backoff = backoff
        self._count = count
        self._refresh_interval = refresh_interval
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._pools: dict[Addr, Any] = {}
        self._health: dict[Addr, Health] = {}
        self._slots: list[Addr | None] | None = None
        self._known: list[Addr] = list(config.nodes)
        self._refreshed = 0.0

    # ------------------------------------------------------------------ pools
    def _pool_kwargs(self) -> dict[str, Any]:
        c = self.config
        kw: dict[str, Any] = {
            "username": c.username,
            "password": c.password,
            "socket_timeout": c.socket_timeout,
            "socket_connect_timeout": c.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "max_connections": self._pool_size,
            "timeout": c.connect_timeout + c.socket_timeout,
        }
        if c.protocol is not None:
            kw["protocol"] = c.protocol
        if c.scheme == "unix":
            kw.update(connection_class=redis.UnixDomainSocketConnection, path=c.path, db=c.db)
            kw.pop("socket_connect_timeout")
        else:
            kw.update(connection_class=redis.SSLConnection if c.scheme == "rediss" else redis.Connection)
            if c.scheme == "rediss":
                kw.update(c.ssl)
            if not c.cluster:
                kw["db"] = c.db
        return kw

    def pool(self, addr: Addr) -> Any:
        """The connection pool of ``addr`` (created on first use; connects nothing)."""
        p = self._pools.get(addr)
        if p is None:
            with self._lock:
                p = self._pools.get(addr)
                if p is None:
                    kw = self._pool_kwargs()
                    if self.config.scheme != "unix":
                        kw.update(host=addr[0], port=addr[1])
                    p = self._pools[addr] = redis.BlockingConnectionPool(**kw)
        return p

    def _node_health(self, addr: Addr) -> Health:
        h = self._health.get(addr)
        if h is None:
            with self._lock:
                h = self._health.setdefault(addr, Health(f"{self._name} node {addr[0]}:{addr[1]}", *self._backoff))
        return h

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.disconnect()

    # ------------------------------------------------------------------ routing
    def run(self, keys: Sequence[bytes], send: Send) -> list[Any]:
        """``send`` the commands of ``keys`` to the nodes that own them; one reply per key, or
        :data:`DOWN` / :data:`FAILED` for a cluster node that could not be asked."""
        if not self.config.cluster:
            addr = self.config.nodes[0] if self.config.nodes else ("unix", 0)
            try:
                return send(self.pool(addr), list(range(len(keys))), [False] * len(keys))
            except UNAVAILABLE as exc:
                if _timed_out(exc):
                    self._count("timed_out", len(keys))
                raise TierUnavailable(f"{type(exc).__name__}: {exc}") from exc
        slots = self._slot_map()
        n = len(keys)
        out: list[Any] = [None] * n
        target: list[Addr | None] = [slots[key_slot(k)] for k in keys]
        asking = [False] * n
        pending = list(range(n))
        for rnd in range(MAX_REDIRECTS + 1):
            if rnd:
                self._count("redirected", len(pending))
            groups: dict[Addr, list[int]] = {}
            for i in pending:
                groups.setdefault(target[i] or self._known[0], []).append(i)
            pending, refresh = [], False
            for addr, idx in groups.items():
                redirects = self._send_to(addr, idx, asking, send, out)
                refresh |= redirects is None
                for i in redirects or ():
                    r: Redirect = out[i]
                    to = (r.host or addr[0], r.port)
                    target[i], asking[i] = to, r.ask
                    if not r.ask:
                        slots[r.slot] = to
                        refresh = True
                    pending.append(i)
            if refresh:
                self._refresh(force=False)
            if not pending:
                break
        return out

    def _send_to(self, addr: Addr, idx: list[int], asking: list[bool], send: Send, out: list[Any]) -> list[int] | None:
        """One pipeline to ``addr``; replies into ``out``. The indices redirected, or None when
        the node could not be asked."""
        health = self._node_health(addr)
        if health.is_down():
            for i in idx:
                out[i] = DOWN
            return None
        try:
            replies = send(self.pool(addr), idx, [asking[i] for i in idx])
        except UNAVAILABLE as exc:
            health.failed(exc)
            if _timed_out(exc):
                self._count("timed_out", len(idx))
            for i in idx:
                out[i] = FAILED
            return None
        health.succeeded()
        redirected = []
        for i, r in zip(idx, replies, strict=True):
            out[i] = r
            if isinstance(r, Redirect):
                redirected.append(i)
        return redirected

    # ------------------------------------------------------------------ slot map
    def _slot_map(self) -> list[Addr | None]:
        slots = self._slots
        if slots is None:
            self._refresh(force=True)
            slots = self._slots
            if slots is None:
                raise TierUnavailable(f"no node of {self.config.display()} answered CLUSTER SLOTS")
        return slots

    def masters(self) -> set[Addr]:
        """The masters of the slot map, read from the cluster now (raises
        :class:`~kvoffload.tiers.health.TierUnavailable` when no node answers)."""
        self._refresh(force=True)
        return {a for a in self._slot_map() if a is not None}

    def _refresh(self, force: bool) -> None:
        """Ask a reachable node for ``CLUSTER SLOTS`` and replace the slot map (rate-limited)."""
        if not force and time.monotonic() - self._refreshed < self._refresh_interval:
            return
        if not self._refresh_lock.acquire(blocking=force):
            return  # another thread is refreshing
        try:
            self._refreshed = time.monotonic()
            order = sorted(self._known, key=lambda a: self._node_health(a).is_down())
            for addr in order:
                try:
                    (reply,) = pipeline(self.pool(addr), [command(b"CLUSTER", b"SLOTS")], [False])
                except UNAVAILABLE as exc:
                    self._node_health(addr).failed(exc)
                    continue
                if isinstance(reply, list) and reply:
                    self._install(addr, reply)
                    return
        finally:
            self._refresh_lock.release()

    def _install(self, asked: Addr, reply: list[Any]) -> None:
        slots: list[Addr | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        known = dict.fromkeys(self._known)
        for entry in reply:
            start, end, *nodes = entry
            master = None
            for j, node in enumerate(nodes):
                host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
                addr = (host or asked[0], int(node[1]))
                known[addr] = None
                if j == 0:
                    master = addr
            slots[int(start) : int(end) + 1] = [master] * (int(end) - int(start) + 1)
        self._slots = slots
        self._known = list(known)
