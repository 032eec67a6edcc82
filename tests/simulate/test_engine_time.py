"""The fleet's engine-time model against closed forms: one replica, constant service."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.engine_time import EngineTime, percentile, serve_fifo, time_requests
from kvoffload.simulate.gpu_profile import GPU_PROFILES, MODEL_COMPUTE, read_gpu_profile

# a replica that computes 1,000 tokens in exactly 1 s: no attention, no step floor, no loads
_UNIT = EngineTime(token_s=1e-3, attn_s=0.0, step_s=0.0, kv_read_s=0.0, link_s=0.0, tier_s=0.0)


def _one_replica(arrival: np.ndarray, tokens: int = 1000, outputs: np.ndarray | None = None, span: float = 0.0):
    n = len(arrival)
    prompt = np.full(n, tokens, dtype=np.int64)
    out = np.zeros(n, dtype=np.int64) if outputs is None else outputs
    zeros = np.zeros(n, dtype=np.int64)
    return time_requests(_UNIT, arrival, zeros, 1, prompt, out, zeros, zeros, span or float(arrival[-1]), 1.0)


def test_md1_mean_wait_matches_the_pollaczek_khinchine_closed_form() -> None:
    """Poisson arrivals at rate 0.5/s, constant 1 s service (rho = 0.5): M/D/1's mean wait is
    W = rho / (2 mu (1 - rho)) = 0.5 s. 200,000 customers in 50 batches: the batch means' standard
    error (about 0.01 s here: waits are correlated over a few tens of customers) bounds the
    tolerance at 4 standard errors, and the error itself must be small enough that M/M/1's 1.0 s or
    a wait ignoring queueing (0) would fail."""
    rng = np.random.default_rng(7)
    lam, mu, n = 0.5, 1.0, 200_000
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    times = _one_replica(arrival)
    rho = lam / mu
    expect = rho / (2 * mu * (1 - rho))
    batches = times.queue.reshape(50, -1).mean(axis=1)
    se = batches.std(ddof=1) / math.sqrt(len(batches))
    assert se < 0.03
    assert abs(times.queue.mean() - expect) < 4 * se, (times.queue.mean(), expect, se)
    assert np.allclose(times.ttft - times.queue, 1.0)  # TTFT = wait + service
    assert times.util[0] == pytest.approx(n / arrival[-1], rel=1e-9)  # busy seconds over the span


def test_deterministic_arrivals_slower_than_service_never_wait() -> None:
    arrival = np.arange(100, dtype=np.float64) * 1.5  # one every 1.5 s, service 1 s
    times = _one_replica(arrival)
    assert np.all(times.queue == 0.0)
    assert np.allclose(times.ttft, 1.0)


def test_saturated_replica_waits_grow_linearly() -> None:
    """Arrivals every 1 s, service 1.6 s: request k waits exactly k x 0.6 s."""
    arrival = np.arange(50, dtype=np.float64)
    times = _one_replica(arrival, tokens=1600)
    assert np.allclose(times.queue, np.arange(50) * 0.6)
    assert times.util[0] > 1.0


def test_decode_share_slows_the_prefill_by_its_complement() -> None:
    """Requests far apart (no queueing), each with 500 output tokens whose decode costs 0.5 s:
    over a span of 10 s per request the decode share is 0.05, a 1 s prefill takes 1 / 0.95 s."""
    arrival = np.arange(20, dtype=np.float64) * 10.0
    outputs = np.full(20, 500, dtype=np.int64)
    times = _one_replica(arrival, outputs=outputs, span=200.0)
    assert times.decode_share[0] == pytest.approx(20 * 0.5 / 200.0)
    assert np.allclose(times.ttft, 1.0 / (1 - 0.05))
    # decode alone fills the replica: no prefill is ever served
    full = _one_replica(arrival, outputs=np.full(20, 20_000, dtype=np.int64), span=200.0)
    assert full.decode_share[0] >= 1 and np.all(np.isinf(full.ttft)) and math.isinf(full.ttft_p(99))


def test_serve_fifo_equals_lindleys_recursion() -> None:
    rng = np.random.default_rng(3)
    arrival = np.sort(rng.uniform(0, 100, 500))
    work = rng.exponential(0.25, 500)
    start, finish = serve_fifo(arrival, work)
    prev = -math.inf
    for i in range(500):
        s = max(arrival[i], prev)
        assert start[i] == pytest.approx(s) and finish[i] == pytest.approx(s + work[i])
        prev = s + work[i]


def test_rate_scale_compresses_arrivals() -> None:
    arrival = np.arange(100, dtype=np.float64) * 1.5
    assert np.all(_one_replica(arrival).queue == 0)
    n = len(arrival)
    z = np.zeros(n, dtype=np.int64)
    prompt = np.full(n, 1000, dtype=np.int64)
    doubled = time_requests(_UNIT, arrival, z, 1, prompt, z, z, z, float(arrival[-1]), 2.0)  # every 0.75 s
    assert np.allclose(doubled.queue, np.arange(n) * 0.25)
    with pytest.raises(InvalidArgumentError, match="--rate-scale"):
        time_requests(_UNIT, arrival, z, 1, prompt, z, z, z, 1.0, 0.0)


def test_prefill_cost_adds_causal_attention_and_a_step_floor() -> None:
    et = EngineTime(token_s=1e-4, attn_s=1e-8, step_s=0.05, kv_read_s=0.0, link_s=0.0, tier_s=0.0, chunk_tokens=100)
    # tokens 100..300: 200 x 1e-4 + 1e-8 x (300^2 - 100^2) = 0.02 + 0.0008, below 2 steps x 0.05
    assert et.prefill_s(np.array([300]), np.array([100]))[0] == pytest.approx(0.1)
    assert et.prefill_one(300, 100) == pytest.approx(0.1)
    et2 = EngineTime(token_s=1e-4, attn_s=1e-8, step_s=0.0, kv_read_s=0.0, link_s=0.0, tier_s=0.0)
    assert et2.prefill_s(np.array([300]), np.array([100]))[0] == pytest.approx(0.0208)


def test_default_rates_follow_from_flops_per_token() -> None:
    """8b on one H100: 2 x 8.03e9 FLOPs per token at 40 % of 989 TFLOP/s; 70b on 4 GPUs."""
    h100 = GPU_PROFILES["h100"]
    et = EngineTime.build(h100, MODEL_COMPUTE["8b"], 131072)
    assert et.prefill_tokens_per_s == pytest.approx(989e12 * 0.4 / (2 * 8.03e9))
    assert round(et.prefill_tokens_per_s, -2) == 24600
    assert et.attn_s == pytest.approx(2 * 32 * 4096 / (989e12 * 0.4))
    assert et.link_s == pytest.approx(131072 / 50e9)
    big = EngineTime.build(h100, MODEL_COMPUTE["70b"], 327680)
    assert big.prefill_tokens_per_s == pytest.approx(4 * 989e12 * 0.4 / (2 * 70.6e9))
    given = EngineTime.build(h100, MODEL_COMPUTE["8b"], 131072, prefill_tokens_per_s=10_000)
    assert given.prefill_tokens_per_s == pytest.approx(10_000)
    with pytest.raises(InvalidArgumentError, match="--prefill-tokens-per-s"):
        EngineTime.build(h100, None, 131072)


def test_percentile_picks_an_observed_value() -> None:
    v = np.arange(1, 101, dtype=np.float64)
    assert percentile(v, 99) == 99.0 and percentile(v, 50) == 50.0
    assert math.isinf(percentile(np.array([1.0, math.inf]), 99))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('{"name": "x", "dense_tflops": 1, "mfu": 0.5, "hbm_gbps": 1}', "missing field 'link_gbps'"),
        ('{"name": "x", "dense_tflops": 1, "mfu": 1.5, "hbm_gbps": 1, "link_gbps": 1}', "field 'mfu'"),
        ('{"name": "x", "dense_tflops": 1e300, "mfu": 0.5, "hbm_gbps": 1, "link_gbps": 1}', "dense_tflops"),
        ('{"name": "x", "dense_tflops": 1, "mfu": 0.5, "hbm_gbps": 1, "link_gbps": 1, "tdp": 7}', "unknown field"),
        ("[1]", "expected a JSON object"),
    ],
)
def test_bad_gpu_profiles_are_refused(tmp_path, body: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "gpu.json"
    p.write_text(body)
    with pytest.raises(InvalidArgumentError, match=needle):
        read_gpu_profile(p)
