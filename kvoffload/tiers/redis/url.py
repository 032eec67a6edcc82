"""Parse and check a Redis tier URL and its options (no connection is made here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.tiers.args import redact_query, tier_options_from_query

__all__ = ["RedisConfig", "parse_redis_url"]

_SCHEMES = ("redis", "rediss", "unix")
_FLOAT_OPTIONS = ("socket_timeout", "connect_timeout")
_INT_OPTIONS = ("max_connections", "db")
_STR_OPTIONS = ("username", "password", "key_prefix", "ssl_ca_certs", "ssl_cert_reqs")
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass
class RedisConfig:
    """A checked Redis tier configuration.

    Attributes:
        scheme: ``redis``, ``rediss`` (TLS) or ``unix``.
        nodes: ``(host, port)`` pairs (empty for ``unix``).
        path: the socket path for ``unix``.
        cluster: whether to use Redis Cluster.
        db: database number (standalone only).
        username / password: ACL credentials (``None`` for none).
        socket_timeout / connect_timeout: seconds.
        max_connections: connection-pool size (``None``: the tier's threads + 2).
        key_prefix: prefix of every store key.
        ssl: keyword arguments for TLS connections.
        protocol: RESP version, 2 or 3 (``None``: redis-py's default); both are parsed alike.
        tier_options: the options of every tier found in the URL's query (``integrity_key``,
            ``io_threads``...; see :func:`~kvoffload.tiers.args.tier_options_from_query`).
    """

    scheme: str
    nodes: list[tuple[str, int]] = field(default_factory=list)
    path: str = ""
    cluster: bool = False
    db: int = 0
    username: str | None = None
    password: str | None = None
    socket_timeout: float = 2.0
    connect_timeout: float = 1.0
    max_connections: int | None = None
    key_prefix: str = "kvo"
    ssl: dict[str, Any] = field(default_factory=dict)
    protocol: int | None = None
    tier_options: dict[str, Any] = field(default_factory=dict)

    def display(self) -> str:
        """The URL without credentials (for logs and reports)."""
        if self.scheme == "unix":
            return f"unix://{self.path}"
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        return f"{self.scheme}://{hosts}" + ("?cluster=true" if self.cluster else f"/{self.db}")


def _bad(url: str, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"url {_redact(url)!r}: {what}")


def _redact(url: str) -> str:
    """``url`` without its secrets (the userinfo, ``password=`` and ``integrity_key=`` values)."""
    url = redact_query(url)
    if "@" not in url:
        return url
    head, _, tail = url.rpartition("@")
    scheme = head.split("://", 1)[0]
    return f"{scheme}://***@{tail}"


def _parse_nodes(url: str, netloc: str) -> list[tuple[str, int]]:
    nodes = []
    for part in netloc.split(","):
        host, sep, port_s = part.rpartition(":") if not part.endswith("]") else (part, "", "")
        if not sep:
            host, port_s = part, "6379"
        host = host.strip("[]")
        if not host:
            raise _bad(url, f"empty host in {part!r}")
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise _bad(url, f"port must be an integer in 1..65535, got {port_s!r}")
        nodes.append((host, int(port_s)))
    return nodes


def _option(url: str, name: str, value: Any) -> Any:
    """One option, from the query (a str) or a keyword, checked and converted."""
    if name == "cluster":
        if isinstance(value, str):
            if value.lower() not in _BOOL_WORDS:
                raise _bad(url, f"cluster must be true or false, got {value!r}")
            return _BOOL_WORDS[value.lower()]
        if value is not None and not isinstance(value, bool):
            raise InvalidTypeError(f"cluster must be a bool or None, got {type(value).__name__}")
        return value
    if name in _FLOAT_OPTIONS:
        try:
            v = float(value) if isinstance(value, str) else value
        except ValueError:
            raise _bad(url, f"{name} must be a number of seconds, got {value!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
        return float(v)
    if name == "protocol":
        if str(value) not in ("2", "3") or isinstance(value, bool):
            raise InvalidArgumentError(f"protocol must be 2 or 3 (RESP2 / RESP3), got {value!r}")
        return int(value)
    if name in _INT_OPTIONS:
        if isinstance(value, str):
            if not value.isdigit():
                raise _bad(url, f"{name} must be a non-negative integer, got {value!r}")
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "max_connections" else 0):
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        return value
    if name in _STR_OPTIONS:
        if not isinstance(value, str):
            raise InvalidTypeError(f"{name} must be a str, got {type(value).__name__}")
        if name == "ssl_cert_reqs" and value not in ("required", "optional", "none"):
            raise InvalidArgumentError(f"ssl_cert_reqs must be required, optional or none, got {value!r}")
        if name == "key_prefix" and (not value or ":" in value):
            raise InvalidArgumentError(f"key_prefix must be non-empty without ':', got {value!r}")
        return value
    raise _bad(url, f"unknown option {name!r}")


def parse_redis_url(url: str, **options: Any) -> RedisConfig:
    """Check ``url`` and ``options`` (keywords override the URL's query); see docs/contract.md §8."""
    if not isinstance(url, str):
        raise InvalidTypeError(f"url must be a str, got {type(url).__name__}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise _bad(url, "scheme must be redis://, rediss:// or unix://")
    cfg = RedisConfig(scheme=scheme)
    cfg.tier_options, pairs = tier_options_from_query(_redact(url), parse_qsl(parts.query, keep_blank_values=True))
    merged: dict[str, Any] = dict(pairs)
    userinfo, _, hostpart = parts.netloc.rpartition("@")
    if userinfo:
        user, _, pw = userinfo.partition(":")
        if user:
            merged.setdefault("username", unquote(user))
        if pw:
            merged.setdefault("password", unquote(pw))
    merged.update({k: v for k, v in options.items() if v is not None})
    if scheme == "unix":
        if hostpart or not parts.path:
            raise _bad(url, "a unix URL is unix:///path/to/redis.sock")
        cfg.path = parts.path
    else:
        if not hostpart:
            raise _bad(url, "no host")
        cfg.nodes = _parse_nodes(url, hostpart)
        db_s = parts.path.strip("/")
        if db_s:
            merged.setdefault("db", db_s)
    cluster: bool | None = None
    for name, value in merged.items():
        v = _option(url, name, value)
        if name == "cluster":
            cluster = v
            continue
        if name.startswith("ssl_"):
            if scheme != "rediss":
                raise _bad(url, f"{name} needs a rediss:// URL")
            cfg.ssl[name] = v
        elif v is not None:
            setattr(cfg, name, v)
    cfg.cluster = bool(cluster) or (cluster is None and len(cfg.nodes) > 1)
    if len(cfg.nodes) > 1 and not cfg.cluster:
        raise _bad(url, "several hosts name a Redis Cluster; cluster=false contradicts them")
    if cfg.cluster and (scheme == "unix" or cfg.db != 0):
        raise _bad(url, "Redis Cluster needs TCP hosts and database 0")
    return cfg
