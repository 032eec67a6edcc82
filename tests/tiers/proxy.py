"""A loopback TCP proxy that counts request/response turns and can stall (for round-trip and back-pressure tests).

A *turn* is client data arriving after the server last spoke on that connection (or first):
one pipelined batch is one turn whatever its number of commands; N unpipelined commands are N.
The server's replies are held until the client has been quiet for ``QUIET`` seconds, so a server
answering the first commands of a long pipeline while the rest arrive does not split the turn
(a client that waits for each reply still gets it, a turn later).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

QUIET = 0.005


class TurnCountingProxy:
    """Forwards 127.0.0.1:<port> to ``target_port``; ``turns`` counts request turns; ``stall()`` stops forwarding."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.turns = 0
        self._stalled = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stall(self) -> None:
        """Stop forwarding (connections stay open: the client times out)."""
        self._stalled.set()

    def resume(self) -> None:
        self._stalled.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        peer: dict[socket.socket, socket.socket] = {}
        from_client: set[socket.socket] = set()
        server_spoke: dict[socket.socket, bool] = {}  # client socket -> server replied since its last turn
        held: dict[socket.socket, bytearray] = {}  # client socket -> server replies not yet forwarded
        last_client: dict[socket.socket, float] = {}
        while not self._stop.is_set():
            if self._stalled.is_set():
                self._stop.wait(0.01)
                continue
            now = time.monotonic()
            for c, buf in held.items():
                if buf and now - last_client.get(c, 0.0) >= QUIET and c in peer:
                    c.sendall(bytes(buf))
                    buf.clear()
                    server_spoke[c] = True
            for key, _ in sel.select(timeout=QUIET / 2):
                if self._stalled.is_set():
                    break
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    c, _ = self._listener.accept()
                    try:
                        s = socket.create_connection(("127.0.0.1", self.target_port))
                    except OSError:  # the server is down: so is this connection
                        c.close()
                        continue
                    peer[c], peer[s] = s, c
                    from_client.add(c)
                    server_spoke[c] = True
                    sel.register(c, selectors.EVENT_READ, None)
                    sel.register(s, selectors.EVENT_READ, None)
                    continue
                try:
                    data = sock.recv(1 << 20)
                except OSError:
                    data = b""
                other = peer.get(sock)
                if not data or other is None:
                    for x in (sock, other):
                        if x is not None and x in peer:
                            sel.unregister(x)
                            x.close()
                            peer.pop(x, None)
                            from_client.discard(x)
                            held.pop(x, None)
                    continue
                if sock in from_client:
                    last_client[sock] = time.monotonic()
                    if server_spoke[sock]:
                        with self._lock:
                            self.turns += 1
                        server_spoke[sock] = False
                    other.sendall(data)
                else:
                    held.setdefault(other, bytearray()).extend(data)
        for s in list(peer):
            s.close()
