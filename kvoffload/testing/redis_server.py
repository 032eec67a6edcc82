"""Start real ``redis-server`` processes on loopback: one server, or a 3-master Redis Cluster.

For tests, benchmarks and demos (Debian's ``redis-server`` / ``redis-cli``; no in-process fake).
Servers run with persistence off, ``maxmemory`` and ``allkeys-lru``, on a free port of
127.0.0.1 (and a unix socket), in a caller-given directory; :meth:`RedisServer.kill` sends
SIGKILL and :meth:`RedisServer.start` restarts on the same port.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["redis_binaries_problem", "free_port", "RedisServer", "RedisCluster3"]


def redis_binaries_problem() -> str | None:
    """Why the Redis binaries cannot be used here, or ``None``."""
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH (apt-get install -y redis-server redis-tools)"
    return None


def free_port(cluster: bool = False) -> int:
    """A TCP port of 127.0.0.1 free right now; for a cluster node <= 55535 with port + 10000 free too."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = random.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))  # the cluster bus
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on 127.0.0.1:``port`` and ``<workdir>/redis.sock``.

    Args:
        workdir: directory for the server's files (socket, cluster config, log).
        maxmemory: the server's ``maxmemory`` (with ``allkeys-lru``).
        cluster: start with ``--cluster-enabled yes``.
        extra: more ``redis-server`` arguments.
        tls: serve TLS only (``rediss://``), with a self-signed certificate for 127.0.0.1 made
            with ``openssl`` in ``workdir`` (:attr:`ca_file`).
    """

    def __init__(
        self,
        workdir: str | Path,
        maxmemory: str = "512mb",
        cluster: bool = False,
        extra: tuple[str, ...] = (),
        tls: bool = False,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(cluster)
        self.maxmemory = maxmemory
        self.cluster = cluster
        self.extra = extra
        self.tls = tls
        self.ca_file = str(self.workdir / "cert.pem")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` (``rediss://`` with TLS)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> str:
        """The server's unix socket."""
        return str(self.workdir / f"redis-{self.port}.sock")

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (or restart after :meth:`kill`) and wait until it answers PING."""
        args = [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--unixsocket", self.socket_path,
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--maxmemory", self.maxmemory,
            "--maxmemory-policy", "allkeys-lru",
            "--dir", str(self.workdir),
            "--logfile", str(self.workdir / f"redis-{self.port}.log"),
        ]  # fmt: skip
        if self.tls:
            self._make_cert()
            key = str(self.workdir / "key.pem")
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(self.port), "--tls-cert-file", self.ca_file, "--tls-key-file", key]
            args += ["--tls-ca-cert-file", self.ca_file, "--tls-auth-clients", "no"]
        if self.cluster:
            conf = self.workdir / f"nodes-{self.port}.conf"
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(conf), "--cluster-node-timeout", "2000"]
        self.proc = subprocess.Popen([*args, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (self._tls_ping() if self.tls else _ping(self.port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start (see {self.workdir})")
            time.sleep(0.02)
        return self

    def _make_cert(self) -> None:
        if Path(self.ca_file).exists():
            return
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", str(self.workdir / "key.pem"), "-out", self.ca_file,
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

    def _tls_ping(self) -> bool:
        try:
            return self.cli("ping").strip() == "PONG"
        except subprocess.CalledProcessError:
            return False

    def cli(self, *args: str) -> str:
        """Run ``redis-cli -p <port> args…`` and return its output."""
        tls = ["--tls", "--cacert", self.ca_file] if self.tls else []
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *tls, *args], check=True, capture_output=True, timeout=30
        )
        return out.stdout.decode()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, no save) and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


class RedisCluster3:
    """Three cluster-enabled masters on loopback joined with ``redis-cli --cluster create``,
    ``replicas`` replicas each (``cluster-node-timeout`` 2 s: a dead master's replica takes over
    a few seconds later)."""

    def __init__(self, workdir: str | Path, maxmemory: str = "256mb", replicas: int = 0) -> None:
        n = 3 * (1 + replicas)
        self.replicas = replicas
        sync_now = ("--repl-diskless-sync-delay", "0")  # a replica syncs at once, not 5 s later
        self.nodes = [
            RedisServer(Path(workdir) / f"n{i}", maxmemory=maxmemory, cluster=True, extra=sync_now) for i in range(n)
        ]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:P1,127.0.0.1:P2,…`` (every node)."""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> RedisCluster3:
        """Start the nodes, create the cluster, wait for ``cluster_state:ok`` on every node."""
        try:
            for n in self.nodes:
                n.start()
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=timeout,
            )  # fmt: skip
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> list[RedisServer]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` and agrees on three masters
        that serve every slot (after a failover: the promoted replica among them)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                views = [n.cli("cluster", "nodes") for n in self.alive()]
                ok = all("cluster_state:ok" in n.cli("cluster", "info") for n in self.alive())
            except subprocess.CalledProcessError:
                ok = False
            if ok and all(len(self._serving(v)) == 3 for v in views):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    @staticmethod
    def _serving(view: str) -> dict[int, str]:
        """``{port: node id}`` of the masters that own slots and are not failed, in a CLUSTER NODES view."""
        out = {}
        for line in view.splitlines():
            f = line.split()
            if len(f) > 8 and "master" in f[2] and "fail" not in f[2]:
                out[int(f[1].split("@")[0].rsplit(":", 1)[1])] = f[0]
        return out

    def masters(self) -> dict[int, str]:
        """``{port: node id}`` of the masters serving slots, as the first running node sees them."""
        return self._serving(self.alive()[0].cli("cluster", "nodes"))

    def node(self, port: int) -> RedisServer:
        """The node on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def replica_of(self, master_id: str) -> RedisServer:
        """A running replica of the master ``master_id``."""
        for line in self.alive()[0].cli("cluster", "nodes").splitlines():
            f = line.split()
            if len(f) > 3 and "slave" in f[2] and f[3] == master_id and "fail" not in f[2]:
                return self.node(int(f[1].split("@")[0].rsplit(":", 1)[1]))
        raise RuntimeError(f"no running replica of {master_id}")

    def stop(self) -> None:
        """Stop every node."""
        for n in self.nodes:
            n.stop()
