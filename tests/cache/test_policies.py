"""Policies: registry (names and ``module:Class``), ARC and S3-FIFO rules, the slot-order log."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.policies import CachePolicy, available_policies, get_policy_class, register_policy
from kvoffload.cache.policies.arc import ARCPolicy
from kvoffload.cache.policies.lru import LRUPolicy
from kvoffload.cache.policies.order import SlotOrder
from kvoffload.cache.policies.s3fifo import S3FIFOPolicy
from kvoffload.core.base import make_offload_key
from tests.keys import CTX, k, ks


def store(m: CPUOffloadingManager, *ids: int) -> list[bytes]:
    out = m.prepare_store(ks(*ids), CTX)
    assert out is not None
    m.complete_store(ks(*ids), CTX)
    return out.evicted_keys


class FIFOPolicy(CachePolicy):
    """Out-of-tree example: plain FIFO (touch does nothing), on the public SlotOrder."""

    name = "fifo-test"

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.member = np.zeros(capacity, dtype=np.int8)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.q = SlotOrder(1, self.member, self.pos, capacity)

    def insert(self, slots: np.ndarray, keys: list[bytes]) -> None:
        self.q.push_back(slots)

    def remove(self, slots: np.ndarray) -> None:
        self.q.discard(slots)

    def touch(self, keys: list[bytes], slots: np.ndarray, unique: bool = False) -> None:
        pass

    def on_evictable(self, slots: np.ndarray) -> None:
        self.q.on_evictable(slots)

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        got = self.q.take(n, self.table.ref, protected, self.table.prot_mark)
        if len(got) < n:
            self.q.on_evictable(got)
            return None
        self.q.discard(got)
        return got

    def clear(self) -> None:
        self.member[:] = 0
        self.q.clear()

    def ordered_slots(self) -> list[int]:
        return self.q.ordered()


def test_registry_names_and_module_class() -> None:
    assert {"lru", "arc", "s3fifo"} <= set(available_policies())
    assert get_policy_class("lru") is LRUPolicy
    assert get_policy_class("arc") is ARCPolicy
    assert get_policy_class("s3fifo") is S3FIFOPolicy
    m = CPUOffloadingManager(2, cache_policy="tests.cache.test_policies:FIFOPolicy")
    assert type(m.policy).__name__ == "FIFOPolicy"
    store(m, 1, 2)
    m.touch(ks(1), CTX)
    assert store(m, 3) == ks(1)  # FIFO ignores the touch
    register_policy("fifo-test", FIFOPolicy)
    assert "fifo-test" in available_policies()
    assert store(CPUOffloadingManager(1, cache_policy="fifo-test"), 1) == []
    with pytest.raises(TypeError):
        register_policy("x", int)  # type: ignore[arg-type]


def test_lru_touch_order_and_pending_blocks() -> None:
    m = CPUOffloadingManager(4)
    store(m, 1, 2, 3)
    m.prepare_store(ks(4), CTX)  # pending, most recent
    m.touch(ks(3, 1, 9, 3), CTX)  # absent 9 ignored, repeated 3: first occurrence counts
    lru = m.policy
    assert [m.table.keys[s] for s in lru.ordered_slots()] == ks(2, 4, 1, 3)  # type: ignore[attr-defined]
    assert m.prepare_store(ks(5, 6), CTX) is not None  # evicts 2 then 1 (4 is pending)
    assert sorted(m.table.index) == sorted(ks(3, 4, 5, 6))


def test_arc_rules() -> None:
    m = CPUOffloadingManager(4, cache_policy="arc")
    arc: ARCPolicy = m.policy  # type: ignore[assignment]
    names = lambda slots: [m.table.keys[s] for s in slots]  # noqa: E731
    store(m, 1, 2)
    m.prepare_store(ks(3), CTX)  # pending in T1
    m.touch(ks(1, 3), CTX)  # 1 ready -> T2; 3 pending -> stays T1, most recent
    t1, t2 = arc.ordered_slots()
    assert names(t1) == ks(2, 3) and names(t2) == ks(1)
    m.complete_store(ks(3), CTX)
    store(m, 4)
    # T1 = [2, 3, 4], T2 = [1], target 0: T1 first
    assert store(m, 5) == ks(2)
    assert list(arc.b1) == ks(2)
    m.touch(ks(2), CTX)  # ghost hit in B1: target += max(1, |B2|/|B1|) = 1
    assert arc.target_t1_size == 1.0
    m.touch(ks(4, 3), CTX)  # 3, 4 -> T2; T1 = [5]
    t1, t2 = arc.ordered_slots()
    assert names(t1) == ks(5) and names(t2) == ks(1, 3, 4)
    # |T1| = 1 >= int(target) = 1: evict 5 from T1, then |T1| = 0 < 1: T2's oldest (1)
    assert store(m, 6, 7) == ks(5, 1)
    assert list(arc.b1) == ks(2, 5) and list(arc.b2) == ks(1)
    m.touch(ks(1), CTX)  # ghost hit in B2: target -= max(1, |B1|/|B2|) = 2 -> floored at 0
    assert arc.target_t1_size == 0.0


def test_arc_falls_back_to_t1_when_t2_has_nothing_evictable() -> None:
    """vLLM would refuse this store although T1 holds evictable blocks (see ARCPolicy)."""
    m = CPUOffloadingManager(3, cache_policy="arc")
    arc: ARCPolicy = m.policy  # type: ignore[assignment]
    store(m, 1, 2, 3)
    arc.target_t1_size = 3.0
    evicted = store(m, 4, 5)
    assert evicted == ks(1, 2)


def test_arc_ghosts_bounded_to_capacity() -> None:
    m = CPUOffloadingManager(2, cache_policy="arc")
    for i in range(0, 40, 2):
        store(m, i, i + 1)
    arc: ARCPolicy = m.policy  # type: ignore[assignment]
    assert len(arc.b1) <= 2 and len(arc.b2) <= 2


def test_s3fifo_filters_one_hit_wonders() -> None:
    m = CPUOffloadingManager(10, cache_policy="s3fifo")
    s3: S3FIFOPolicy = m.policy  # type: ignore[assignment]
    store(m, *range(10))
    m.touch(ks(0, 1), CTX)  # 0 and 1 reused
    evicted = store(m, 10, 11, 12)
    # small queue holds everything (main empty): 0 and 1 are promoted to M, 2, 3, 4 evicted
    assert evicted == ks(2, 3, 4)
    small, main = s3.ordered_slots()
    assert [m.table.keys[s] for s in main] == ks(0, 1)
    assert list(s3.ghost) == ks(2, 3, 4)
    # a ghost comes back: admitted straight into M
    store(m, 3)
    assert m.table.keys[s3.ordered_slots()[1][-1]] == k(3)


def test_pinned_blocks_at_the_old_end_are_parked_not_rescanned() -> None:
    n = 2000
    m = CPUOffloadingManager(n)
    keys = [make_offload_key(b"p%d" % i, 0) for i in range(n)]
    for i in range(0, n, 500):
        m.prepare_store(keys[i : i + 500], CTX)
        m.complete_store(keys[i : i + 500], CTX)
    m.prepare_load(keys[:1000], CTX)  # the 1000 oldest are pinned
    order: SlotOrder = m.policy.order  # type: ignore[attr-defined]
    new = [make_offload_key(b"n%d" % i, 0) for i in range(20)]
    out = m.prepare_store(new[:10], CTX)
    assert out is not None and out.evicted_keys == keys[1000:1010]
    head_after_first = order.head
    assert head_after_first >= 1010  # scanned past the pinned prefix once
    out = m.prepare_store(new[10:], CTX)
    assert out is not None and out.evicted_keys == keys[1010:1020]
    assert order.head - head_after_first == 10  # the second eviction looked at 10 entries only
    # unpinning puts them back at their recency position: they are the oldest again
    m.complete_load(keys[:1000], CTX)
    m.complete_store(new, CTX)
    out = m.prepare_store([make_offload_key(b"z", 0)], CTX)
    assert out is not None and out.evicted_keys == keys[:1]


def test_log_compaction_keeps_order() -> None:
    m = CPUOffloadingManager(5)
    store(m, 1, 2, 3, 4, 5)
    rng = np.random.default_rng(0)
    ref = ks(1, 2, 3, 4, 5)
    for _ in range(200):  # ~ 600 appends into a log of 2 * 5 + 64 entries
        pick = [ref[i] for i in rng.choice(5, size=3, replace=False)]
        m.touch(pick, CTX)
        for key in reversed(pick):
            ref.remove(key)
            ref.append(key)
    assert [m.table.keys[s] for s in m.policy.ordered_slots()] == ref  # type: ignore[attr-defined]
    assert m.policy.order.base > 0  # type: ignore[attr-defined]


def test_stats_and_reset() -> None:
    m = CPUOffloadingManager(4, enable_events=True)
    store(m, 1, 2, 3)
    m.prepare_store(ks(4), CTX)
    m.prepare_load(ks(1), CTX)
    m.lookup(k(1), CTX)
    m.lookup(k(9), CTX)
    m.lookup(k(4), CTX)
    m.lookup_batch(ks(1, 9, 4), CTX)
    s = m.get_stats()
    assert (s.num_blocks, s.num_used, s.num_pending, s.num_pinned, s.usage, s.write_usage) == (4, 4, 1, 1, 1.0, 0.25)
    assert (s.lookups, s.hits, s.misses, s.pending_hits) == (6, 2, 2, 2)
    assert (s.stores_started, s.stores_completed, s.loads, s.evictions) == (4, 3, 1, 0)
    assert m.prepare_store(ks(5, 6, 7), CTX) is None
    assert store(m, 2, 5) == ks(3)
    s = m.get_stats()
    assert (s.lookups, s.stores_failed, s.stores_skipped, s.evictions, s.stores_started) == (0, 3, 1, 1, 1)
    m.take_events()
    m.reset_cache()
    assert len(m) == 0 and list(m.take_events()) == []
    out = m.prepare_store(ks(8), CTX)
    assert out is not None and out.store_spec.block_ids.tolist() == [0]  # slots restart at 0
    assert m.get_stats().num_pinned == 0


def test_zero_capacity_pool() -> None:
    m = CPUOffloadingManager(0)
    assert m.prepare_store(ks(1), CTX) is None
    assert m.prepare_store([], CTX).keys_to_store == []  # type: ignore[union-attr]
    assert m.lookup_batch(ks(1, 2), CTX).tolist() == [0, 0]
    m.touch(ks(1), CTX)
    m.complete_store(ks(1), CTX)
    assert m.get_stats().usage == 0.0


@pytest.mark.parametrize(("seed", "budget"), [(1, 64), (2, 64), (3, 0), (4, 2)])
def test_order_list_calls_match_array_calls(seed: int, budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin orders under the same random pushes, moves, pins and removals: ``take`` (with and
    without a stamp limit) and ``peek`` called with lists answer as with arrays (``past_limit``
    too: what a peek finds next), and both orders stay equal (``budget``: the list scans' entry
    budget; 0 hands every scan to the array code)."""
    import kvoffload.cache.policies.order as order_mod

    monkeypatch.setattr(order_mod, "SCAN_BUDGET", budget)
    rng = np.random.default_rng(seed)
    cap = 40
    ref = np.zeros(cap, dtype=np.int32)
    mark = np.zeros(cap, dtype=np.int8)
    stamps = np.zeros(cap, dtype=np.int64)
    a, b = (SlotOrder(1, np.zeros(cap, dtype=np.int8), np.zeros(cap, dtype=np.int64), cap) for _ in range(2))
    held: list[int] = []  # slots in both lists
    clock = 0
    for _ in range(1500):
        op = rng.random()
        free = [s for s in range(cap) if s not in held]
        if op < 0.3 and free:
            new = rng.choice(free, size=min(len(free), int(rng.integers(1, 6))), replace=False).tolist()
            for s in new:
                ref[s] = int(rng.random() < 0.3)  # some pending/pinned from the start
                stamps[s] = clock
                clock += 1
            a.push_back(new, fresh=True)
            b.push_back(np.array(new, dtype=np.int64), fresh=True)
            held += new
        elif op < 0.45 and held:  # moved to the newest end
            moved = rng.choice(held, size=min(len(held), 3), replace=False).tolist()
            stamps[moved] = clock
            clock += 1
            a.push_back(moved, members=True)
            b.push_back(np.array(moved, dtype=np.int64), members=True)
        elif op < 0.6 and held:  # pins and unpins
            flip = rng.choice(held, size=min(len(held), 4), replace=False).tolist()
            ref[flip] = 1 - ref[flip]
            ready = [s for s in flip if ref[s] == 0]
            a.on_evictable(ready)
            b.on_evictable(np.array(ready, dtype=np.int64))
        else:
            k = int(rng.integers(1, 8))
            n_prot = min(len(held), int(rng.integers(0, 4)))
            prot = rng.choice(held, size=n_prot, replace=False).tolist() if n_prot else []
            mark[prot] = 1
            limit = None if rng.random() < 0.3 else int(rng.integers(0, clock + 1))
            if op < 0.7:
                assert a.peek(k, ref, prot, mark) == b.peek(k, ref, np.array(prot, dtype=np.int64), mark).tolist()
            got = a.take(k, ref, prot, mark, stamps, limit)
            want = b.take(k, ref, np.array(prot, dtype=np.int64), mark, stamps, limit)
            assert isinstance(got, list) and got == want.tolist() and a.past_limit == b.past_limit
            if len(got) < k:  # ended at the limit, or none left
                nxt = [a.past_limit] if a.past_limit >= 0 else []
                prot_arr = np.array(prot, dtype=np.int64)
                assert a.peek(1, ref, prot, mark) == nxt == b.peek(1, ref, prot_arr, mark).tolist()
            mark[prot] = 0
            if rng.random() < 0.5:
                a.discard(got, members=True)
                b.discard(want, members=True)
                held = [s for s in held if s not in got]
            else:
                a.on_evictable(got)
                b.on_evictable(want)
        assert a.ordered() == b.ordered()
        assert len(a) == len(b)
