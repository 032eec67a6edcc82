"""Build a tier from one string, as a user types it (``--tier redis://host:6379``, ``--tier disk:/path``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.tiers.args import tier_options_from_query
from kvoffload.tiers.base import Tier
from kvoffload.tiers.namespace import TierNamespace

__all__ = ["open_tier", "parse_disk_spec"]


def parse_disk_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``disk:/path?max_bytes=N&o_direct=0`` -> ``("/path", {"max_bytes": N, "o_direct": False})``;
    the options of every tier (``integrity_key``, ``io_threads``...) are accepted too."""
    rest = spec[len("disk:") :]
    if rest.startswith("//"):
        rest = rest[2:]
    path, _, query = rest.partition("?")
    if not path:
        raise InvalidArgumentError(f"tier spec {spec!r}: a disk tier needs a directory, e.g. disk:/var/cache/kv")
    opts, backend_pairs = tier_options_from_query(spec, parse_qsl(query, keep_blank_values=True))
    for k, v in backend_pairs:
        if k == "max_bytes":
            try:
                opts[k] = int(v)
            except ValueError:
                raise InvalidArgumentError(f"tier spec {spec!r}: {k} must be an integer, got {v!r}") from None
        elif k == "o_direct":
            if v.lower() not in ("0", "1", "true", "false", "auto"):
                raise InvalidArgumentError(f"tier spec {spec!r}: o_direct must be 0, 1 or auto, got {v!r}")
            opts[k] = None if v.lower() == "auto" else v.lower() in ("1", "true")
        else:
            raise InvalidArgumentError(f"tier spec {spec!r}: unknown disk tier option {k!r}")
    return path, opts


def open_tier(spec: str, records: np.ndarray | memoryview, namespace: TierNamespace, **options: Any) -> Tier:
    """The tier named by ``spec`` over ``records``.

    ``spec`` is a Redis URL (``redis://``, ``rediss://``, ``unix://``; see :class:`RedisTier`) or
    ``disk:<directory>[?max_bytes=N&o_direct=0|1|auto]`` (see :class:`DiskTier`). ``options`` are
    passed to the tier's constructor (they override options given in the spec).
    """
    if not isinstance(spec, str):
        raise InvalidTypeError(f"tier spec must be a str, got {type(spec).__name__}")
    scheme = spec.split(":", 1)[0].lower() if ":" in spec else ""
    if scheme in ("redis", "rediss", "unix"):
        from kvoffload.tiers.redis_tier import RedisTier

        return RedisTier(records, namespace, spec, **options)
    if scheme == "disk":
        from kvoffload.tiers.disk_tier import DiskTier

        path, opts = parse_disk_spec(spec)
        opts.update(options)
        return DiskTier(records, namespace, path, **opts)
    raise InvalidArgumentError(f"tier spec {spec!r}: expected redis://, rediss://, unix:// or disk:<directory>")
