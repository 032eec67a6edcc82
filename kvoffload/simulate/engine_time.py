"""Time in the fleet replay: a simple engine-time model, one FIFO server per replica.

Each replica serves the requests routed to it **in arrival order**, one prefill after another (a
work-conserving first-in-first-out server). The work of request ``i`` with ``n`` prompt tokens,
``h`` of them loaded (``h_host`` from the replica's host pool, ``h_tier`` from the shared tier) and
``o`` output tokens, in seconds (:class:`EngineTime`):

* **load** ``X = h_host x b / link + h_tier x b / tier``: the hit tokens' KV (``b`` bytes per token)
  over the host link and from the shared tier, before the rest is computed (no overlap with
  compute: layer-wise pipelining would hide part of it);
* **prefill** ``C = max((n - h) x t + a x (n^2 - h^2), ceil((n - h) / B) x s)``: the computed tokens'
  ``2 x parameters`` FLOPs (``t`` seconds per token at the replica's effective FLOP/s) plus causal
  attention (``a = 2 x layers x attention width / FLOP/s``: token ``p`` attends to ``p`` earlier
  tokens, ``4 x layers x width x p`` FLOPs), and never less than one weight read (``s`` = weight
  bytes / HBM bandwidth) per step of the chunked-prefill token budget ``B``;
* **decode** ``D = o x (t + (n + o / 2) x k)``: every output token's FLOPs plus one read of its
  context's KV from HBM (``k`` = ``b`` / HBM bandwidth). Decodes run inside the same chunked-prefill
  steps as the prefills (a step takes the running requests' decode tokens first and fills the rest
  of ``B`` with prefill), so a replica's **decode share** ``delta = sum(D) / span`` (its requests'
  decode seconds over the trace's span) is the part of its time prefills cannot use:

``W = X + C / (1 - delta)`` is a request's time in service, ``start = max(arrival, previous
finish)``, ``TTFT = finish - arrival`` (the first token comes with the prefill's last step),
``queueing delay = start - arrival``. A replica whose decode share reaches 1 never serves a prefill
(TTFT infinite). Utilisation: ``(sum(X + C) + sum(D)) / span``, above 1 when work outlasts the
trace. Percentiles pick an observed value (p99: the smallest TTFT at least 99 % of requests reach).

Not modelled: the GPU's own prefix cache, preemption, batching efficiency beyond the MFU, network
delay before the replica, and prefill/decode disaggregation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.gpu_profile import GpuProfile, ModelCompute

__all__ = [
    "CHUNK_TOKENS",
    "TIER_GBPS",
    "EngineTime",
    "FleetTimes",
    "percentile",
    "serve_fifo",
    "time_requests",
]

#: default chunked-prefill token budget per engine step
CHUNK_TOKENS = 8192
#: default shared-tier read rate per replica, GB/s (about a 100 Gb/s NIC's line rate at 80 %)
TIER_GBPS = 10.0


@dataclass(frozen=True)
class EngineTime:
    """The per-token costs of one replica (module docstring), in seconds.

    Attributes:
        token_s: linear prefill seconds per computed token (``1 / prefill tokens/s``).
        attn_s: causal attention seconds per unit of ``n^2 - h^2``.
        step_s: the least time of an engine step (weights read once from HBM).
        kv_read_s: seconds to read one token's KV from HBM.
        link_s / tier_s: seconds per token loaded from host memory / from the shared tier.
        chunk_tokens: the chunked-prefill token budget ``B`` per step.
        describe: where the figures came from.
    """

    token_s: float
    attn_s: float
    step_s: float
    kv_read_s: float
    link_s: float
    tier_s: float
    chunk_tokens: int = CHUNK_TOKENS
    describe: str = ""

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1.0 / self.token_s

    @classmethod
    def build(
        cls,
        gpu: GpuProfile,
        model: ModelCompute | None,
        kv_bytes_per_token: int,
        chunk_tokens: int = CHUNK_TOKENS,
        prefill_tokens_per_s: float | None = None,
        link_gbps: float | None = None,
        tier_gbps: float = TIER_GBPS,
    ) -> EngineTime:
        """The costs of ``model`` on ``gpu`` (x its GPUs per replica); ``prefill_tokens_per_s``
        overrides the linear rate (attention scaled with it); ``model`` None (a shape read from a
        config, whose parameters are unknown) needs it and leaves attention and the step floor out."""
        if model is None and prefill_tokens_per_s is None:
            raise InvalidArgumentError("--model-config with --replicas needs --prefill-tokens-per-s")
        gpus = model.gpus if model is not None else 1
        hbm = gpu.hbm_gbps * 1e9 * gpus
        link = (gpu.link_gbps if link_gbps is None else link_gbps) * 1e9 * gpus
        if model is None:
            assert prefill_tokens_per_s is not None
            token_s, attn_s, step_s = 1.0 / prefill_tokens_per_s, 0.0, 0.0
            how = f"{prefill_tokens_per_s:,.0f} prefill tokens/s (--prefill-tokens-per-s), attention not modelled"
        else:
            flops = gpu.dense_tflops * 1e12 * gpu.mfu * gpus
            if prefill_tokens_per_s is not None:
                flops = prefill_tokens_per_s * 2 * model.params
            token_s = 2 * model.params / flops
            attn_s = 2 * model.layers * model.attn_dim / flops
            step_s = model.weight_bytes / hbm
            how = (
                f"{model.name} on {gpus} x {gpu.describe()}: {1 / token_s:,.0f} prefill tokens/s"
                + (" (--prefill-tokens-per-s)" if prefill_tokens_per_s is not None else "")
                + " + attention"
            )
        return cls(
            token_s,
            attn_s,
            step_s,
            kv_bytes_per_token / hbm,
            kv_bytes_per_token / link,
            kv_bytes_per_token / (tier_gbps * 1e9),
            chunk_tokens,
            f"{how}; loads {link / 1e9:g} GB/s from host, {tier_gbps:g} GB/s from the tier; chunks of "
            f"{chunk_tokens:,} tokens",
        )

    def prefill_s(self, n: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Seconds to compute tokens ``h..n`` of each prompt (arrays of token counts)."""
        n, h = n.astype(np.float64), h.astype(np.float64)
        m = n - h
        work = m * self.token_s + self.attn_s * (n * n - h * h)
        return np.maximum(work, np.ceil(m / self.chunk_tokens) * self.step_s)

    def prefill_one(self, n: int, h: int) -> float:
        """:meth:`prefill_s` of one request."""
        m = n - h
        return max(m * self.token_s + self.attn_s * (n * n - h * h), math.ceil(m / self.chunk_tokens) * self.step_s)

    def load_s(self, host_tokens: np.ndarray, tier_tokens: np.ndarray) -> np.ndarray:
        return host_tokens * self.link_s + tier_tokens * self.tier_s

    def decode_s(self, n: np.ndarray, o: np.ndarray) -> np.ndarray:
        """GPU seconds of each request's ``o`` output tokens after an ``n``-token prompt."""
        o = o.astype(np.float64)
        return o * (self.token_s + (n + o / 2) * self.kv_read_s)


