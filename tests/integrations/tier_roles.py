"""The worker's part around vLLM's own ``TieringOffloadingSpec(...).get_manager()`` (scheduler side only).

vLLM's CPU worker refuses a CPU-only machine, so these helpers do what it would: write a chunk's
bytes into the shared region where a GPU->CPU store lands, read them back where a CPU->GPU load
reads. Every chunk's bytes are a pure function of its key (:func:`payload`), so any process can
check them. ``python -m tests.integrations.tier_roles promote <tier-json> <n>`` runs the promoting
role in a fresh process (a second engine) and prints its findings as JSON.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import uuid
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

ROW = 4096  # one chunk: 256 KV bytes, rounded up to the page by vLLM's CPU spec


def offloading_config(extra: dict[str, Any], model: str = "test/tiny-model") -> OffloadingConfig:
    """A one-group, one-worker ``OffloadingConfig`` (256 KV bytes per block) with its own engine id."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=4, layer_names=("model.layers.0.attn",), group_id=0),),
        worker_kv_bytes_per_block=256,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=f"kvoffload-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=4, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def tiering_manager(tier: dict[str, Any], chunks: int = 16, model: str = "test/tiny-model") -> Any:
    """vLLM's own ``TieringOffloadingManager`` with ``tier`` as its one secondary tier."""
    extra = {"cpu_bytes_to_use": chunks * ROW, "secondary_tiers": [dict(tier)]}
    return TieringOffloadingSpec(offloading_config(extra, model)).get_manager()


def keys(n: int, seed: int = 0) -> list[bytes]:
    return [make_offload_key(hashlib.sha256(f"block-{seed}-{i}".encode()).digest(), 0) for i in range(n)]


def payload(key: bytes) -> np.ndarray:
    """The ROW bytes of ``key``'s chunk."""
    return np.frombuffer(hashlib.blake2b(key, digest_size=64).digest() * (ROW // 64), dtype=np.uint8)


def rows(mgr: Any) -> np.ndarray:
    return np.asarray(mgr.primary_tier.get_kv_memoryview()).view(np.uint8)


def step(mgr: Any) -> None:
    mgr.on_schedule_end(ScheduleEndContext((), ()))


def settle(mgr: Any, timeout: float = 20.0) -> None:
    """Step (at least once: deferred promotions are submitted at the end of a step) until the
    manager has no transfer in flight."""
    deadline = time.monotonic() + timeout
    step(mgr)
    while mgr.has_pending_work():
        if time.monotonic() > deadline:
            raise AssertionError("tier jobs still pending")
        step(mgr)
        time.sleep(0.005)


def store(mgr: Any, ks: list[bytes], req_id: str = "writer") -> list[int]:
    """Store ``ks`` GPU->CPU (the worker's part: write their payloads), let the cascades finish."""
    ctx = ReqContext(req_id)
    mgr.on_new_request(ctx)
    out = mgr.prepare_store(ks, ctx)
    assert out is not None
    arr = rows(mgr)
    chunk_ids = [int(c) for c in out.store_spec.chunk_ids]
    for k, c in zip(out.keys_to_store, chunk_ids, strict=True):
        arr[c] = payload(k)
    mgr.complete_store(out.keys_to_store, ctx)
    mgr.on_request_finished(ctx)
    settle(mgr)
    return chunk_ids


def lookup_until_settled(mgr: Any, ks: list[bytes], ctx: ReqContext, timeout: float = 20.0) -> list[LookupResult]:
    """Look ``ks`` up each step (as vLLM's scheduler retries) until none is RETRY / HIT_PENDING."""
    deadline = time.monotonic() + timeout
    while True:
        res = [mgr.lookup(k, ctx) for k in ks]
        if all(r in (LookupResult.HIT, LookupResult.MISS) for r in res):
            return res
        if time.monotonic() > deadline:
            raise AssertionError(f"lookups still unsettled: {res}")
        step(mgr)
        time.sleep(0.005)


def load(mgr: Any, ks: list[bytes], req_id: str = "reader", timeout: float = 20.0) -> dict[str, Any]:
    """Look ``ks`` up (promoting tier hits), then load the hits CPU->GPU (the worker's part: read the
    bytes). Returns per key the final lookup and whether the loaded bytes equal the key's payload."""
    ctx = ReqContext(req_id)
    mgr.on_new_request(ctx)
    res = lookup_until_settled(mgr, ks, ctx, timeout)
    hits = [k for k, r in zip(ks, res, strict=True) if r is LookupResult.HIT]
    equal: list[bool] = []
    if hits:
        spec = mgr.prepare_load(hits, ctx)
        arr = rows(mgr)
        equal = [bool(np.array_equal(arr[int(c)], payload(k))) for k, c in zip(hits, spec.chunk_ids, strict=True)]
        mgr.complete_load(hits, ctx)
    mgr.on_request_finished(ctx)
    settle(mgr)
    return {"hit": [r is LookupResult.HIT for r in res], "equal": equal}


def _main(argv: list[str]) -> None:
    role, tier_json, n = argv[0], argv[1], int(argv[2])
    assert role == "promote"
    mgr = tiering_manager(json.loads(tier_json))
    try:
        t0 = time.perf_counter()
        found = load(mgr, keys(n))
        found["seconds"] = time.perf_counter() - t0
        found["stats"] = mgr.secondary_tiers[0].tier.stats().blocks_read
    finally:
        mgr.shutdown()
    print(json.dumps(found))


if __name__ == "__main__":
    _main(sys.argv[1:])
