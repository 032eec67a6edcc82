"""Property tests: CPUOffloadingManager vs the plain-Python OrderedDict reference, per policy.

Two drivers feed both implementations the same operations and compare every output, every
event, the per-key state (slot, ref count) and the policy's full internal order after every
step, plus the structural invariants of the issue (no slot used twice, ref counts never
negative, pinned/pending/named blocks never evicted, capacity never exceeded, no slot leaked
by failed stores):

* a hypothesis ``RuleBasedStateMachine`` per policy (shrinks failures to a minimal sequence);
* a seeded random fuzzer per policy, cheaper per sequence, for the bulk of the sequences.

Default run: 200 hypothesis sequences + 1,800 fuzzed (scalar, array and mixed paths) + 600
scheduler-shaped sequences per policy (thousands per
policy in all). With ``KVOFFLOAD_SLOW_TESTS=1``, the ``slow`` tests fuzz 20,000 longer
sequences per policy (~6 minutes).
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvoffload.cache.keytable import FREE, PENDING
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import make_offload_key
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.errors import KeyStateError
from tests.cache.test_manager_reference import POLICIES as REFERENCE_MODELS
from tests.cache.test_manager_reference import RefError, RefManager
from tests.keys import CTX, POLICIES

UNIVERSE = [make_offload_key(b"h%02d" % i, i % 2) for i in range(40)]
POLICY_NAMES = POLICIES


def real_order(m: CPUOffloadingManager) -> object:
    """The real policy's internal state in the reference's snapshot format."""
    p = m.policy
    keys = m.table.keys
    if m.cache_policy in ("lru", "request_lru"):
        return [keys[s] for s in p.ordered_slots()]  # type: ignore[attr-defined]
    if p.name == "headstart":  # (its subclasses too)
        new, seen = p.ordered_slots()  # type: ignore[attr-defined]
        stamps = sorted((keys[s], int(p.stamp[s])) for s in new + seen)  # type: ignore[attr-defined]
        return ([keys[s] for s in new], [keys[s] for s in seen], stamps, p.head_start, p.clock)  # type: ignore[attr-defined]
    if m.cache_policy == "arc":
        t1, t2 = p.ordered_slots()  # type: ignore[attr-defined]
        return ([keys[s] for s in t1], [keys[s] for s in t2], list(p.b1), list(p.b2), p.target_t1_size)  # type: ignore[attr-defined]
    small, main = p.ordered_slots()  # type: ignore[attr-defined]
    freq = sorted((keys[s], int(p.freq[s])) for s in small + main)  # type: ignore[attr-defined]
    return ([keys[s] for s in small], [keys[s] for s in main], list(p.ghost), freq)  # type: ignore[attr-defined]


class Pair:
    """The real manager and the reference, driven in lock-step."""

    def __init__(self, num_blocks: int, policy: str) -> None:
        self.real = CPUOffloadingManager(num_blocks, cache_policy=policy, enable_events=True)
        self.ref = RefManager(num_blocks, policy)
        self.num_blocks = num_blocks

    # -- operations -------------------------------------------------------
    def lookup(self, key: bytes) -> None:
        assert self.real.lookup(key, CTX) == self.ref.lookup(key)

    def lookup_batch(self, keys: list[bytes]) -> None:
        codes = self.real.lookup_batch(keys, CTX).tolist()
        expect = []
        for key in keys:
            r = self.ref.lookup(key)
            expect.append(LOOKUP_PENDING if r is None else (LOOKUP_HIT if r else LOOKUP_MISS))
        assert codes == expect

    def prepare_store(self, keys: list[bytes]) -> None:
        before = self.ref.state(UNIVERSE)
        got = self.real.prepare_store(keys, CTX)
        exp = self.ref.prepare_store(keys)
        if exp is None:
            assert got is None
            return
        assert got is not None
        assert (got.keys_to_store, got.store_spec.block_ids.tolist(), got.evicted_keys) == exp  # type: ignore[attr-defined]
        for key in got.evicted_keys:  # only ready, unpinned, unnamed blocks are evicted
            assert before[key][1] == 0 and key not in keys

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        self.real.complete_store(keys, CTX, success=success)
        self.ref.complete_store(keys, success)

    def prepare_load(self, keys: list[bytes]) -> None:
        try:
            exp = self.ref.prepare_load(keys)
        except RefError:
            with pytest.raises(KeyStateError):
                self.real.prepare_load(keys, CTX)
            return
        assert self.real.prepare_load(keys, CTX).block_ids.tolist() == exp  # type: ignore[attr-defined]

    def complete_load(self, keys: list[bytes]) -> None:
        try:
            self.ref.complete_load(keys)
        except RefError:
            with pytest.raises(KeyStateError):
                self.real.complete_load(keys, CTX)
            return
        self.real.complete_load(keys, CTX)

    def touch(self, keys: list[bytes]) -> None:
        self.real.touch(keys, CTX)
        self.ref.touch(keys)

    def reset(self) -> None:
        self.real.reset_cache()
        self.ref.reset()

    # -- checks -----------------------------------------------------------
    def check(self) -> None:
        real, ref = self.real, self.ref
        events = real.take_events()
        assert all(e.medium == "CPU" for e in events)
        got_events = [(e.keys, e.removed) for e in events]
        assert got_events == ref.take_events()
        t = real.table
        exp_state = ref.state(UNIVERSE)
        got_state = {k: (s, int(t.ref[s])) for k, s in t.index.items()}
        assert got_state == exp_state
        assert real_order(real) == ref.policy.snapshot()
        # structural invariants
        n = self.num_blocks
        slots = list(t.index.values())
        assert len(set(slots)) == len(slots), "a slot is used twice"
        assert all(0 <= s < n for s in slots)
        assert len(t.index) <= n, "capacity exceeded"
        assert len(set(t.free_list)) == len(t.free_list)
        assert not set(t.free_list) & set(slots)
        assert t.num_free + t.num_used == n, "a slot leaked"
        assert t.num_allocated == ref.allocated and t.free_list == ref.free
        states = t.ref[np.array(slots, dtype=np.int64)] if slots else np.zeros(0, np.int32)
        assert (states >= PENDING).all(), "negative ref count"
        assert int((states == PENDING).sum()) == t.num_pending
        assert int((states == 0).sum()) == t.num_evictable
        assert int((states > 0).sum()) == t.num_pinned
        free_mask = np.ones(n, dtype=bool)
        free_mask[slots] = False
        assert (t.ref[free_mask] == FREE).all()
        for s in range(n):
            assert (t.keys[s] is None) == bool(free_mask[s])


# ---------------------------------------------------------------------------- hypothesis
key_ids = st.integers(0, 15)
unique_keys = st.lists(key_ids, unique=True, max_size=6).map(lambda ids: [UNIVERSE[i] for i in ids])
any_keys = st.lists(key_ids, max_size=7).map(lambda ids: [UNIVERSE[i] for i in ids])


class ManagerMachine(RuleBasedStateMachine):
    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.pair: Pair | None = None

    @initialize(num_blocks=st.integers(0, 8))
    def setup(self, num_blocks: int) -> None:
        self.pair = Pair(num_blocks, self.policy)

    @rule(keys=unique_keys)
    def prepare_store(self, keys: list[bytes]) -> None:
        self.pair.prepare_store(keys)  # type: ignore[union-attr]

    @rule(keys=any_keys, success=st.booleans())
    def complete_store(self, keys: list[bytes], success: bool) -> None:
        self.pair.complete_store(keys, success)  # type: ignore[union-attr]

    @rule(keys=unique_keys)
    def prepare_load(self, keys: list[bytes]) -> None:
        self.pair.prepare_load(keys)  # type: ignore[union-attr]

    @rule(keys=any_keys)
    def complete_load(self, keys: list[bytes]) -> None:
        self.pair.complete_load(keys)  # type: ignore[union-attr]

    @rule(keys=any_keys)
    def touch(self, keys: list[bytes]) -> None:
        self.pair.touch(keys)  # type: ignore[union-attr]

    @rule(key=key_ids, keys=any_keys)
    def lookup(self, key: int, keys: list[bytes]) -> None:
        self.pair.lookup(UNIVERSE[key])  # type: ignore[union-attr]
        self.pair.lookup_batch(keys)  # type: ignore[union-attr]

    @invariant()
    def consistent(self) -> None:
        if self.pair is not None:
            self.pair.check()


def _machine(policy: str) -> type[RuleBasedStateMachine]:
    cls = type(f"ManagerMachine_{policy}", (ManagerMachine,), {"policy": policy})
    cls.TestCase.settings = settings(  # type: ignore[attr-defined]
        max_examples=200,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return cls


TestLRUMachine = _machine("lru").TestCase
TestARCMachine = _machine("arc").TestCase
TestS3FIFOMachine = _machine("s3fifo").TestCase
TestHeadStartMachine = _machine("headstart").TestCase


# ---------------------------------------------------------------------------- seeded fuzzer
def _fuzz(policy: str, seed: int, n_sequences: int, steps: int) -> None:
    rng = random.Random(seed)
    for _ in range(n_sequences):
        n = rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 11, 23])
        universe = UNIVERSE[: rng.choice([6, 10, 16, 40] if n > 11 else [6, 10, 16])]
        pair = Pair(n, policy)
        for _ in range(steps):
            op = rng.random()
            if op < 0.28:
                pair.prepare_store(rng.sample(universe, rng.randint(0, min(8, len(universe)))))
            elif op < 0.48:
                pair.complete_store(rng.sample(universe, rng.randint(0, 5)), rng.random() < 0.85)
            elif op < 0.58:
                pair.prepare_load(rng.sample(universe, rng.randint(0, 3)))
            elif op < 0.68:
                pair.complete_load(rng.choices(universe, k=rng.randint(0, 3)))
            elif op < 0.88:
                pair.touch(rng.choices(universe, k=rng.randint(0, 6)))
            elif op < 0.995:
                pair.lookup(rng.choice(universe))
                pair.lookup_batch(rng.choices(universe, k=rng.randint(0, 5)))
            else:
                pair.reset()
            pair.check()


def _small_paths(monkeypatch: pytest.MonkeyPatch, small_batch: int, scan_budget: int = 64) -> None:
    """Route calls on up to ``small_batch`` keys to the scalar paths (0: array paths only)."""
    import kvoffload.cache.manager as manager_mod
    import kvoffload.cache.policies.order as order_mod

    monkeypatch.setattr(manager_mod, "SMALL_BATCH", small_batch)
    monkeypatch.setattr(order_mod, "SCAN_BUDGET", scan_budget)


def test_every_registered_policy_has_a_reference_model() -> None:
    """The fuzz tests below run every registered policy against its independent reference."""
    assert set(POLICY_NAMES) <= set(REFERENCE_MODELS), "add the policy's model to test_manager_reference.py"


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize(
    ("small_batch", "scan_budget"),
    [(32, 64), (3, 0), (0, 64)],
    ids=["scalar-paths", "mixed-paths", "array-paths"],
)
def test_fuzz_matches_reference(
    policy: str, small_batch: int, scan_budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scalar paths (every call here is small), array paths, and both interleaved (calls of
    up to 3 keys scalar, the rest array; scalar eviction scans cut short to one entry)."""
    _small_paths(monkeypatch, small_batch, scan_budget)
    seed = 1234 + POLICY_NAMES.index(policy) + 10 * small_batch
    _fuzz(policy, seed=seed, n_sequences=600, steps=25)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("KVOFFLOAD_SLOW_TESTS"), reason="set KVOFFLOAD_SLOW_TESTS=1 (~6 min)")
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_fuzz_matches_reference_long(policy: str) -> None:
    _fuzz(policy, seed=99 + POLICY_NAMES.index(policy), n_sequences=20000, steps=40)


