"""RedisTier: a tier on Redis or Redis Cluster, shared by every engine using it.

Lookups are one pipeline of ``EXISTS`` per node, loads pipelines of ``GET``, stores pipelines of
``SET … NX`` (the first writer of a block wins; values are immutable). Every command goes
through :mod:`kvoffload.tiers.redis.io` (RESP2 or RESP3, multi-MiB values without redis-py's
copies) and is routed by :class:`~kvoffload.tiers.redis.nodes.RedisNodes`, which follows a
cluster's ``MOVED`` / ``ASK`` replies and keeps a health per node: a dead master makes its keys
miss and their writes drop while the other shards keep serving.

A value is deleted only when it was read, failed its check for every reader (corrupt, or
another namespace under this namespace's key), and is still the value that was read; never on
an absent key, a redirect, an error reply or a timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import redis
from redis.exceptions import ResponseError

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.tiers.base import Tier
from kvoffload.tiers.health import TierUnavailable
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.record import ValueRejected
from kvoffload.tiers.redis.check import check_nodes
from kvoffload.tiers.redis.events import ClusterWatchers, KeyspaceWatcher
from kvoffload.tiers.redis.io import HEAD_BYTES, Mismatch, Redirect, delete_if_head, exists, get_into, set_nx
from kvoffload.tiers.redis.nodes import DOWN, RedisNodes, Unreached
from kvoffload.tiers.redis.probe import InlineProbe
from kvoffload.tiers.redis.url import RedisConfig, parse_redis_url
from kvoffload.tiers.types import DROPPED, FAILED, PRESENT, STORED

__all__ = ["RedisTier"]

logger = logging.getLogger(__name__)


class RedisTier(Tier):
    """A tier on a Redis server or Redis Cluster (docs/contract.md §8).

    Args:
        records: the host pool's records (see :class:`~kvoffload.tiers.Tier`).
        namespace: the namespace whose fingerprint prefixes every key.
        url: ``redis://[user[:password]@]host[:port][,host:port…][/db][?options]``,
            ``rediss://…`` (TLS) or ``unix:///path/redis.sock``.
        cluster: use Redis Cluster (default: when the URL names several hosts or has
            ``cluster=true``).
        username: ACL user (overrides the URL's).
        password: ACL password (overrides the URL's).
        socket_timeout: seconds before an operation fails.
        connect_timeout: seconds before a connect fails.
        max_connections: connection-pool size (default: ``io_threads + 2``).
        key_prefix: prefix of the store keys (default ``"kvo"``).
        ssl_ca_certs: CA bundle that signs the server's certificate (``rediss://``).
        ssl_cert_reqs: ``"required"`` (default) or ``"none"`` (``rediss://``).
        protocol: RESP version, 2 or 3 (default: redis-py's).
        removal_events: watch the server's keyspace notifications (:mod:`kvoffload.tiers.redis.events`;
            the server needs ``notify-keyspace-events Egex`` or more): every key of this tier the
            server evicts, expires or sees deleted is reported by :meth:`take_removed`, and so is
            every key whose value a load rejects (namespace, integrity or corruption check): once,
            by the ``del`` notification of the tier's own delete, or by the tier where it deletes
            nothing (or the notifications are off). On a cluster every master is watched (the
            slot map is re-read every second: promoted replicas and new masters are followed)
            and a removal is reported once the key is absent where the slot map routes it (a
            reshard's ``MIGRATE`` is not one).
        **tier_options: ``name``, ``integrity_key``, ``io_threads``, ``batch_keys``… of
            :class:`~kvoffload.tiers.Tier` (they override the same options in the URL's query).

    Construction checks everything and connects nothing: a server down at start is an outage
    like any later one (lookups miss until it answers).
    """

    def __init__(
        self,
        records: np.ndarray | memoryview,
        namespace: TierNamespace,
        url: str = "redis://127.0.0.1:6379",
        *,
        cluster: bool | None = None,
        username: str | None = None,
        password: str | None = None,
        socket_timeout: float | None = None,
        connect_timeout: float | None = None,
        max_connections: int | None = None,
        key_prefix: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_cert_reqs: str | None = None,
        protocol: int | None = None,
        removal_events: bool = False,
        **tier_options: Any,
    ) -> None:
        if not isinstance(removal_events, bool):
            raise InvalidTypeError(f"removal_events must be a bool, got {type(removal_events).__name__}")
        self.config: RedisConfig = parse_redis_url(
            url,
            cluster=cluster,
            username=username,
            password=password,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            key_prefix=key_prefix,
            ssl_ca_certs=ssl_ca_certs,
            ssl_cert_reqs=ssl_cert_reqs,
            protocol=protocol,
        )
        tier_options = {**self.config.tier_options, **tier_options}
        tier_options.setdefault("name", self.config.display())
        io_threads = tier_options.get("io_threads", 4)
        if isinstance(io_threads, int) and (self.config.max_connections or io_threads + 1) < io_threads + 1:
            raise InvalidArgumentError(
                f"max_connections must be >= io_threads + 1 = {io_threads + 1} (the I/O threads and the lookup "
                f"thread each hold one connection), got {self.config.max_connections}"
            )
        super().__init__(records, namespace, **tier_options)
        self._prefix = f"{self.config.key_prefix}:{self.fingerprint.hex()}:".encode()
        self._local = threading.local()
        self._nodes = RedisNodes(
            self.config,
            self.name,
            self.config.max_connections or (self.io_threads + 2),
            (tier_options.get("backoff_initial", 0.1), tier_options.get("backoff_max", 5.0)),
            self.counters.count,
        )
        # a standalone server's probes sent and read on the engine thread (not through TLS, whose
        # buffered bytes select cannot see)
        self._inline = None
        if not self.config.cluster and self.config.scheme in ("redis", "unix"):
            self._inline = InlineProbe(self._probe_connection, self._prefix, self.config.connect_timeout)
            self._on_lookup_thread(self._inline.connect)  # the first lookups may probe on the engine thread
        self._watcher: KeyspaceWatcher | ClusterWatchers | None = None
        self._removal_events = removal_events
        if removal_events and self.config.cluster:
            self._watcher = ClusterWatchers(
                self._nodes.masters,
                self._watch_client,
                self._prefix,
                self._note_gone,
                self.counters.removal_events_off,
                self.name,
            )
        elif removal_events:
            self._watcher = KeyspaceWatcher(
                partial(self._watch_client, None),
                self.config.db,
                self._prefix,
                self.counters.removed,
                self.counters.removal_events_off,
                self.name,
            )
        if not self.codec.signs:
            logger.warning(
                "tier %s has no integrity_key: any client that can write to this Redis can make the "
                "engines load KV it forged (see docs/tiers.md, Security)",
                self.name,
            )

    def _watch_client(self, addr: tuple[str, int] | None) -> redis.Redis:
        """A client of its own for a keyspace watcher: of ``addr`` (a cluster node), or of the
        standalone server (``None``)."""
        c = self.config
        kw: dict[str, Any] = {"username": c.username, "password": c.password, "db": 0 if c.cluster else c.db}
        kw.update(socket_connect_timeout=c.connect_timeout)
        if c.scheme == "unix":
            return redis.Redis(unix_socket_path=c.path, **kw)
        host, port = addr or c.nodes[0]
        if c.scheme == "rediss":
            kw.update(ssl=True, **c.ssl)
        return redis.Redis(host=host, port=port, **kw)

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """``{"url": url}`` once the URL and its query options are checked."""
        parse_redis_url(url)
        return {"url": url}

    def store_key(self, key: bytes) -> bytes:
        """The Redis key of ``key``'s value."""
        return self._prefix + key

    # ------------------------------------------------------------------ backend hooks
    def _check_store(self) -> None:
        c = self.config
        check_nodes(self.name, c.nodes or [("unix", 0)], self._nodes.pool, c.scheme == "rediss", c.connect_timeout)

    def _probe(self, keys: list[bytes]) -> list[bool]:
        sk = [self._prefix + k for k in keys]
        replies = self._nodes.run(sk, lambda pool, idx, asking: exists(pool, [sk[i] for i in idx], asking))
        if self._inline is not None:
            self._inline.connect()  # the server answers: the next probes may go on the engine thread
        return [isinstance(r, int) and r > 0 for r in replies]

    def _probe_now(self, keys: list[bytes], wait: float) -> list[bool] | Callable[[], list[bool]] | None:
        return None if self._inline is None else self._inline.ask(keys, wait)

    def _probe_connection(self) -> Any:
        """A new, unconnected connection to the standalone server, outside the pool."""
        pool = self._nodes.pool(self.config.nodes[0] if self.config.nodes else ("unix", 0))
        return pool.connection_class(**pool.connection_kwargs)

    def _store_batch(self, keys: list[bytes], slots: np.ndarray) -> list[int]:
        sk = [self._prefix + k for k in keys]

        def send(pool: Any, idx: list[int], asking: list[bool]) -> list[Any]:
            items = []
            for i in idx:
                payload = self.records[slots[i]]
                items.append((sk[i], self.codec.header(keys[i], payload), payload.data))
            return set_nx(pool, items, asking)

        out = []
        for r in self._nodes.run(sk, send):
            if r is DOWN:
                out.append(DROPPED)
            elif isinstance(r, (Unreached, Redirect)):
                out.append(FAILED)
            elif isinstance(r, ResponseError):
                self.counters.error("store", r)
                out.append(FAILED)
            else:
                out.append(PRESENT if r is None else STORED)
        return out

    def _headers(self, nbytes: int) -> memoryview:
        """This thread's buffer for the value headers of one load batch (at least ``nbytes``)."""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = self._local.buf = bytearray(nbytes)
        return memoryview(buf)

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        """``GET`` pipelines whose replies land with no copy: each value's header in a small
        buffer, its payload straight into its host record, checked there (a record that fails a
        check holds unspecified bytes: its key fails and the caller frees the slot)."""
        sk = [self._prefix + k for k in keys]
        head_len = [self.codec.header_bytes(k) for k in keys]
        heads = self._headers(sum(head_len))
        records = self.records
        dests: list[tuple[memoryview, memoryview]] = []
        offset = 0
        for n, slot in zip(head_len, slots.tolist(), strict=True):
            dests.append((heads[offset : offset + n], records[slot].data))
            offset += n
        replies = self._nodes.run(
            sk, lambda pool, idx, asking: get_into(pool, [sk[i] for i in idx], [dests[i] for i in idx], asking)
        )
        ok = [False] * len(keys)
        bad: list[tuple[int, int, bytes]] = []  # (index, length, first bytes) of values to delete
        kept: list[bytes] = []  # keys of rejected values not deleted (integrity rejections)
        for i, r in enumerate(replies):
            if r is None:
                self.counters.count("absent")
            elif isinstance(r, ResponseError):
                self.counters.error("load", r)
            elif isinstance(r, int) and not isinstance(r, bool):
                header, row = dests[i]
                try:
                    self.codec.check_parts(keys[i], header, row)
                except ValueRejected as rej:
                    self.counters.rejected(rej)
                    if rej.delete:
                        bad.append((i, r, (bytes(header) + bytes(row[:HEAD_BYTES]))[:HEAD_BYTES]))
                    else:
                        kept.append(keys[i])
                    continue
                ok[i] = True
            elif isinstance(r, Mismatch):
                self.counters.rejected(
                    ValueRejected("truncated" if r.length < head_len[i] + self.record_bytes else "length")
                )
                bad.append((i, r.length, r.head))
            # else: not answered (node down, failed, still redirected): a failed key, nothing else
        if bad:
            kept += self._delete(keys, sk, bad)
        if kept and self._removal_events:
            self.counters.removed(kept)
        return ok

    def _delete(self, keys: list[bytes], sk: list[bytes], bad: list[tuple[int, int, bytes]]) -> list[bytes]:
        """Delete the rejected values that are still the values read (counted in ``deleted_values``);
        returns the keys whose removal the keyspace watcher will not report (not deleted here, or
        no watcher listening)."""
        dk = [sk[i] for i, _, _ in bad]
        try:
            replies = self._nodes.run(
                dk,
                lambda pool, idx, asking: delete_if_head(pool, [(dk[j], bad[j][1], bad[j][2]) for j in idx], asking),
            )
        except TierUnavailable:  # the values stay; the loads of this batch still count
            replies = [None] * len(bad)
        deleted = [r == 1 and not isinstance(r, bool) for r in replies]
        self.counters.count("deleted_values", sum(deleted))
        watched = self._watcher is not None and not self.counters.stats.removal_events_off
        return [keys[i] for (i, _, _), d in zip(bad, deleted, strict=True) if not (d and watched)]

    def _note_gone(self, keys: list[bytes]) -> None:
        """A cluster node's removals: those of ``keys`` not present where the slot map now routes
        them (a reshard's ``MIGRATE`` deletes a key from its old node as ``del``; it is not gone)."""
        sk = [self._prefix + k for k in keys]
        try:
            there = self._nodes.run(sk, lambda pool, idx, asking: exists(pool, [sk[i] for i in idx], asking))
        except TierUnavailable:
            there = [None] * len(keys)
        gone = [k for k, r in zip(keys, there, strict=True) if not (isinstance(r, int) and r > 0)]
        if gone:
            self.counters.removed(gone)

    def _close_backend(self) -> None:
        if self._inline is not None:
            self._inline.close()
        if self._watcher is not None:
            self._watcher.close()
        self._nodes.close()
