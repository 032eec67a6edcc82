"""Stores for the tier conformance suite: what the suite needs from a backend besides its :class:`Tier`.

A :class:`TierHarness` starts a store, opens tiers on it (two tiers opened by one harness share
the store, as two engines would), reaches a stored value's raw bytes (to corrupt it, copy it under
another key or namespace, delete it as another client would) and, where it can, takes the store
away and brings it back, or stalls it. Built-in harnesses: ``redis`` (one ``redis-server``),
``redis-cluster`` (three masters on loopback), ``disk`` (a directory). A third party writes one
subclass for its tier and names it ``module:Class`` (see :mod:`kvoffload.testing`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.registry import Registry
from kvoffload.tiers import Tier, TierNamespace, TierSpec, open_tier

__all__ = ["TierHarness", "RedisHarness", "RedisClusterHarness", "DiskHarness", "HARNESSES", "harness_class"]


class TierHarness(ABC):
    """One store for the suite's tests of one module (started once, emptied before each test).

    Subclasses implement :meth:`spec`, :meth:`read_raw`, :meth:`write_raw`, :meth:`delete_raw`,
    and may set :attr:`can_go_away` (:meth:`go_away` / :meth:`come_back`), :attr:`can_stall`
    (:meth:`stall` / :meth:`resume`) and :attr:`can_move` (:meth:`move`); tests needing those are
    skipped otherwise.
    """

    #: whether :meth:`go_away` / :meth:`come_back` are implemented
    can_go_away: ClassVar[bool] = False
    #: whether :meth:`stall` / :meth:`resume` are implemented
    can_stall: ClassVar[bool] = False
    #: whether :meth:`move` is implemented
    can_move: ClassVar[bool] = False
    #: options for tiers in the fault tests (short timeouts and back-off)
    fault_options: ClassVar[dict[str, Any]] = {"backoff_initial": 0.05, "backoff_max": 0.2}

    def setup(self, workdir: Path) -> None:
        """Start the store (files, if any, under ``workdir``)."""
        self.workdir = workdir

    def teardown(self) -> None:
        """Stop the store (nothing by default)."""
        return

    def reset(self) -> None:
        """Empty the store (called before each test; nothing by default)."""
        return

    @abstractmethod
    def spec(self) -> TierSpec:
        """The spec :func:`kvoffload.tiers.open_tier` opens this store with."""

    def open(self, records: np.ndarray, namespace: TierNamespace, **options: Any) -> Tier:
        """A tier on this store over ``records``."""
        return open_tier(self.spec(), records, namespace, **options)

    @abstractmethod
    def read_raw(self, tier: Tier, key: bytes) -> bytes | None:
        """The stored value of ``key`` as ``tier`` would read it (header and record), or None."""

    @abstractmethod
    def write_raw(self, tier: Tier, key: bytes, value: bytes) -> None:
        """Put ``value`` where ``tier`` reads ``key`` from (as a foreign writer would)."""

    @abstractmethod
    def delete_raw(self, tier: Tier, key: bytes) -> None:
        """Remove ``key``'s value (as another client, or the store's own eviction, would)."""

    def go_away(self) -> None:
        """Take the store away (a killed server, a lost mount)."""
        raise NotImplementedError

    def come_back(self) -> None:
        """Bring it back (possibly empty)."""
        raise NotImplementedError

    def stall(self) -> None:
        """Make the store stop answering (connections stay open)."""
        raise NotImplementedError

    def resume(self) -> None:
        """Undo :meth:`stall`."""
        raise NotImplementedError

    def move(self, tier: Tier, keys: list[bytes], half: bool) -> None:
        """Move the parts of the store holding ``keys`` to another node while tiers use them (a
        cluster's slots resharded); ``half``: stop half way, some of each part's values moved
        and the rest not yet (a later call finishes the move to the same node)."""
        raise NotImplementedError


class _Stall:
    """A loopback TCP forwarder whose forwarding can be stopped (a stalled server)."""

    def __init__(self, target_port: int) -> None:
        import socket

        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._go = threading.Event()
        self._go.set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: Any, dst: Any) -> None:
        try:
            while data := src.recv(1 << 20):
                self._go.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def stall(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def close(self) -> None:
        self._closed = True
        self._go.set()
        self._listener.close()


class _RedisValues(TierHarness):
    """Raw values through a client of the harness's server (``_client``); short socket timeouts
    while faults are injected."""

    fault_options = {"backoff_initial": 0.05, "backoff_max": 0.2, "socket_timeout": 0.5, "connect_timeout": 0.5}

    @abstractmethod
    def _client(self) -> Any:
        """A redis-py client of the store (a context manager)."""

    def read_raw(self, tier: Tier, key: bytes) -> bytes | None:
        with self._client() as c:
            value = c.get(tier.store_key(key))  # type: ignore[attr-defined]
        return None if value is None else bytes(value)

    def write_raw(self, tier: Tier, key: bytes, value: bytes) -> None:
        with self._client() as c:
            c.set(tier.store_key(key), value)  # type: ignore[attr-defined]

    def delete_raw(self, tier: Tier, key: bytes) -> None:
        with self._client() as c:
            c.delete(tier.store_key(key))  # type: ignore[attr-defined]


class RedisHarness(_RedisValues):
    """One ``redis-server`` on loopback (Debian's binary), reached through a stallable forwarder."""

    can_go_away = True
    can_stall = True

    def setup(self, workdir: Path) -> None:
        from kvoffload.testing.redis_server import RedisServer

        super().setup(workdir)
        self.server = RedisServer(workdir / "redis").start()
        self.proxy = _Stall(self.server.port)

    def teardown(self) -> None:
        self.proxy.close()
        self.server.stop()

    def reset(self) -> None:
        self.proxy.resume()
        self.server.cli("flushall")

    def spec(self) -> TierSpec:
        return f"redis://127.0.0.1:{self.proxy.port}"

    def _client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.server.port)

    def go_away(self) -> None:
        self.server.kill()

    def come_back(self) -> None:
        self.server.start()

    def stall(self) -> None:
        self.proxy.stall()

    def resume(self) -> None:
        self.proxy.resume()


class RedisClusterHarness(_RedisValues):
    """A 3-master Redis Cluster on loopback; going away is one master killed (its shard's keys
    unreachable), coming back is that master restarted empty with its slots; a move migrates the
    keys' slots to the next master (``MOVED``), half way: ``ASK``."""

    can_go_away = True
    can_move = True

    def setup(self, workdir: Path) -> None:
        from kvoffload.testing.redis_server import RedisCluster3

        super().setup(workdir)
        self.cluster = RedisCluster3(workdir / "cluster").start()

    def teardown(self) -> None:
        self.cluster.stop()

    def reset(self) -> None:
        for n in self.cluster.nodes:
            n.cli("flushall")

    def spec(self) -> TierSpec:
        return self.cluster.url

    def _client(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.cluster.nodes])

    def go_away(self) -> None:
        self.cluster.nodes[0].kill()

    def move(self, tier: Tier, keys: list[bytes], half: bool) -> None:
        import redis
        from redis.crc import key_slot

        masters = sorted(self.cluster.masters().items())  # (port, node id)
        ports = [p for p, _ in masters]
        store_keys = [tier.store_key(k) for k in keys]  # type: ignore[attr-defined]
        with self._client() as c:
            owner = {key_slot(k): c.get_node_from_key(k).port for k in store_keys}
        for slot, src in owner.items():
            dst = ports[(ports.index(src) + 1) % len(ports)]
            ids = dict(masters)
            src_node, dst_node = self.cluster.node(src), self.cluster.node(dst)
            dst_node.cli("cluster", "setslot", str(slot), "importing", ids[src])
            src_node.cli("cluster", "setslot", str(slot), "migrating", ids[dst])
            with redis.Redis(port=src) as r:
                held = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
                moving = held[: (len(held) + 1) // 2] if half else held
                if moving:
                    r.execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *moving)
            if not half:
                for n in (dst_node, src_node, *(self.cluster.node(p) for p in ports if p not in (src, dst))):
                    n.cli("cluster", "setslot", str(slot), "node", ids[dst])

    def come_back(self) -> None:
        node = self.cluster.nodes[0]
        node.start()
        deadline = time.monotonic() + 30
        while "cluster_state:ok" not in node.cli("cluster", "info"):
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted cluster node did not reach cluster_state:ok")
            time.sleep(0.05)


