"""KVOffloadManager against vLLM's own CPUOffloadingManager on interleaved requests, as vLLM's
scheduler drives a manager: several requests in flight at once, loads and stores completing steps
later and in any order, stores that fail, requests finished while their stores are in flight,
finished twice, or never started, and ``reset_cache`` (after which vLLM never completes the jobs
it had in flight). Every answer vLLM exposes is compared call for call: lookups, load and store
slots, stored and evicted keys, events, and the exported stats.

Under vLLM 0.33 kvoffload's ``lru`` is ``request_lru`` (vLLM 0.33's ranking of a running request's
blocks), under 0.32 its own ``lru``: both are compared with the vLLM they run under. ``vllm-lru`` /
``vllm-arc`` run vLLM's own policy classes through kvoffload's adapter (with the request context,
``on_request_access`` and pins at ``prepare_load`` that vLLM's manager gives them).
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import random  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager  # noqa: E402
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy as VLLMLRU  # noqa: E402

from kvoffload.integrations.vllm import KVOffloadManager  # noqa: E402

TOKENS_PER_KEY = 16
#: vLLM 0.33's LRU: provisional ranks for the blocks of running requests (``on_request_access``)
LRU_RANKS_RUNNING_REQUESTS = hasattr(VLLMLRU, "on_request_access")


def key(chain: int, depth: int, group: int) -> bytes:
    return make_offload_key(chain.to_bytes(4, "big") + depth.to_bytes(4, "big"), group)


@dataclass
class Request:
    """One request's contexts (kvoffload's, vLLM's) and its keys per KV-cache group, head first."""

    ctxs: tuple[ReqContext, ReqContext]
    keys: dict[int, list[bytes]]
    finished: bool = False


@dataclass
class Job:
    """A load or store in flight: its request and the keys each manager handed out."""

    req: Request
    keys: tuple[list[bytes], list[bytes]]


def new_request(rng: random.Random, n: int, with_positions: bool) -> Request:
    """A request continuing one of a few conversations (shared prefixes), one or two groups."""
    chain, length = rng.randrange(5), rng.randint(1, 8)
    groups = [0] if rng.random() < 0.7 else [0, 1]
    keys = {g: [key(chain, d, g) for d in range(length)] for g in groups}
    ctxs = (ReqContext(req_id=f"r{n}"), ReqContext(req_id=f"r{n}"))
    if with_positions:
        for c in ctxs:
            for g in groups:
                for d, kk in enumerate(keys[g]):
                    c.set_offload_key_position(kk, (d + 1) * TOKENS_PER_KEY)
    return Request(ctxs, keys)


def stats(m: Any) -> dict[str, Any]:
    return m.get_stats().data["data"]  # type: ignore[no-any-return]


def events(m: Any) -> list[tuple[bool, list[bytes]]]:
    return [(e.removed, sorted(e.keys)) for e in m.take_events()]


#: kvoffload's policy options per compared policy (vLLM's manager runs the policy of that name)
KVOFFLOAD_POLICY: dict[str, dict[str, str]] = {
    "lru": {"cache_policy": "lru"},
    "arc": {"cache_policy": "arc"},
    "vllm-lru": {"cache_policy": "LRUCachePolicy", "cache_policy_module_path": "vllm.v1.kv_offload.cpu.policies.lru"},
    "vllm-arc": {"cache_policy": "ARCCachePolicy", "cache_policy_module_path": "vllm.v1.kv_offload.cpu.policies.arc"},
}


