"""The ``headstart`` policy against its plain-Python reference on request-shaped random traces, its
request-scoped path, and its ghost history's window."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.policies.ghost import WAYS, GhostKeys
from kvoffload.cache.policies.headstart import HeadStartPolicy
from kvoffload.cache.policies.headstart_tags import TagClasses
from kvoffload.cache.policies.headstart_tuner import fingerprint as scalar_fingerprint
from kvoffload.cache.policies.headstart_tuner import fingerprints
from kvoffload.core.base import ReqContext, make_offload_key
from kvoffload.core.lookup_code import LOOKUP_HIT
from tests.cache.headstart_reference import RefGhost, RefHeadStart, fingerprint
from tests.cache.test_manager_property import real_order
from tests.cache.test_manager_reference import RefManager

CTX = ReqContext("headstart")


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


class ArrayHeadStart(HeadStartPolicy):
    """headstart taking arrays only: its array paths, on calls the manager would hand it as lists."""

    takes_lists = False


ARRAY_HEADSTART = f"{__name__}:ArrayHeadStart"


def conversation_trace(rng: random.Random, n_requests: int, turns: int) -> list[list[bytes]]:
    """Prompts as key lists: conversations of up to ``turns`` turns over a shared system prompt,
    each turn its previous prompt plus a few new blocks, interleaved with one-shot prompts."""
    nxt = iter(range(1, 10**9))
    system = [key(next(nxt)) for _ in range(3)]
    live: list[list[bytes]] = []
    out: list[list[bytes]] = []
    for _ in range(n_requests):
        r = rng.random()
        if live and r < 0.55:
            i = rng.randrange(len(live))
            prompt = live[i] + [key(next(nxt)) for _ in range(rng.randint(1, 4))]
            live[i] = prompt
            if len(prompt) > 3 + 4 * turns:
                live.pop(i)
        else:
            head = system if r < 0.85 else []
            prompt = head + [key(next(nxt)) for _ in range(rng.randint(1, 6))]
            if r < 0.8:
                live.append(prompt)
        out.append(prompt)
    return out


def replay_both(
    trace: list[list[bytes]], capacity: int, tags: list[str | None] | None = None, policy: str = "headstart"
) -> tuple[CPUOffloadingManager, set[int]]:
    """The cache-level replay's calls on the real manager (``policy``: headstart or
    :class:`ArrayHeadStart`) and on the reference, compared after every request (outputs, per-key
    state, both lists, stamps, head start, clock); ``tags``: each request's workload tag."""
    real = CPUOffloadingManager(capacity, cache_policy=policy)
    ref = RefManager(capacity, "headstart")
    head_starts = set()
    for i, keys in enumerate(trace):
        tag = None if tags is None else tags[i]
        CTX = ReqContext("headstart", workload=tag)
        ref.policy.workload = tag
        codes = real.lookup_batch(keys, CTX)
        miss = np.flatnonzero(codes != LOOKUP_HIT)
        hit = int(miss[0]) if len(miss) else len(keys)
        assert [ref.lookup(k) for k in keys[:hit]] == [True] * hit
        assert hit == len(keys) or not ref.lookup(keys[hit])
        real.touch(keys, CTX)
        ref.touch(keys)
        if hit:
            assert real.prepare_load(keys[:hit], CTX).block_ids.tolist() == ref.prepare_load(keys[:hit])  # type: ignore[attr-defined]
            real.complete_load(keys[:hit], CTX)
            ref.complete_load(keys[:hit])
        if hit < len(keys):
            got = real.prepare_store(keys[hit:], CTX)
            exp = ref.prepare_store(keys[hit:])
            if exp is None:
                assert got is None
            else:
                assert got is not None
                assert (got.keys_to_store, got.store_spec.block_ids.tolist(), got.evicted_keys) == exp  # type: ignore[attr-defined]
                real.complete_store(got.keys_to_store, CTX)
                ref.complete_store(got.keys_to_store, True)
        assert real_order(real) == ref.policy.snapshot()
        assert ref.policy.tags.reused[:8] == real.policy.tags.reused[:8].tolist()  # type: ignore[attr-defined]
        head_starts.add(real.policy.head_start)  # type: ignore[attr-defined]
    return real, head_starts