class DiskHarness(TierHarness):
    """A directory (buffered I/O, so the suite runs on any filesystem); going away is the
    directory moved aside (a lost mount), coming back is it moved back."""

    can_go_away = True

    def setup(self, workdir: Path) -> None:
        super().setup(workdir)
        self.root = workdir / "disk"

    def reset(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)

    def spec(self) -> TierSpec:
        return f"disk:{self.root}?o_direct=0"

    def read_raw(self, tier: Tier, key: bytes) -> bytes | None:
        try:
            return Path(tier.value_path(key)).read_bytes()  # type: ignore[attr-defined]
        except FileNotFoundError:
            return None

    def write_raw(self, tier: Tier, key: bytes, value: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(tier.value_path(key)))  # type: ignore[attr-defined]
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.replace(tmp, tier.value_path(key))  # type: ignore[attr-defined]

    def delete_raw(self, tier: Tier, key: bytes) -> None:
        Path(tier.value_path(key)).unlink(missing_ok=True)  # type: ignore[attr-defined]

    def go_away(self) -> None:
        self.root.rename(self.root.with_name("disk-away"))
        self.root.write_bytes(b"")  # a file where the directory was: nothing is created under it

    def come_back(self) -> None:
        self.root.unlink()
        self.root.with_name("disk-away").rename(self.root)


#: harness name -> class (built-ins; ``module:Class`` names an out-of-tree one)
HARNESSES: Registry[TierHarness] = Registry(
    "tier harness",
    TierHarness,
    {
        "redis": "kvoffload.testing.tier_harness:RedisHarness",
        "redis-cluster": "kvoffload.testing.tier_harness:RedisClusterHarness",
        "disk": "kvoffload.testing.tier_harness:DiskHarness",
    },
)


def harness_class(name: str) -> type[TierHarness]:
    """The harness ``name`` selects (a built-in name or ``module:Class``)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"tier harness must be a name or 'module:Class', got {name!r}")
    return HARNESSES.get(name)
