"""RedisTier: a tier on Redis or Redis Cluster (redis-py with hiredis), shared by every engine using it.

Lookups are one pipeline of ``EXISTS``, loads pipelines of ``GET``, stores pipelines of
``SET … NX`` (the first writer of a block wins; values are immutable). Stores and loads go through
:mod:`kvoffload.tiers.redis_io`, which avoids redis-py's copies of multi-MiB values. A cluster spreads keys
over its shards by hash slot; a pipeline is split per shard by redis-py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvoffload.errors import InvalidArgumentError
from kvoffload.tiers.base import FAILED, PRESENT, STORED, Tier
from kvoffload.tiers.health import TierUnavailable
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.record import ValueRejected
from kvoffload.tiers.redis_io import get_into, pools_for_keys, set_nx
from kvoffload.tiers.redis_url import RedisConfig, parse_redis_url

__all__ = ["RedisTier"]

logger = logging.getLogger(__name__)

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ClusterError, RedisClusterException, OSError)


class RedisTier(Tier):
    """A tier on a Redis server or Redis Cluster (docs/contract.md §8).

    Args:
        records: the host pool's records (see :class:`~kvoffload.tiers.Tier`).
        namespace: the namespace whose fingerprint prefixes every key.
        url: ``redis://[user[:password]@]host[:port][,host:port…][/db][?options]``,
            ``rediss://…`` (TLS) or ``unix:///path/redis.sock``.
        cluster: use Redis Cluster (default: when the URL names several hosts or has
            ``cluster=true``).
        username / password: ACL credentials (override the URL's).
        socket_timeout / connect_timeout: seconds before an operation / a connect fails.
        max_connections: connection-pool size (default: ``io_threads + 2``).
        key_prefix: prefix of the store keys (default ``"kvo"``).
        ssl_ca_certs / ssl_cert_reqs: TLS options for ``rediss://``.
        **tier_options: ``name``, ``integrity_key``, ``io_threads``, ``batch_keys``… of
            :class:`~kvoffload.tiers.Tier`.

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
        **tier_options: Any,
    ) -> None:
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
        )
        tier_options.setdefault("name", self.config.display())
        io_threads = tier_options.get("io_threads", 4)
        if isinstance(io_threads, int) and (self.config.max_connections or io_threads + 1) < io_threads + 1:
            raise InvalidArgumentError(
                f"max_connections must be >= io_threads + 1 = {io_threads + 1} (the I/O threads and the lookup "
                f"thread each hold one connection), got {self.config.max_connections}"
            )
        super().__init__(records, namespace, **tier_options)
        self._prefix = f"{self.config.key_prefix}:{self.fingerprint.hex()}:".encode()
        self._client_lock = threading.Lock()
        self._local = threading.local()
        self._client: redis.Redis | RedisCluster | None = None
        self._pool_size = self.config.max_connections or (self.io_threads + 2)

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """``{"url": url}`` once the URL and its query options are checked."""
        parse_redis_url(url)
        return {"url": url}

    def store_key(self, key: bytes) -> bytes:
        """The Redis key of ``key``'s value."""
        return self._prefix + key

    # ------------------------------------------------------------------ connection
    def _connect_kwargs(self) -> dict[str, Any]:
        c = self.config
        kw: dict[str, Any] = {
            "username": c.username,
            "password": c.password,
            "socket_timeout": c.socket_timeout,
            "socket_connect_timeout": c.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if c.scheme == "rediss":
            kw["ssl"] = True
            kw.update(c.ssl)
        return kw

    def _get_client(self) -> redis.Redis | RedisCluster:
        """The client, created on first use (a cluster client discovers its shards then)."""
        client = self._client
        if client is not None:
            return client
        with self._client_lock:
            if self._client is None:
                c = self.config
                kw = self._connect_kwargs()
                try:
                    if c.cluster:
                        nodes = [ClusterNode(h, p) for h, p in c.nodes]
                        self._client = RedisCluster(
                            startup_nodes=nodes, max_connections=self._pool_size, require_full_coverage=True, **kw
                        )
                    elif c.scheme == "unix":
                        pool = redis.BlockingConnectionPool(
                            connection_class=redis.UnixDomainSocketConnection,
                            path=c.path,
                            db=c.db,
                            max_connections=self._pool_size,
                            timeout=c.connect_timeout + c.socket_timeout,
                            **{k: v for k, v in kw.items() if k != "ssl"},
                        )
                        self._client = redis.Redis(connection_pool=pool)
                    else:
                        host, port = c.nodes[0]
                        cls = redis.SSLConnection if c.scheme == "rediss" else redis.Connection
                        pool = redis.BlockingConnectionPool(
                            connection_class=cls,
                            host=host,
                            port=port,
                            db=c.db,
                            max_connections=self._pool_size,
                            timeout=c.connect_timeout + c.socket_timeout,
                            **{k: v for k, v in kw.items() if k != "ssl"},
                        )
                        self._client = redis.Redis(connection_pool=pool)
                except _UNAVAILABLE as exc:
                    raise TierUnavailable(str(exc)) from exc
            return self._client

    def _pipeline(self) -> Any:
        return self._get_client().pipeline(transaction=False)

    def _execute(self, pipe: Any) -> list[Any]:
        try:
            return list(pipe.execute(raise_on_error=False))
        except _UNAVAILABLE as exc:
            if self.config.cluster:
                self._reset_cluster()
            raise TierUnavailable(f"{type(exc).__name__}: {exc}") from exc
        finally:
            pipe.reset()

    def _reset_cluster(self) -> None:
        """Drop a cluster client after an outage: the next use rediscovers the shards."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client must not mask the outage
                logger.debug("closing the cluster client failed", exc_info=True)

    # ------------------------------------------------------------------ backend hooks
    def _probe(self, keys: list[bytes]) -> list[bool]:
        pipe = self._pipeline()
        for k in keys:
            pipe.exists(self._prefix + k)
        return [r is not None and not isinstance(r, Exception) and int(r) > 0 for r in self._execute(pipe)]

    def _store_batch(self, keys: list[bytes], slots: np.ndarray) -> list[int]:
        store_keys = [self._prefix + k for k in keys]
        out = [FAILED] * len(keys)
        try:
            for pool, idx in pools_for_keys(self._get_client(), store_keys):
                items = []
                for i in idx:
                    payload = self.records[slots[i]]
                    items.append((store_keys[i], self.codec.header(keys[i], payload), payload.data))
                for i, r in zip(idx, set_nx(pool, items), strict=True):
                    if isinstance(r, Exception):
                        self._count_error("store", r)
                    else:
                        out[i] = STORED if r else PRESENT
        except _UNAVAILABLE as exc:
            if self.config.cluster:
                self._reset_cluster()
            raise TierUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return out

    def _bounce(self, nbytes: int) -> memoryview:
        """This thread's receive buffer of at least ``nbytes`` (values are checked there, then copied)."""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = self._local.buf = bytearray(nbytes)
        return memoryview(buf)

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        store_keys = [self._prefix + k for k in keys]
        expected = [self.codec.value_bytes(k) for k in keys]
        ok = [False] * len(keys)
        bad: list[bytes] = []
        try:
            for pool, idx in pools_for_keys(self._get_client(), store_keys):
                dest = self._bounce(sum(expected[i] for i in idx))
                got = get_into(pool, [store_keys[i] for i in idx], dest, [expected[i] for i in idx])
                offset = 0
                for i, n in zip(idx, got, strict=True):
                    value = dest[offset : offset + expected[i]]
                    offset += expected[i]
                    if n is None:
                        continue  # absent: evicted or deleted
                    try:
                        if n < 0:
                            raise ValueRejected("length")
                        payload = self.codec.check(keys[i], value)
                    except ValueRejected as rej:
                        self._count_rejected(rej.reason)
                        if rej.delete:
                            bad.append(store_keys[i])
                        continue
                    self.records[slots[i]] = np.frombuffer(payload, dtype=np.uint8)
                    ok[i] = True
            if bad:
                pipe = self._pipeline()
                for rk in bad:
                    pipe.delete(rk)
                self._execute(pipe)
        except _UNAVAILABLE as exc:
            if self.config.cluster:
                self._reset_cluster()
            raise TierUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return ok

    def _close_backend(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
            if isinstance(client, redis.Redis):
                client.connection_pool.disconnect()