@pytest.mark.parametrize("policy", ["headstart", ARRAY_HEADSTART])
@pytest.mark.parametrize(("capacity", "turns", "seed"), [(12, 6, 1), (40, 2, 2), (40, 8, 3), (1500, 6, 4)])
def test_request_traces_match_reference(capacity: int, turns: int, seed: int, policy: str) -> None:
    """Small capacities sample every key; 1,500 blocks samples about a third (the small caches
    hold 128). The head start must move during the run, else the tuner went untested. Both the
    list paths (small calls) and the array paths."""
    rng = random.Random(seed)
    n = 2500 if capacity > 100 else 700
    real, head_starts = replay_both(conversation_trace(rng, n, turns), capacity, policy=policy)
    assert len(head_starts) >= 2, head_starts
    policy = real.policy
    assert isinstance(policy, HeadStartPolicy)
    assert len(policy.seen) > 0 and len(policy.new) > 0


@pytest.mark.parametrize("scalar_evict", [0, 3])
def test_list_evictions_past_the_scalar_bound_match_reference(
    scalar_evict: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evictions handed a list of more than ``SCALAR_EVICT`` blocks scan with arrays (here: all, or
    those of more than 3), answering a list; the others entry by entry: the reference's victims."""
    import kvoffload.cache.policies.headstart as headstart_mod

    monkeypatch.setattr(headstart_mod, "SCALAR_EVICT", scalar_evict)
    replay_both(conversation_trace(random.Random(21 + scalar_evict), 700, 6), 40)


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_list_paths_match_array_paths_with_pins(seed: int) -> None:
    """Twin managers, headstart (small calls as lists) and :class:`ArrayHeadStart`, under the same
    random small calls with many blocks pinned by unfinished loads or pending stores: the same
    outputs (victims in order), lists, stamps, head start and ghost history."""
    rng = random.Random(seed)
    a = CPUOffloadingManager(24, cache_policy="headstart")
    b = CPUOffloadingManager(24, cache_policy=ARRAY_HEADSTART)
    universe = [key(i) for i in range(90)]
    loading: list[list[bytes]] = []
    storing: list[list[bytes]] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.4:
            keys = rng.sample(universe, rng.randint(1, 6))
            got, want = a.prepare_store(keys, CTX), b.prepare_store(keys, CTX)
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert (got.keys_to_store, got.evicted_keys) == (want.keys_to_store, want.evicted_keys)
                storing.append(got.keys_to_store)
        elif op < 0.55 and storing:
            keys = storing.pop(rng.randrange(len(storing)))
            ok = rng.random() < 0.9
            a.complete_store(keys, CTX, success=ok)
            b.complete_store(keys, CTX, success=ok)
        elif op < 0.7:
            present = [k for k in rng.sample(universe, 8) if a.lookup(k, CTX)][:4]
            if present:
                a.prepare_load(present, CTX)
                b.prepare_load(present, CTX)
                loading.append(present)
        elif op < 0.85 and loading:
            keys = loading.pop(rng.randrange(len(loading)))
            a.complete_load(keys, CTX)
            b.complete_load(keys, CTX)
        else:
            keys = rng.sample(universe, rng.randint(1, 5))
            a.touch(keys, CTX)
            b.touch(keys, CTX)
        assert real_order(a) == real_order(b)
        assert np.array_equal(a.policy.ghost.fp, b.policy.ghost.fp)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("capacity", "seed"), [(12, 11), (40, 12), (300, 13)])
def test_tagged_request_traces_match_reference(capacity: int, seed: int) -> None:
    """Requests tagged by their shape (a turn of a growing conversation or a new prompt, some
    untagged): the per-tag counts, labels and hot classes follow the reference, and some class
    turns hot during the run, else the tag rule went untested."""
    rng = random.Random(seed)
    trace = conversation_trace(rng, 1500, 6)
    tags: list[str | None] = [None if i % 7 == 0 else f"len/{min(len(p) // 4, 5)}" for i, p in enumerate(trace)]
    seen_hot: list[bool] = []
    real_hot = TagClasses.hot

    def record(self: TagClasses, t: int) -> bool:
        seen_hot.append(real_hot(self, t))
        return seen_hot[-1]

    TagClasses.hot = record  # type: ignore[method-assign]
    try:
        replay_both(trace, capacity, tags)
    finally:
        TagClasses.hot = real_hot  # type: ignore[method-assign]
    assert any(seen_hot) and not all(seen_hot)


