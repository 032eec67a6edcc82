"""The fleet's engine-time model against kvoffload's reference engine on a small workload.

The reference engine runs one replica (one request at a time, no GPU prefix cache) and is clocked
by the model's own costs, step by step: each step
takes the computed tokens' linear cost plus their causal attention for the chunk it computed, and
the loaded tokens' link time. Every request's first token then comes, by the engine's clock, when
the model's FIFO server says: the engine chooses what is loaded and computed (its scheduler and
manager), the model only the hits of the cache-level replay. A hit count, a chunk's attention, a
queueing rule or a load time that differs between the two moves some TTFT.

A chunked-prefill budget smaller than the prompts is checked with a host pool that never evicts:
an engine that stores each chunk's blocks as it computes them fills a small pool differently from
the cache-level replay, which stores a request's blocks at once (kvoffload.simulate.cache_replay).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest

from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.null_worker import NullTransferWorker
from kvoffload.simulate.cli import _mooncake_to_trace, _to_request
from kvoffload.simulate.engine_time import EngineTime, time_requests
from kvoffload.simulate.fleet import FleetTrace, replay_fleet
from kvoffload.simulate.mooncake import read_mooncake_trace
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake

_ET = EngineTime(token_s=1e-3, attn_s=2e-7, step_s=0.0, kv_read_s=0.0, link_s=3e-4, tier_s=0.0)


def _engine_ttft(path: Path, capacity: int, budget: int) -> tuple[dict[str, float], list[str]]:
    reqs = read_mooncake_trace(path, 64)
    items = [_to_request(t) for t in _mooncake_to_trace(reqs, 64)]
    arrival = {it.request_id: r.timestamp / 1000.0 for it, r in zip(items, reqs, strict=True)}
    config = EngineConfig(
        groups=(GroupConfig(16, 2, None, 1),),
        num_gpu_blocks=64,
        num_cpu_blocks=capacity,
        num_heads=1,
        head_dim=4,
        max_num_seqs=1,
        max_num_batched_tokens=budget,
        enable_gpu_prefix_cache=False,
        verify_loads=False,
        device="cpu",
    )
    engine = Engine(config, worker=NullTransferWorker())
    chunks: list[tuple[int, int]] = []
    compute = engine._compute

    def clocked(scheduled):  # type: ignore[no-untyped-def]
        chunks.extend((s.num_computed_tokens, s.num_scheduled_tokens) for s in scheduled)
        return compute(scheduled)

    engine._compute = clocked  # type: ignore[method-assign]
    pending = deque(items)
    clock, ttft, order = 0.0, {}, []
    while pending or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and arrival[pending[0].request_id] > clock:
            clock = arrival[pending[0].request_id]
        while pending and arrival[pending[0].request_id] <= clock:
            engine.add_request(pending.popleft())
        chunks.clear()
        loaded = engine.stats.prefill_loaded_tokens
        st = engine.step()
        for c, m in chunks:
            clock += m * _ET.token_s + _ET.attn_s * ((c + m) ** 2 - c**2)
        clock += (engine.stats.prefill_loaded_tokens - loaded) * _ET.link_s
        for rid in st.finished:
            ttft[rid] = clock - arrival[rid]
            order.append(rid)
    engine.run_until_done()
    engine.shutdown()
    return ttft, order


@pytest.mark.parametrize(("capacity", "budget"), [(4, 1024), (12, 1024), (400, 96)])
def test_model_ttft_equals_the_reference_engine_clocked_by_its_costs(
    tmp_path: Path, capacity: int, budget: int
) -> None:
    lines = random_mooncake(60, 5, block_tokens=64, max_blocks=8)
    for i, line in enumerate(lines):
        line["timestamp"] = i * 150  # busy enough to queue: a 500-token prompt takes ~0.55 s
        line["output_length"] = 1  # the first token ends the request: no decode in either
    path = write_mooncake(tmp_path / "t.jsonl", lines)
    ttft, order = _engine_ttft(path, capacity, budget)

    ft = FleetTrace.from_mooncake(read_mooncake_trace(path, 64), 64, 32)
    res = replay_fleet(ft, "random", 1, "lru", capacity)
    host, tier = res.token_split(ft.trace.prompt_tokens, 32)
    no_decode = np.zeros(ft.trace.num_requests, dtype=np.int64)
    model = time_requests(
        _ET, ft.arrival_s, res.replica, 1, ft.trace.prompt_tokens, no_decode, host, tier, ft.duration_s
    )
    ids = [f"r{r.line}" for r in read_mooncake_trace(path, 64)]
    assert order == ids  # one replica serves in arrival order
    got = np.array([ttft[i] for i in ids])
    assert np.allclose(got, model.ttft, rtol=1e-9, atol=1e-9), np.abs(got - model.ttft).max()
    assert model.queue.max() > 0.1  # the workload queues: the check covers waiting, not only service
    assert (host > 0).any() or capacity < 8