@pytest.mark.parametrize("policy", list(KVOFFLOAD_POLICY))
@pytest.mark.parametrize("threshold", [0, 2])
@pytest.mark.parametrize("seed", range(3))
def test_interleaved_requests_decide_as_vllm(policy: str, threshold: int, seed: int) -> None:
    rng = random.Random(seed)
    common: dict[str, Any] = {"store_threshold": threshold, "max_tracker_size": 40, "enable_events": True}
    ms = (
        KVOffloadManager(10, **KVOFFLOAD_POLICY[policy], **common),
        VLLMManager(10, cache_policy=policy.removeprefix("vllm-"), **common),
    )
    live: list[Request] = []
    loads: list[Job] = []
    stores: list[Job] = []
    universe = {key(c, d, g) for c in range(5) for d in range(8) for g in (0, 1)}
    n_req = 0
    for step in range(1200):
        what = rng.random()
        if what < 0.15 and len(live) < 5:  # a request arrives
            req = new_request(rng, n_req, with_positions=rng.random() < 0.8)
            n_req += 1
            for m, c in zip(ms, req.ctxs, strict=True):
                m.on_new_request(c)
            live.append(req)
        elif what < 0.45 and live:  # a lookup of a group's prefix; its hits loaded, the rest offered
            req = rng.choice([r for r in live if not r.finished] or live)
            if req.finished:
                continue
            g = rng.choice(list(req.keys))
            hits: list[bytes] = []
            for kk in req.keys[g]:
                got = [m.lookup(kk, c) for m, c in zip(ms, req.ctxs, strict=True)]
                assert got[0] == got[1], (step, kk)
                if got[0] is not LookupResult.HIT:
                    break
                hits.append(kk)
            if hits and rng.random() < 0.8:
                specs = [m.prepare_load(list(hits), c) for m, c in zip(ms, req.ctxs, strict=True)]
                assert specs[0].block_ids.tolist() == specs[1].block_ids.tolist(), step
                loads.append(Job(req, (list(hits), list(hits))))
            rest = req.keys[g][len(hits) :]
            if rest:
                outs = [m.prepare_store(list(rest), c) for m, c in zip(ms, req.ctxs, strict=True)]
                assert (outs[0] is None) == (outs[1] is None), step
                if outs[0] is not None:
                    a, b = outs
                    assert a.keys_to_store == b.keys_to_store, step
                    assert a.store_spec.block_ids.tolist() == b.store_spec.block_ids.tolist(), step
                    assert sorted(a.evicted_keys) == sorted(b.evicted_keys), step
                    if a.keys_to_store:
                        stores.append(Job(req, (list(a.keys_to_store), list(b.keys_to_store))))
        elif what < 0.58 and loads:  # a load completes (any order)
            job = loads.pop(rng.randrange(len(loads)))
            for m, c, kk in zip(ms, job.req.ctxs, job.keys, strict=True):
                m.complete_load(kk, c)
        elif what < 0.75 and stores:  # a store completes, or fails
            job = stores.pop(rng.randrange(len(stores)))
            ok = rng.random() < 0.85
            for m, c, kk in zip(ms, job.req.ctxs, job.keys, strict=True):
                m.complete_store(kk, c, ok)
        elif what < 0.85 and live:  # a request ends (its jobs may still be in flight), maybe twice
            req = rng.choice(live)
            for _ in range(1 if rng.random() < 0.8 else 2):
                for m, c in zip(ms, req.ctxs, strict=True):
                    m.on_request_finished(c)
            req.finished = True  # dropped from ``live`` below once its jobs are done
        elif what < 0.88:  # a request vLLM frees without ever scheduling it
            ghost = new_request(rng, n_req, with_positions=False)
            n_req += 1
            for m, c in zip(ms, ghost.ctxs, strict=True):
                m.on_request_finished(c)
        elif what < 0.89 and not loads and not stores:  # a prefix-cache reset between steps
            for m in ms:
                m.reset_cache()
        elif what < 0.895:  # a reset with jobs in flight: vLLM never completes them afterwards
            for m in ms:
                m.reset_cache()
            loads.clear()
            stores.clear()
        else:  # the state of every key, events and stats
            for kk in sorted(universe):
                probe = ReqContext(req_id="probe")
                assert ms[0].lookup(kk, probe) == ms[1].lookup(kk, probe), (step, kk)
            assert events(ms[0]) == events(ms[1]), step
            assert stats(ms[0]) == stats(ms[1]), step
        live = [r for r in live if not r.finished or any(j.req is r for j in loads + stores)]
    assert events(ms[0]) == events(ms[1])
    assert n_req > 50


@pytest.mark.parametrize("policy", ["lru", "vllm-lru"])
def test_lru_orders_a_running_requests_blocks_as_the_vllm_it_runs_under(policy: str) -> None:
    """Request A stores two blocks, B one, A a third while still running; then C needs three
    slots. vLLM 0.32's LRU evicts in insertion order: A's first two, then B's. vLLM 0.33's evicts
    A's three, tail first (A's rank is its first access, before B's). kvoffload's decides as the
    vLLM it runs under."""
    ms = (KVOffloadManager(4, **KVOFFLOAD_POLICY[policy]), VLLMManager(4))
    a = (ReqContext(req_id="a"), ReqContext(req_id="a"))
    b = (ReqContext(req_id="b"), ReqContext(req_id="b"))
    c = (ReqContext(req_id="c"), ReqContext(req_id="c"))
    ka, kb, kc = [key(0, d, 0) for d in range(3)], [key(1, 0, 0)], [key(2, d, 0) for d in range(3)]
    for ctx, keys in ((a, ka), (b, kb), (c, kc)):
        for x in ctx:
            for d, kk in enumerate(keys):
                x.set_offload_key_position(kk, (d + 1) * TOKENS_PER_KEY)
    evicted = []
    for m, ca, cb, cc in zip(ms, a, b, c, strict=True):
        for ctx in (ca, cb, cc):
            m.on_new_request(ctx)
        for keys, ctx in ((ka[:2], ca), (kb, cb), (ka[2:], ca)):
            m.complete_store(m.prepare_store(keys, ctx).keys_to_store, ctx)
        evicted.append(m.prepare_store(kc, cc).evicted_keys)
    assert set(evicted[1]) == (set(ka) if LRU_RANKS_RUNNING_REQUESTS else {ka[0], ka[1], kb[0]})
    assert evicted[0] == evicted[1]  # the same blocks, in the same order