@pytest.mark.parametrize("policy", ["headstart", ARRAY_HEADSTART])
@pytest.mark.parametrize("seed", [5, 6, 7])
def test_request_scoped_path_matches_reference(seed: int, policy: str) -> None:
    """vLLM's request-scoped recency (``record_requests``, no ``touch``): at each request's end the
    policy gets its keys with the ones it only stored flagged; those keep their list, the others
    move to the seen list, and the tuner observes the others."""
    rng = random.Random(seed)
    trace = conversation_trace(rng, 300, 5)
    m = CPUOffloadingManager(24, cache_policy=policy, record_requests=True)
    ref = RefManager(24, "headstart")
    assert isinstance(ref.policy, RefHeadStart)
    policy = m.policy
    calls: list[tuple[list[bytes], set[bytes]]] = []
    finished = policy.on_request_finished

    def record(keys: Any, slots: Any, inserted_only: Any, reused: Any) -> None:  # lists or arrays
        calls.append((list(keys), {k for k, f in zip(keys, list(inserted_only), strict=True) if f}))
        finished(keys, slots, inserted_only, reused)

    policy.on_request_finished = record  # type: ignore[method-assign]
    applied = 0
    for i, keys in enumerate(trace):
        ctx = ReqContext(f"r{i}")
        m.on_new_request(ctx)
        codes = m.lookup_batch(keys, ctx)
        miss = np.flatnonzero(codes != LOOKUP_HIT)
        hit = int(miss[0]) if len(miss) else len(keys)
        if hit:
            m.prepare_load(keys[:hit], ctx)
            m.complete_load(keys[:hit], ctx)
            ref.prepare_load(keys[:hit])
            ref.complete_load(keys[:hit])
        got = m.prepare_store(keys[hit:], ctx) if hit < len(keys) else None
        exp = ref.prepare_store(keys[hit:]) if hit < len(keys) else None
        assert (got is None) == (exp is None)
        if got is not None:
            m.complete_store(got.keys_to_store, ctx)
            ref.complete_store(got.keys_to_store, True)
        m.on_request_finished(ctx)
        if calls:
            ref.policy.request_finished(*calls.pop())
            applied += 1
        assert real_order(m) == ref.policy.snapshot()
    assert applied > 250 and len(policy.new) and len(policy.seen)  # type: ignore[attr-defined]


def test_fingerprints_match_the_documented_mixer() -> None:
    """One length (words only, and padded), mixed lengths, the empty key; a key's fingerprint does
    not depend on the batch it comes in."""
    keys = [key(i) for i in range(200)] + [b"", b"x" * 40, b"x" * 41, b"\xff" * 64]
    want = [fingerprint(k) for k in keys]
    assert fingerprints(keys).tolist() == want
    assert fingerprints(keys[:200]).tolist() == want[:200]
    assert fingerprints([k + b"abc" for k in keys[:50]]).tolist() == [fingerprint(k + b"abc") for k in keys[:50]]
    assert [fingerprints([k]).tolist()[0] for k in keys] == want
    assert [scalar_fingerprint(k) for k in keys] == want  # the list paths' scalar code
    assert len(set(want)) == len(want)


def test_ghost_remembers_the_last_size_keys() -> None:
    """A sharp window: of the last ``size`` keys, exactly those whose bucket did not receive
    ``WAYS`` later keys are found (nearly all), the one before them is not, and a found key is
    forgotten."""
    size = 1000
    g = GhostKeys(size)
    fp = fingerprints([key(i) for i in range(size + 1)])
    g.add(fp)
    bucket = (fp & np.uint32(g.mask)).tolist()
    later = [bucket[i + 1 :].count(b) for i, b in enumerate(bucket)]
    expect = [i > 0 and later[i] < WAYS for i in range(size + 1)]
    found = g.contains_pop(fp.copy())
    assert found is not None and found.tolist() == expect
    assert sum(expect) >= 0.99 * size
    assert g.contains_pop(fp[1:].copy()) is None
    g.add(fp[:1])
    again = g.contains_pop(fp[:1].copy())
    assert again is not None and again.all()
    g.clear()
    assert g.contains_pop(fp.copy()) is None


def test_two_turn_conversations_choose_no_head_start() -> None:
    """Where every conversation has exactly two turns, "seen before" means "done": the tuner must
    settle on plain LRU (head start 0), and the policy then evicts in LRU order."""
    rng = random.Random(9)
    nxt = iter(range(1, 10**9))
    pending: list[list[bytes]] = []
    m = CPUOffloadingManager(64, cache_policy="headstart")
    for _ in range(4000):
        if pending and rng.random() < 0.5:
            prompt = pending.pop(rng.randrange(len(pending)))
            prompt = prompt + [key(next(nxt)) for _ in range(2)]
        else:
            prompt = [key(next(nxt)) for _ in range(rng.randint(2, 5))]
            pending.append(prompt)
        codes = m.lookup_batch(prompt, CTX)
        miss = np.flatnonzero(codes != LOOKUP_HIT)
        hit = int(miss[0]) if len(miss) else len(prompt)
        m.touch(prompt, CTX)
        out = m.prepare_store(prompt[hit:], CTX)
        if out is not None:
            m.complete_store(out.keys_to_store, CTX)
    assert m.policy.head_start == 0  # type: ignore[attr-defined]


