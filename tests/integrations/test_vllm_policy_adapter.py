"""A vLLM ``CachePolicy`` run through kvoffload's adapter gets the calls vLLM's own manager makes:
the same methods in the same order, the same keys, the request's own context (its state and key
positions), ``on_request_access`` on vLLM 0.33, pins at ``prepare_load``. Compared call for call
with vLLM's ``CPUOffloadingManager`` driving the same recording policy. Not compared: ``get`` (the
adapter never calls it: kvoffload's manager keeps the key index) and an ``evict`` that fails (it
changes nothing; kvoffload's manager does not call it when the offered keys are all it could
evict, vLLM's does)."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import inspect  # noqa: E402
import random  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager  # noqa: E402
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy  # noqa: E402
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy  # noqa: E402

from kvoffload.integrations.vllm import KVOffloadManager  # noqa: E402

#: vLLM 0.33's policies are told the storing request's context at insert (0.32's are not)
TAKES_CONTEXT = "req_context" in inspect.signature(LRUCachePolicy.insert).parameters
#: the calls of each recording policy instance, appended by the instance (a list per manager)
CALLS: list[list[tuple[Any, ...]]] = []


def _ctx(c: Any) -> Any:
    return None if c is None else c.req_id


def _recording(base: type) -> type:
    """``base`` with every hook recorded as ``(name, keys, request id, ...)``."""

    class Recording(base):  # type: ignore[misc,valid-type]
        def __init__(self, cache_capacity: int) -> None:
            super().__init__(cache_capacity)
            self.calls: list[tuple[Any, ...]] = []
            CALLS.append(self.calls)

        if TAKES_CONTEXT:

            def insert(self, key: Any, chunk: Any, req_context: Any) -> None:
                self.calls.append(("insert", key, chunk.chunk_id, req_context.req_id))
                super().insert(key, chunk, req_context)

        else:

            def insert(self, key: Any, chunk: Any) -> None:
                self.calls.append(("insert", key, chunk.chunk_id))
                super().insert(key, chunk)

        def remove(self, key: Any) -> None:
            self.calls.append(("remove", key))
            super().remove(key)

        def touch(self, keys: Any, req_context: Any) -> None:
            keys = list(keys)
            self.calls.append(("touch", keys, _ctx(req_context)))
            super().touch(keys, req_context)

        def on_store_miss(self, keys: Any, req_context: Any) -> None:
            keys = list(keys)
            self.calls.append(("on_store_miss", keys, _ctx(req_context)))
            super().on_store_miss(keys, req_context)

        def on_request_access(self, keys: Any, req_context: Any) -> None:
            keys = list(keys)
            self.calls.append(("on_request_access", keys, _ctx(req_context)))
            super().on_request_access(keys, req_context)  # type: ignore[misc]

        def on_request_finished(self, key_groups: Any, ins: Any, reu: Any, req_context: Any) -> None:
            groups = [list(g) for g in key_groups]
            self.calls.append(("on_request_finished", groups, sorted(ins), sorted(reu), _ctx(req_context)))
            super().on_request_finished(key_groups, ins, reu, req_context)

        def evict(self, n: int, protected: Any) -> Any:
            got = super().evict(n, protected)
            if got is not None:  # (a failed evict changes nothing: vLLM's manager may try one that
                # kvoffload's knows to be hopeless, the offered keys being all it could evict)
                self.calls.append(("evict", n, [k for k, _ in got]))
            return got

        def mark_evictable(self, key: Any) -> None:
            self.calls.append(("mark_evictable", key))
            super().mark_evictable(key)

        def mark_non_evictable(self, key: Any) -> None:
            self.calls.append(("mark_non_evictable", key))
            super().mark_non_evictable(key)

        def clear(self) -> None:
            self.calls.append(("clear",))
            super().clear()

    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording


RecordingLRU = _recording(LRUCachePolicy)
RecordingARC = _recording(ARCCachePolicy)
if not hasattr(LRUCachePolicy, "on_request_access"):  # vLLM 0.32: no such hook to record
    del RecordingLRU.on_request_access, RecordingARC.on_request_access


def key(chain: int, depth: int, group: int = 0) -> bytes:
    return make_offload_key(chain.to_bytes(4, "big") + depth.to_bytes(4, "big"), group)


@pytest.mark.parametrize("cls", ["RecordingLRU", "RecordingARC"])
@pytest.mark.parametrize("seed", range(2))
def test_the_adapter_makes_vllms_policy_calls(cls: str, seed: int) -> None:
    CALLS.clear()
    ms = (
        KVOffloadManager(6, cache_policy=cls, cache_policy_module_path=__name__),
        VLLMManager(6, cache_policy=cls, cache_policy_module_path=__name__),
    )
    assert len(CALLS) == 2
    rng = random.Random(seed)
    live: list[tuple[ReqContext, ReqContext, list[bytes]]] = []
    loads: list[tuple[tuple[ReqContext, ReqContext], list[bytes]]] = []
    stores: list[tuple[tuple[ReqContext, ReqContext], list[bytes]]] = []
    for n in range(400):
        what = rng.random()
        if what < 0.2 and len(live) < 4:
            chain, length = rng.randrange(4), rng.randint(1, 5)
            keys = [key(chain, d, g) for d in range(length) for g in (0, 1)[: rng.randint(1, 2)]]
            ctxs = ReqContext(req_id=f"r{n}"), ReqContext(req_id=f"r{n}")
            for c in ctxs:
                for i, kk in enumerate(keys):
                    c.set_offload_key_position(kk, 16 * (i // 2 + 1))
            for m, c in zip(ms, ctxs, strict=True):
                m.on_new_request(c)
            live.append((*ctxs, keys))
        elif what < 0.6 and live:
            a, b, keys = rng.choice(live)
            hits = []
            for kk in keys:
                got = ms[0].lookup(kk, a)
                assert got == ms[1].lookup(kk, b)
                if got is not LookupResult.HIT:
                    break
                hits.append(kk)
            if hits:
                ms[0].prepare_load(hits, a)
                ms[1].prepare_load(hits, b)
                loads.append(((a, b), hits))
            rest = keys[len(hits) :]
            if rest:
                outs = ms[0].prepare_store(rest, a), ms[1].prepare_store(rest, b)
                assert (outs[0] is None) == (outs[1] is None)
                if outs[0] is not None and outs[0].keys_to_store:
                    stores.append(((a, b), list(outs[0].keys_to_store)))
        elif what < 0.72 and loads:
            (a, b), keys = loads.pop(rng.randrange(len(loads)))
            ms[0].complete_load(keys, a)
            ms[1].complete_load(keys, b)
        elif what < 0.88 and stores:
            (a, b), keys = stores.pop(rng.randrange(len(stores)))
            ok = rng.random() < 0.9
            ms[0].complete_store(keys, a, ok)
            ms[1].complete_store(keys, b, ok)
        elif live:
            a, b, _ = live.pop(rng.randrange(len(live)))
            ms[0].on_request_finished(a)
            ms[1].on_request_finished(b)
        assert CALLS[0] == CALLS[1], n
    names = {c[0] for c in CALLS[0]}
    assert {"insert", "evict", "mark_evictable", "mark_non_evictable", "on_request_finished"} <= names
    assert ("on_request_access" in names) == hasattr(LRUCachePolicy, "on_request_access")
