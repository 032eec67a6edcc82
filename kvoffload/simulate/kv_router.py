"""The ``kv-aware`` routing: the replica with the least prefill still to compute plus the work queued there.

For every request, at its arrival and for every replica ``i``:

``cost(i) = weight x new_blocks(i) + queued_blocks(i)``

* ``new_blocks(i)``: the request's prompt blocks replica ``i`` would still compute: its prompt
  tokens minus the leading run of its blocks found in ``i``'s host pool (``peek``: what a router's
  index of stored blocks answers; capped at ``prompt - 1`` tokens as every hit), in blocks;
* ``queued_blocks(i)``: the work replica ``i`` has not finished at that moment (queued prefills and
  the rest of the one in service, as the engine-time model of :mod:`kvoffload.simulate.engine_time`
  puts it), converted to blocks at the replica's linear prefill rate.

The request goes to the lowest cost, ties to the least queued, then to the replica handed the
fewest prompt tokens so far, then the lowest index. ``weight``
(``--kv-weight``, default :data:`KV_WEIGHT` = 1) trades cache affinity against load: with 1 the
cost is the request's own prefill plus the queue ahead of it, the replica that would give it the
earliest first token; above 1 hits count for more than queue (``prefix``, the longest run alone,
is the limit of a large weight); 0 is join-the-shortest-queue. This is the cost of Dynamo's KV
router (prefill blocks still to compute, weighted by ``--router-kv-overlap-score-weight``, default 1,
plus the load a worker carries, lowest cost wins) with the queued prefill work as the load; Dynamo
also counts the active decode blocks, which this model folds into each replica's decode share
instead (docs/simulate.md, "A fleet").

The router's view of a replica's queue uses the fleet's mean decode share (it cannot know each
replica's share over the whole trace in advance); the report's TTFT is then computed for the
routes it chose with each replica's own share, as for every other routing.
"""

from __future__ import annotations

import numpy as np

from kvoffload.simulate.engine_time import EngineTime

__all__ = ["KV_AWARE", "KV_WEIGHT", "KVAwareRouter"]

KV_AWARE = "kv-aware"
#: default weight of the prefill blocks still to compute (Dynamo's default overlap weight)
KV_WEIGHT = 1.0
#: the largest --kv-weight accepted
MAX_KV_WEIGHT = 1e6


class KVAwareRouter:
    """Routes requests of one fleet replay (module docstring); ``choose`` then ``served`` per request.

    ``arrival_s``, ``prompt`` and ``decode_s`` (each request's decode seconds) in arrival order;
    ``rate_scale`` divides the arrival times; ``span_s`` is the trace's span at its own rate.
    """

    def __init__(
        self,
        replicas: int,
        weight: float,
        et: EngineTime,
        block_tokens: int,
        arrival_s: np.ndarray,
        prompt: np.ndarray,
        decode_s: np.ndarray,
        span_s: float,
        rate_scale: float = 1.0,
    ) -> None:
        self.weight = float(weight)
        self.et = et
        self.bt = block_tokens
        a = arrival_s - (arrival_s[0] if len(arrival_s) else 0.0)
        self.arrival = (a / rate_scale).tolist()
        self.prompt = prompt.tolist()
        share = float(decode_s.sum()) * rate_scale / (replicas * span_s) if span_s > 0 else 0.0
        self.speed = max(1.0 - share, 0.05)  # the prefill's share of a replica's time, as the router sees it
        self.busy_until = [0.0] * replicas
        self.assigned = [0] * replicas
        self._block_s = et.token_s * block_tokens

    def choose(self, r: int, runs: list[int]) -> int:
        """The replica of request ``r``, given the leading run of its blocks each host pool holds."""
        t, n, bt, w = self.arrival[r], self.prompt[r], self.bt, self.weight
        best, best_key = 0, (float("inf"), float("inf"), 0, 0)
        for i, run in enumerate(runs):
            queued = max(self.busy_until[i] - t, 0.0) / self._block_s
            new = (n - min(run * bt, n - 1)) / bt
            key = (w * new + queued, queued, self.assigned[i], i)
            if key < best_key:
                best, best_key = i, key
        return best

    def served(self, r: int, replica: int, host_tokens: int, tier_tokens: int) -> None:
        """Request ``r`` went to ``replica`` and loads these tokens: its work joins that queue."""
        et, n = self.et, self.prompt[r]
        work = host_tokens * et.link_s + tier_tokens * et.tier_s
        work += et.prefill_one(n, host_tokens + tier_tokens) / self.speed
        self.assigned[replica] += n
        self.busy_until[replica] = max(self.busy_until[replica], self.arrival[r]) + work