def test_small_touch_reaches_an_array_only_policy() -> None:
    """A policy that takes arrays only (``takes_lists`` False): a touch of a few keys, which the
    manager resolves with scalar code, must still reach it (as an array)."""
    m = CPUOffloadingManager(8, cache_policy=ARRAY_HEADSTART)
    assert not m.policy.takes_lists
    keys = [key(i) for i in range(3)]
    out = m.prepare_store(keys, CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    m.touch(keys[:2], CTX)
    new, seen = m.policy.ordered_slots()  # type: ignore[attr-defined]
    assert [m.table.keys[s] for s in seen] == [keys[1], keys[0]] and [m.table.keys[s] for s in new] == [keys[2]]


@pytest.mark.parametrize("size", [40, 1000, 20000])
def test_ghost_batches_match_reference(size: int) -> None:
    """Batches of every size (one key to more keys than a bucket has ways, so keys of one batch share
    buckets, up to more than WAYS of them), interleaved with lookups of added, forgotten and new
    fingerprints: the same answers and the same entries as the reference (a loop over buckets)."""
    rng = np.random.default_rng(size)
    g, ref = GhostKeys(size), RefGhost(size)
    assert g.buckets == ref.nb
    pool = rng.integers(0, 2**32, size=3 * size, dtype=np.uint32)
    for step in range(60):
        k = int(rng.choice([1, 3, 17, 200, 2 * size]))
        fp = pool[rng.integers(0, len(pool), size=k)] if step % 3 else rng.integers(0, 2**32, size=k, dtype=np.uint32)
        fp = np.unique(fp)[rng.permutation(len(np.unique(fp)))]  # distinct, as victims are
        if step % 7 == 0:  # crowd buckets 0..few-1: up to more keys than ways in one bucket
            few = 1 + step % 5
            high = rng.integers(0, 2**32, size=4 * WAYS, dtype=np.uint32) & np.uint32(~g.mask & 0xFFFFFFFF)
            fp = np.unique(high | (np.arange(4 * WAYS, dtype=np.uint32) % np.uint32(few)))
            fp = fp[rng.permutation(len(fp))]
        g.add(fp)
        ref.add(fp.tolist())
        probe = np.unique(np.concatenate([pool[rng.integers(0, len(pool), size=50)], fp[:5]]))
        got = g.contains_pop(probe.copy() if step % 2 else probe.tolist())  # arrays, and lists (scalar code)
        want = [ref.contains_pop(f) for f in probe.tolist()]
        assert (list(got) if got is not None else [False] * len(probe)) == want
        entries = [[(int(v), int(q)) for v, q in zip(g.fp[b], g.seq[b], strict=True)] for b in range(g.buckets)]
        assert entries == ref.entries
        assert g.cursor.tolist() == ref.cursor


def test_ghost_queue_adds_whole_batches_in_order() -> None:
    """``queue`` (arrays and lists alike) holds fingerprints back until ``batch`` are queued, then adds
    the whole queue in order: the same entries as adding the batch at once; ``clear`` drops the queue."""
    rng = np.random.default_rng(5)
    fp = np.unique(rng.integers(0, 2**32, size=40, dtype=np.uint32))[:25]
    g, direct = GhostKeys(200, batch=10), GhostKeys(200)
    g.queue(fp[:4])
    g.queue(fp[4:7].tolist())
    assert g.empty and g.contains_pop(fp[:7].copy()) is None  # 7 < 10 queued: none added yet
    g.queue(fp[7:12])  # 12 >= 10: all twelve added, in order
    direct.add(fp[:12].copy())
    assert np.array_equal(g.fp, direct.fp) and np.array_equal(g.seq, direct.seq)
    g.queue(fp[12:15])
    g.clear()
    g.queue(fp[15:25])  # exactly one batch after the clear: only these
    fresh = GhostKeys(200)
    fresh.add(fp[15:25].copy())
    assert np.array_equal(g.fp, fresh.fp) and np.array_equal(g.seq, fresh.seq)
