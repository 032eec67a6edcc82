"""The Redis / Redis Cluster backend: :class:`RedisTier` (URL schemes ``redis``, ``rediss``, ``unix``).

Needs the ``redis`` extra (``pip install 'kvoffload[redis]'``: redis-py, hiredis, xxhash).

* :mod:`~kvoffload.tiers.redis.tier` -- the tier: lookups, loads and stores as pipelines;
* :mod:`~kvoffload.tiers.redis.url` -- the URL and its options;
* :mod:`~kvoffload.tiers.redis.check` -- the start-up check of every node;
* :mod:`~kvoffload.tiers.redis.nodes` -- connection pools, a cluster's slot map, redirects, health per node;
* :mod:`~kvoffload.tiers.redis.io` -- pipelined commands and replies read into the caller's buffer;
* :mod:`~kvoffload.tiers.redis.probe` -- a standalone server's probe answered on the engine thread;
* :mod:`~kvoffload.tiers.redis.events` -- keys the server evicted, expired or another client deleted.
"""

from kvoffload.tiers.redis.tier import RedisTier

__all__ = ["RedisTier"]