def serve_fifo(arrival: np.ndarray, work: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(start, finish)`` of jobs served one at a time in arrival order (``arrival`` sorted):
    Lindley's recursion ``finish[i] = max(arrival[i], finish[i-1]) + work[i]``, in closed form
    ``finish[i] = S[i] + max over j <= i of (arrival[j] - S[j-1])`` with ``S`` the running sum of work."""
    if not len(arrival):
        return np.zeros(0), np.zeros(0)
    s = np.cumsum(work)
    before = s - work
    finish = s + np.maximum.accumulate(arrival - before)
    return finish - work, finish


def percentile(values: np.ndarray, q: float) -> float:
    """The smallest observed value at least ``q`` % of ``values`` reach (inf kept)."""
    if not len(values):
        return 0.0
    return float(np.quantile(values, q / 100.0, method="inverted_cdf"))


@dataclass
class FleetTimes:
    """Time figures of one fleet at one arrival rate (per request: ``ttft``, ``queue``, ``service``
    (the time in service, the TTFT it would have without queueing); per replica: ``util``,
    ``decode_share``, ``queue_mean``), seconds."""

    rate_scale: float
    ttft: np.ndarray
    queue: np.ndarray
    util: np.ndarray
    decode_share: np.ndarray
    queue_mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    service: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def ttft_p(self, q: float) -> float:
        return percentile(self.ttft, q)


def time_requests(
    et: EngineTime,
    arrival_s: np.ndarray,
    replica: np.ndarray,
    replicas: int,
    prompt: np.ndarray,
    output: np.ndarray,
    host_tokens: np.ndarray,
    tier_tokens: np.ndarray,
    span_s: float,
    rate_scale: float = 1.0,
) -> FleetTimes:
    """The module's model over requests routed to ``replica`` (arrays in arrival order, arrival in
    seconds at the trace's own rate; ``rate_scale`` divides arrival times and the span)."""
    if not math.isfinite(rate_scale) or rate_scale <= 0:
        raise InvalidArgumentError(f"--rate-scale must be positive numbers, got {rate_scale!r}")
    arrival = (arrival_s - (arrival_s[0] if len(arrival_s) else 0.0)) / rate_scale
    span = span_s / rate_scale
    hit = host_tokens + tier_tokens
    compute = et.prefill_s(prompt, hit)
    load = et.load_s(host_tokens, tier_tokens)
    decode = et.decode_s(prompt, output)
    ttft = np.empty(len(arrival))
    queue = np.empty(len(arrival))
    service = np.empty(len(arrival))
    util, share, qmean = (np.zeros(replicas) for _ in range(3))
    for r in range(replicas):
        idx = np.flatnonzero(replica == r)
        share[r] = decode[idx].sum() / span
        util[r] = (compute[idx].sum() + load[idx].sum()) / span + share[r]
        if share[r] >= 1.0:
            ttft[idx] = queue[idx] = service[idx] = math.inf
            qmean[r] = math.inf
            continue
        work = load[idx] + compute[idx] / (1.0 - share[r])
        service[idx] = work
        start, finish = serve_fifo(arrival[idx], work)
        ttft[idx] = finish - arrival[idx]
        queue[idx] = start - arrival[idx]
        qmean[r] = float(queue[idx].mean()) if len(idx) else 0.0
    return FleetTimes(rate_scale, ttft, queue, util, share, qmean, service)