# ---------------------------------------------------------------------------- translation memo
def _fuzz_requests(policy: str, seed: int, n_sequences: int, steps: int) -> None:
    """Scheduler-shaped calls: slices of a few per-request key lists, so the memo is hit,
    invalidated by evictions and failed stores, refreshed after inserts, and fed equal
    copies and lists mutated by the caller."""
    rng = random.Random(seed)
    for _ in range(n_sequences):
        n = rng.choice([1, 3, 5, 8, 12])
        universe = UNIVERSE[: rng.choice([12, 20, 40])]
        reqs = [rng.sample(universe, rng.randint(2, 10)) for _ in range(rng.randint(1, 5))]
        pair = Pair(n, policy)
        outputs: list[list[bytes]] = []
        for _ in range(steps):
            req = rng.choice(reqs)
            a = rng.randrange(len(req))
            b = rng.randint(a + 1, len(req))
            part = req[a:b]
            if rng.random() < 0.2:
                part = [bytes(bytearray(x)) for x in part]  # equal values, other objects
            op = rng.random()
            if op < 0.15:
                full = req if rng.random() < 0.8 else req + rng.choices(req, k=2)  # repeats too
                pair.lookup_batch(full)
            elif op < 0.3:
                pair.touch(req if rng.random() < 0.7 else part)
            elif op < 0.5:
                before = len(pair.real.table.index)
                pair.prepare_store(part)
                if len(pair.real.table.index) > before:
                    outputs.append([x for x in part if x in pair.real])
            elif op < 0.65:
                done = outputs.pop(0) if outputs and rng.random() < 0.7 else part
                pair.complete_store(done, rng.random() < 0.85)
            elif op < 0.75:
                pair.prepare_load(part)
            elif op < 0.85:
                pair.complete_load(part)
            elif op < 0.93:
                # the caller mutates its own list: remembered batches must not follow it
                req[a] = rng.choice(universe)
                if len(set(req)) != len(req):
                    req[:] = list(dict.fromkeys(req))
            else:
                pair.prepare_store(rng.sample(universe, rng.randint(1, 4)))
            pair.check()


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("small_batch", [0, 3], ids=["array-paths", "mixed-paths"])
def test_memo_paths_match_reference(policy: str, small_batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo serves the array paths; with ``small_batch=3`` calls on up to 3 keys take the
    scalar paths in between, which bypass the memo but change slots under it."""
    import kvoffload.cache.batch as memo

    monkeypatch.setattr(memo, "MEMO_MIN_KEYS", 1)
    monkeypatch.setattr(memo, "MEMO_ENTRIES", 3)
    _small_paths(monkeypatch, small_batch, scan_budget=0 if small_batch else 64)
    seed = 77 + POLICY_NAMES.index(policy) + 10 * small_batch
    _fuzz_requests(policy, seed=seed, n_sequences=300, steps=30)


def test_memo_is_used_and_invalidated(monkeypatch: pytest.MonkeyPatch) -> None:
    """White-box: a slice of a remembered list is served by the memo, exactly."""
    _small_paths(monkeypatch, 0)
    m = CPUOffloadingManager(4)
    keys = UNIVERSE[:12]
    m.lookup_batch(keys, CTX)  # remembered (12 >= MEMO_MIN_KEYS)
    r = m.table.resolve(keys[2:6], allow_duplicates=False, remember=False)
    assert r.batch is not None and r.offset == 2 and r.slots.tolist() == [-1] * 4
    out = m.prepare_store(keys[2:6], CTX)
    assert out is not None and out.store_spec.block_ids.tolist() == [0, 1, 2, 3]
    m.complete_store(keys[2:6], CTX)
    assert m.table.resolve(keys[0:4], allow_duplicates=True, remember=False).slots.tolist() == [-1, -1, 0, 1]
    out = m.prepare_store(keys[8:10], CTX)  # evicts keys[2], keys[3]; slots 0, 1 reused
    assert out is not None and out.evicted_keys == keys[2:4]
    assert out.store_spec.block_ids.tolist() == [1, 0]
    r = m.table.resolve(keys[2:10], allow_duplicates=True, remember=False)
    assert r.batch is not None
    assert r.slots.tolist() == [-1, -1, 2, 3, -1, -1, 1, 0]
    assert m.lookup_batch(keys[2:10], CTX).tolist() == [0, 0, 1, 1, 0, 0, 2, 2]
