"""Request hooks (vLLM's request-scoped recency, ``record_requests=True``), four-valued lookups,
per-offer reuse counting."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kvoffload
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import (
    LOOKUP_HIT,
    LOOKUP_MISS,
    LOOKUP_PENDING,
    LOOKUP_RETRY,
    LookupCode,
    lookup_code,
)
from kvoffload.errors import InvalidArgumentError
from tests.keys import POLICIES, ctx, k


def hooked(num_blocks: int, cache_policy: str = "lru") -> CPUOffloadingManager:
    return CPUOffloadingManager(num_blocks, cache_policy, record_requests=True)


def store(m: CPUOffloadingManager, keys: list[bytes], rid: str) -> None:
    out = m.prepare_store(keys, ctx(rid))
    assert out is not None
    m.complete_store(out.keys_to_store, ctx(rid))


def lru_order(core: CPUOffloadingManager) -> list[bytes]:
    """Keys of an LRU core, least recent first, read by evicting everything from a copy-free probe."""
    evicted: list[bytes] = []
    n = len(core)
    out = core.prepare_store([k(10_000 + i) for i in range(core.num_blocks)], ReqContext("probe"))
    assert out is not None
    evicted = out.evicted_keys
    assert len(evicted) == n
    return evicted


def test_lookup_code_values() -> None:
    assert [int(v) for v in LookupCode] == [LOOKUP_MISS, LOOKUP_HIT, LOOKUP_PENDING, LOOKUP_RETRY]
    assert lookup_code(True) is LookupCode.HIT
    assert lookup_code(False) is LookupCode.MISS
    assert lookup_code(None) is LookupCode.PENDING
    m = hooked(4)
    m.prepare_store([k(1)], ctx("a"))
    assert lookup_code(m.lookup(k(1), ctx("a"))) is LookupCode.PENDING
    m.complete_store([k(1)], ctx("a"))
    assert lookup_code(m.lookup(k(1), ctx("a"))) is LookupCode.HIT
    assert lookup_code(m.lookup(k(2), ctx("a"))) is LookupCode.MISS


def test_peek_counts_nothing() -> None:
    core = CPUOffloadingManager(4)
    core.prepare_store([k(1), k(2)], ctx("a"))
    core.complete_store([k(1)], ctx("a"))
    core.get_stats()
    assert core.peek([k(1), k(2), k(3), k(1)]).tolist() == [LOOKUP_HIT, LOOKUP_PENDING, LOOKUP_MISS, LOOKUP_HIT]
    st = core.get_stats()
    assert st.lookups == st.hits == st.misses == 0


def test_lru_recency_applied_at_request_end_head_most_recent() -> None:
    core = m = hooked(8)
    m.on_new_request(ctx("a"))
    store(m, [k(1), k(2), k(3)], "a")
    m.on_new_request(ctx("b"))
    store(m, [k(4), k(5)], "b")
    m.on_request_finished(ctx("b"))
    # a loads its prefix while running: nothing changes until it finishes
    m.on_new_request(ctx("c"))
    spec = m.prepare_load([k(1), k(2)], ctx("c"))
    m.complete_load([k(1), k(2)], ctx("c"))
    assert len(spec) == 2
    m.on_request_finished(ctx("a"))
    m.on_request_finished(ctx("c"))
    assert m.num_tracked_requests == 0
    # c touched 1, 2 last (1 most recent); a's 3 before that; b's 4, 5 oldest
    assert lru_order(core) == [k(5), k(4), k(3), k(2), k(1)]


def test_key_position_orders_keys() -> None:
    core = m = hooked(8)
    m.on_new_request(ctx("a"))
    store(m, [k(3)], "a")  # stored out of prefix order (e.g. a sliding-window backfill)
    store(m, [k(1), k(2)], "a")
    pos = {k(1): 4, k(2): 8, k(3): 12}
    m.on_request_finished(ctx("a"), key_position=pos.get)
    assert lru_order(core) == [k(3), k(2), k(1)]


def test_key_order_with_unknown_positions_and_keys_recorded_twice() -> None:
    # a key without a position: every key by group, then first seen (positions ignored)
    core = m = hooked(8)
    store(m, [k(3, 1)], "a")
    store(m, [k(1), k(2)], "a")
    m.on_request_finished(ctx("a"), key_position={k(1): 4, k(2): 8}.get)
    assert lru_order(core) == [k(3, 1), k(2), k(1)]
    # a key read, then offered again with a new one: recorded twice, applied once, by position
    core = m = hooked(8)
    store(m, [k(1), k(2)], "x")
    m.on_new_request(ctx("b"))
    m.prepare_load([k(1)], ctx("b"))
    m.complete_load([k(1)], ctx("b"))
    store(m, [k(1), k(3)], "b")
    m.on_request_finished(ctx("b"), key_position={k(1): 0, k(3): 16}.get)
    assert lru_order(core) == [k(2), k(3), k(1)]
    # one key without a position
    core = m = hooked(8)
    store(m, [k(1)], "c")
    m.on_request_finished(ctx("c"), key_position={}.get)
    assert lru_order(core) == [k(1)]


def test_arc_inserted_only_stays_in_t1_reused_moves_to_t2() -> None:
    core = m = hooked(8, "arc")
    m.on_new_request(ctx("a"))
    store(m, [k(1), k(2)], "a")
    m.on_request_finished(ctx("a"))
    pol = core.policy
    t1, t2 = pol.ordered_slots()
    assert len(t1) == 2 and t2 == []  # a store is not a second access
    m.on_new_request(ctx("b"))
    m.prepare_load([k(1)], ctx("b"))
    m.complete_load([k(1)], ctx("b"))
    store(m, [k(1), k(2), k(3)], "b")  # 1, 2 already stored (reused), 3 new
    m.on_request_finished(ctx("b"))
    t1, t2 = pol.ordered_slots()
    slot = {key: core.table.index[key] for key in (k(1), k(2), k(3))}
    assert t1 == [slot[k(3)]]
    assert t2 == [slot[k(2)], slot[k(1)]]  # head of the prompt most recent
    # the seed API's touch still promotes a ready T1 block
    core.touch([k(3)], ctx("x"))
    assert pol.ordered_slots()[0] == []


def test_arc_adapts_on_ghost_hit_at_store_time_once_per_request() -> None:
    core = m = hooked(2, "arc")
    store(m, [k(1), k(2)], "a")
    store(m, [k(3), k(4)], "b")  # evicts 1, 2 from T1 into B1
    pol = core.policy
    assert list(pol.b1) == [k(1), k(2)] and pol.target_t1_size == 0
    m.on_new_request(ctx("c"))
    assert m.prepare_store([k(1)], ctx("c")) is not None
    assert pol.target_t1_size == 1.0  # B1 ghost hit: +max(1, |B2|/|B1|)
    m.complete_store([k(1)], ctx("c"))
    # the same request offering a key again does not adapt twice
    m.prepare_store([k(1)], ctx("c"))
    assert pol.target_t1_size == 1.0


def test_hooks_on_lru_ignore_anonymous_and_reset() -> None:
    m = hooked(4)
    store(m, [k(1)], "")
    assert m.num_tracked_requests == 0
    m.on_new_request(ctx("a"))
    store(m, [k(2)], "a")
    assert m.num_tracked_requests == 1
    m.reset_cache()
    assert m.num_tracked_requests == 0 and m.lookup(k(2), ctx("a")) is False


def test_without_record_requests_nothing_is_recorded() -> None:
    m = CPUOffloadingManager(4, "arc")
    m.on_new_request(ctx("a"))
    store(m, [k(1)], "a")
    assert m.num_tracked_requests == 0
    m.on_request_finished(ctx("a"))  # nothing recorded: nothing applied
    assert m.policy.ordered_slots() == ([0], [])


def test_reuse_count_on_offer_matches_vllm() -> None:
    f = CPUOffloadingManager(8, store_threshold=2, max_tracker_size=3, count_on="offer")
    assert f.reuse is not None
    assert f.lookup(k(1), ctx("a")) is False and not f.reuse.counts  # lookups count nothing
    out = f.prepare_store([k(1), k(2)], ReqContext())  # anonymous offers count too
    assert out is not None and out.keys_to_store == []
    out = f.prepare_store([k(1), k(2)], ctx("b"))
    assert out is not None and out.keys_to_store == [k(1), k(2)]
    # full tracker: keys of the current offer are never evicted to make room
    f.reuse.counts.clear()
    f.prepare_store([k(5), k(6), k(7)], ctx("c"))
    f.prepare_store([k(5), k(6), k(7), k(8)], ctx("c"))
    assert dict(f.reuse.counts) == {k(5): 2, k(6): 2, k(7): 2}
    with pytest.raises(InvalidArgumentError):
        CPUOffloadingManager(8, store_threshold=2, count_on="sometimes")


def test_import_kvoffload_never_imports_vllm() -> None:
    code = (
        "import sys, kvoffload, kvoffload.app.cli, kvoffload.engine, kvoffload.simulate\n"
        "assert 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    pkg = Path(kvoffload.__file__).resolve().parent
    for f in pkg.rglob("*.py"):
        if "integrations" in f.relative_to(pkg).parts:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "vllm" or n.startswith("vllm.") for n in names), f


@pytest.mark.parametrize("policy", POLICIES)
def test_on_request_finished_list_and_array_forms_agree(policy: str) -> None:
    import random

    import numpy as np

    rng = random.Random(3)
    cores = [CPUOffloadingManager(16, cache_policy=policy) for _ in range(2)]
    for step in range(60):
        keys = list(dict.fromkeys(k(rng.randrange(40)) for _ in range(rng.randint(1, 8))))  # distinct: the contract
        uniq = list(dict.fromkeys(keys))
        inserted = {x for x in uniq if rng.random() < 0.4}
        reused = {x for x in uniq if rng.random() < 0.4}
        for i, core in enumerate(cores):
            out = core.prepare_store(uniq, ctx(f"s{step}"))
            if out is not None:
                core.complete_store(out.keys_to_store, ctx(f"s{step}"))
            slots = [core.table.index.get(x, -1) for x in keys]
            ins, reu = [x in inserted - reused for x in keys], [x in reused for x in keys]
            if i == 0 and core.policy.takes_lists:  # the small-call form
                core.policy.on_request_finished(keys, slots, ins, reu)
            else:
                core.policy.on_request_finished(
                    keys, np.array(slots, dtype=np.int64), np.array(ins, dtype=bool), np.array(reu, dtype=bool)
                )
        a, b = cores
        assert a.peek(list(a.table.index)).tolist() == b.peek(list(a.table.index)).tolist()
        assert sorted(a.table.index) == sorted(b.table.index)
        if hasattr(a.policy, "ordered_slots"):
            assert a.policy.ordered_slots() == b.policy.ordered_slots()


@pytest.mark.parametrize("policy", POLICIES)
def test_discard_removes_only_ready_unpinned_keys(policy: str) -> None:
    core = CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    c = ctx("a")
    out = core.prepare_store([k(1), k(2), k(3), k(4)], c)
    assert out is not None
    core.complete_store([k(1), k(2), k(3)], c)  # k(4) stays pending
    core.prepare_load([k(2)], c)  # k(2) pinned
    core.take_events()
    assert core.discard([k(1), k(2), k(4), k(9), k(1)], c) == [k(1)]
    assert [(e.keys, e.removed) for e in core.take_events()] == [([k(1)], True)]
    assert k(1) not in core and len(core) == 3
    # the freed slot is reused, and the pool still evicts consistently
    core.complete_load([k(2)], c)
    core.complete_store([k(4)], c)
    out = core.prepare_store([k(5), k(6)], c)
    assert out is not None and sorted(out.store_spec.block_ids.tolist())[0] == 0 and len(out.evicted_keys) == 1
    core.complete_store([k(5), k(6)], c)
    out = core.prepare_store([k(7), k(8), k(10), k(11)], c)
    assert out is not None and len(out.evicted_keys) == 4 and len(core) == 4
