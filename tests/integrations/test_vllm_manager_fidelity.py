"""KVOffloadManager and vLLM 0.32's own CPUOffloadingManager side by side, call for call (issue 15).

Each test drives both managers through the same calls (each with its own ``ReqContext``) and
compares what vLLM exposes: evicted keys, the stats it exports, events, attributes.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.base import Medium, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager  # noqa: E402

from kvoffload.integrations.vllm import KVOffloadManager  # noqa: E402


def k(name: str) -> bytes:
    return make_offload_key(name.encode().ljust(8, b"."), 0)


class Pair:
    """kvoffload's manager and vLLM's, built alike; :meth:`both` runs one call on each."""

    def __init__(self, num_chunks: int, **kw: Any) -> None:
        self.ours = KVOffloadManager(num_chunks, **kw)
        self.theirs = VLLMManager(num_chunks, **kw)
        self.ctx: dict[str, tuple[ReqContext, ReqContext]] = {}

    def req(self, rid: str) -> tuple[ReqContext, ReqContext]:
        if rid not in self.ctx:
            self.ctx[rid] = (ReqContext(req_id=rid), ReqContext(req_id=rid))
            self.both(lambda m, c: m.on_new_request(c), rid)
        return self.ctx[rid]

    def both(self, call: Callable[[Any, ReqContext], Any], rid: str = "setup") -> tuple[Any, Any]:
        cs = self.req(rid)
        return call(self.ours, cs[0]), call(self.theirs, cs[1])

    def store(self, keys: list[bytes], rid: str) -> tuple[Any, Any]:
        """prepare_store, then complete_store of what each stored; returns both outputs."""
        a, b = self.both(lambda m, c: m.prepare_store(list(keys), c), rid)
        for m, out, c in ((self.ours, a, self.req(rid)[0]), (self.theirs, b, self.req(rid)[1])):
            if out is not None and out.keys_to_store:
                m.complete_store(out.keys_to_store, c)
        return a, b

    def stat(self, name: str) -> tuple[Any, Any]:
        got = [m.get_stats().data["data"].get(name, {}).get(()) for m in (self.ours, self.theirs)]
        return got[0], got[1]


def evicted(outs: tuple[Any, Any]) -> tuple[list[bytes] | None, list[bytes] | None]:
    a, b = outs
    return (None if a is None else sorted(a.evicted_keys)), (None if b is None else sorted(b.evicted_keys))


def test_offered_keys_are_never_evicted_by_their_call_with_a_reuse_filter() -> None:
    """The issue's case: ``a`` is resident but its count was forgotten by the tracker, so the
    filter holds it back; vLLM still protects it (every offered key) and evicts ``b``."""
    p = Pair(2, store_threshold=2, max_tracker_size=2)
    for name in ("a", "b"):
        p.store([k(name)], "r")
        p.store([k(name)], "r")
    p.store([k("n1"), k("n2")], "r")
    p.store([k("c")], "r")
    ours, theirs = evicted(p.store([k("a"), k("c")], "r"))
    assert theirs == [k("b")]
    assert ours == theirs


def test_stores_skipped_counts_only_absent_keys_held_back() -> None:
    """A stored key, forgotten by a 1-entry tracker, offered again: not a skipped store."""
    p = Pair(4, store_threshold=2, max_tracker_size=1)
    seen = []
    for keys in ([k("a")], [k("a")], [k("x")], [k("a")], [k("a"), k("y")]):
        p.store(keys, "r")
        seen.append(p.stat(CPUOffloadingMetrics.STORES_SKIPPED))
    assert [theirs for _, theirs in seen] == [1, 0, 1, 0, 1]
    assert [ours for ours, _ in seen] == [theirs for _, theirs in seen]


@pytest.mark.parametrize(
    ("threshold", "c_counted_before", "victim"), [(0, False, "b"), (2, True, "b"), (2, False, "c")]
)
def test_store_candidates_of_a_failed_store_are_recorded_for_the_request(
    threshold: int, c_counted_before: bool, victim: str
) -> None:
    """R offers ``c`` while every chunk is pinned; S stores ``c`` before R finishes. vLLM records
    R's store candidates before allocating, so R's finish refreshes ``c`` (LRU) and the next
    eviction takes ``b`` -- unless the reuse filter held ``c`` back from R's offer (its first
    offer): then it was no candidate, and ``c`` goes first."""
    p = Pair(2, cache_policy="lru", store_threshold=threshold)
    for _ in range(2 if threshold else 1):
        p.store([k("a"), k("b")], "p")
    if threshold:
        p.store([k("d")], "warm")  # d reaches the threshold with T's offer
        if c_counted_before:
            p.store([k("c")], "warm")  # c reaches it with R's offer
    p.both(lambda m, c: m.prepare_load([k("a"), k("b")], c), "L")  # pins every chunk
    ours, theirs = p.both(lambda m, c: m.prepare_store([k("c")], c), "R")
    assert (ours is None, theirs is None) == (victim == "b", victim == "b")
    p.both(lambda m, c: m.complete_load([k("a"), k("b")], c), "L")
    assert evicted(p.store([k("c")], "S")) == ([k("a")], [k("a")])
    for rid in ("S", "L", "R"):
        p.both(lambda m, c: m.on_request_finished(c), rid)
    ours, theirs = evicted(p.store([k("d")], "T"))
    assert theirs == [k(victim)]
    assert ours == theirs


def test_reset_cache_keeps_what_is_not_reported_yet() -> None:
    """Allocation sizes (and events) from before a reset are reported after it, as vLLM does."""
    p = Pair(4, enable_events=True)
    p.store([k("a"), k("b")], "r")
    p.both(lambda m, c: m.prepare_store([k("c")], c), "r")
    p.both(lambda m, c: m.reset_cache())
    ours, theirs = p.stat(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE)
    assert theirs == [2, 1] and ours == theirs
    ev_ours, ev_theirs = ([(sorted(e.keys), e.removed) for e in m.take_events()] for m in (p.ours, p.theirs))
    assert ev_theirs == [([k("a"), k("b")], False)] and ev_ours == ev_theirs


def test_medium_attribute() -> None:
    p = Pair(2)
    assert p.theirs.medium is Medium.CPU
    assert p.ours.medium is p.theirs.medium


@pytest.mark.parametrize("policy", ["arc", "ARCCachePolicy"])
def test_arc_falls_back_to_t1_when_t2_has_no_victim(policy: str) -> None:
    """T1 below its target and T2's only block pinned: vLLM 0.32's ARC takes the victim from T1
    (kvoffload's ARC, and vLLM's own class through the adapter, do the same)."""
    module = "vllm.v1.kv_offload.cpu.policies.arc" if policy != "arc" else None
    p = Pair(3, cache_policy="arc")
    p.ours = KVOffloadManager(3, cache_policy=policy, cache_policy_module_path=module)
    p.store([k("a"), k("b"), k("c")], "p")
    for new in ("d", "a", "b", "c"):  # each store evicts the oldest T1 block; ghost hits raise the target
        p.store([k(new)], f"s{new}")
    assert p.theirs._policy.target_t1_size == 3 and list(p.theirs._policy.t1) == [k("a"), k("b"), k("c")]
    p.both(lambda m, c: m.prepare_load([k("a")], c), "reuse")
    p.both(lambda m, c: m.complete_load([k("a")], c), "reuse")
    p.both(lambda m, c: m.on_request_finished(c), "reuse")  # a: reused, T1 -> T2
    p.both(lambda m, c: m.prepare_load([k("a")], c), "pin")  # T2's only block pinned
    ours, theirs = evicted(p.store([k("e")], "e"))
    assert theirs == [k("b")]
    assert ours == theirs


def test_filter_comes_first_as_in_vllm() -> None:
    """The reuse filter decides before anything else, as in vLLM's manager: ARC adapts only on
    ghost hits among the keys past the filter, a failed store's allocation size counts only
    those keys, and ``reset_cache`` keeps the filter's counts."""
    p = Pair(2, cache_policy="arc", store_threshold=2, max_tracker_size=4)
    for keys in ([k("a"), k("b")], [k("a"), k("b")], [k("c"), k("d")], [k("c"), k("d")]):
        p.store(keys, "warm")  # a, b stored, then evicted into B1 by c, d
    assert list(p.theirs._policy.b1) == [k("a"), k("b")]
    p.store([k("x")], "r1")  # the tracker (4 keys) forgets a
    p.store([k("a")], "r2")  # a ghost hit, but filtered (counted once): no adaptation
    assert p.ours.core.policy.target_t1_size == p.theirs._policy.target_t1_size == 0.0
    p.store([k("y")], "r3")  # y counted once
    p.stat(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE)  # drain
    p.both(lambda m, c: m.prepare_load([k("c"), k("d")], c), "pin")  # every chunk pinned
    ours, theirs = p.both(lambda m, c: m.prepare_store([k("y"), k("z")], c), "r4")  # z filtered, y: no room
    assert ours is None and theirs is None
    assert p.stat(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE) == ([1], [1])
    p.both(lambda m, c: m.complete_load([k("c"), k("d")], c), "pin")
    p.both(lambda m, c: m.reset_cache())
    assert p.ours.core.reuse is not None and dict(p.ours.core.reuse.counts) == dict(p.theirs.counts)
    assert len(p.theirs.counts) == 4
