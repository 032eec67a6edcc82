"""The start-up check of a Redis tier: one round trip to every configured node, its failure sorted.

A configuration error -- credentials refused, a database that does not exist, a host name that
does not resolve, a TLS URL for a plain server or the reverse, a certificate not trusted -- will not heal
by retrying: :func:`check_nodes` raises it as an :class:`~kvoffload.errors.InvalidArgumentError`
naming the tier (its URL without secrets) and carrying the server's own reply. A server that
merely does not answer (refused, reset, timed out) raises
:class:`~kvoffload.tiers.health.TierUnavailable`: it may come back.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis import exceptions as rex

from kvoffload.errors import InvalidArgumentError
from kvoffload.tiers.health import TierUnavailable

__all__ = ["check_nodes"]


_NO_HOST = "the host name does not resolve"
_TLS = "TLS failed (a TLS URL against a plain server, or a certificate not trusted)"


def _causes(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _configuration_error(exc: BaseException) -> str | None:
    """What is wrong with the configuration, if ``exc`` says so; None: the server did not answer."""
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)):
        return "credentials refused"
    if isinstance(exc, rex.ResponseError):
        return "the server refused the connection's setup (database, protocol or ACL)"
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return _NO_HOST
        if isinstance(cause, ssl.SSLError):
            return _TLS
    text = str(exc)  # the driver may have kept only the text of the cause
    if "Name or service not known" in text or "nodename nor servname" in text:
        return _NO_HOST
    if "SSL" in text or "wrong version number" in text:
        return _TLS
    return None


def _speaks(node: tuple[str, int], tls: bool, timeout: float) -> bool:
    """Whether ``node`` completes a TLS handshake (``tls``) or answers a plain ``PING``."""
    try:
        with socket.create_connection(node, timeout=timeout) as sock:
            if tls:
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                with ctx.wrap_socket(sock):
                    return True
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH", b"-ERR"))
    except (OSError, ssl.SSLError):
        return False


def check_nodes(name: str, nodes: Iterable[Any], pool: Callable[[Any], Any], tls: bool, timeout: float) -> None:
    """PING every node of ``nodes`` through ``pool(node)`` (a connection pool: connecting sends
    the credentials and selects the database); ``tls``: the URL asks for TLS. A node that does not
    answer is asked once more in the other protocol: if it speaks that one, the URL's scheme is
    the mistake.

    Raises:
        InvalidArgumentError: a configuration error (see the module docstring).
        TierUnavailable: a node did not answer.
    """
    for node in nodes:
        error = _ping(pool(node))
        if error is None:
            continue
        where = f"tier {name}" + (f", node {node[0]}:{node[1]}" if isinstance(node, tuple) else "")
        what, text = error
        if what is not None:
            raise InvalidArgumentError(f"{where}: {what}; the server said: {text}")
        if isinstance(node, tuple) and _speaks(node, not tls, timeout):
            spoken, asked = ("TLS", "rediss://") if not tls else ("plain TCP", "redis://")
            raise InvalidArgumentError(f"{where}: the server speaks {spoken}: use a {asked} URL ({text})")
        raise TierUnavailable(f"{where}: {text}")


def _ping(pool: Any) -> tuple[str | None, str] | None:
    """None if a PING through ``pool`` is answered, else (the configuration error it shows, or
    None; the error's text).

    The PING runs on a thread of its own: the driver may keep its exception (and so the frames
    of the stack it was raised in) after the call, and the caller's stack holds the host pool's
    records, which must not outlive the tier.
    """
    out: list[tuple[str | None, str] | None] = []

    def run() -> None:
        try:
            redis.Redis(connection_pool=pool).ping()
            out.append(None)
        except Exception as exc:  # noqa: BLE001 - sorted by the caller, never swallowed
            out.append((_configuration_error(exc), f"{type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=run, name="kvoffload-redis-check", daemon=True)
    thread.start()
    thread.join()
    return out[0] if out else (None, "the check did not finish")
