"""``request_lru`` (vLLM 0.33's LRU ranking) against hand-worked cases and against a plain-Python
reference written from the policy's rules: ranks as ``(major, -position)`` tuples in a dict,
eviction by sorting every evictable key, one request record per request id."""

from __future__ import annotations

import random

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from tests.keys import k

TOKENS = 16


def request(rid: str, keys: list[bytes]) -> ReqContext:
    """A context whose keys sit at consecutive block positions (head first)."""
    return ReqContext(rid, key_positions={kk: (i + 1) * TOKENS for i, kk in enumerate(keys)})


def manager(n: int) -> CPUOffloadingManager:
    return CPUOffloadingManager(n, "request_lru", record_requests=True)


def store(m: CPUOffloadingManager, keys: list[bytes], c: ReqContext) -> list[bytes]:
    out = m.prepare_store(keys, c)
    assert out is not None
    m.complete_store(out.keys_to_store, c)
    return out.evicted_keys


def test_a_running_requests_blocks_rank_by_its_first_access_tails_first() -> None:
    m = manager(4)
    ka, kb, kc = [k(i) for i in range(3)], [k(10)], [k(20 + i) for i in range(3)]
    a, b, c = request("a", ka), request("b", kb), request("c", kc)
    store(m, ka[:2], a)
    store(m, kb, b)
    store(m, ka[2:], a)  # A still runs: its third block ranks with A's, before B's
    assert store(m, kc, c) == [ka[2], ka[1], ka[0]]


def test_a_finished_request_makes_its_head_most_recent() -> None:
    m = manager(4)
    ka, kb = [k(i) for i in range(3)], [k(10 + i) for i in range(3)]
    a, b = request("a", ka), request("b", kb)
    store(m, ka, a)
    m.on_request_finished(a)  # fresh ranks, tail first: head most recent
    assert store(m, kb[:1], b) == []
    assert store(m, kb[1:], b) == [ka[2], ka[1]]


def test_a_running_request_raises_what_it_reads_and_pins_are_spared() -> None:
    m = manager(4)
    ka, kb = [k(i) for i in range(2)], [k(0), k(1), k(10)]
    a, b = request("a", ka), request("b", kb)
    store(m, ka, a)
    m.on_request_finished(a)
    store(m, [k(50)], ReqContext("x"))  # no positions: a fresh rank, the most recent
    m.on_request_finished(ReqContext("x"))
    m.prepare_load([k(1)], b)  # B (a later request) reads k1: raised to B's rank; pinned
    out = m.prepare_store([k(10), k(11)], b)  # one free slot, one eviction: k0 (k1 pinned, k50 newer)
    assert out is not None and out.evicted_keys == [k(0)]
    m.complete_store(out.keys_to_store, b)
    m.complete_load([k(1)], b)
    # B's blocks: k11 (position unknown to B: a fresh rank), k10 (B, -48), k1 (B, -32); k50 oldest
    c = ReqContext("c")
    assert store(m, [k(60 + i) for i in range(4)], c) == [k(50), k(10), k(1), k(11)]


def test_a_reset_gives_requests_new_ranks() -> None:
    m = manager(3)
    ka, kb = [k(0), k(1)], [k(10)]
    a, b = request("a", ka), request("b", kb)
    store(m, ka[:1], a)
    m.reset_cache()
    store(m, kb, b)
    store(m, ka[1:], a)  # A's rank is new after the reset: after B's
    assert store(m, [k(20), k(21), k(22)], ReqContext("c")) == [k(10), k(1)]


# --------------------------------------------------------------------------- reference


class RefRequestLRU:
    """The manager with ``request_lru``, one key at a time, ranks as tuples (no reuse filter)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slot: dict[bytes, int] = {}
        self.ref: dict[bytes, int] = {}  # -1 pending
        self.rank: dict[bytes, tuple[int, int]] = {}
        self.free: list[int] = []
        self.allocated = 0
        self.next = 0
        self.major: dict[str, int] = {}  # by request id (each test context lives for one request)
        self.seen: dict[str, list[bytes]] = {}

    def _fresh(self) -> tuple[int, int]:
        self.next += 1
        return (self.next, 0)

    def _major(self, c: ReqContext) -> int:
        if c.req_id not in self.major:
            self.major[c.req_id] = self._fresh()[0]
        return self.major[c.req_id]

    def _access(self, c: ReqContext, keys: list[bytes]) -> None:
        seen = self.seen.setdefault(c.req_id, [])
        new = [kk for kk in keys if kk not in seen]
        if not new:
            return
        seen.extend(new)
        major = self._major(c)
        for kk in new:
            p = c.get_offload_key_position(kk)
            if kk in self.rank and p is not None and self.rank[kk] < (major, -p):
                self.rank[kk] = (major, -p)

    def prepare_load(self, keys: list[bytes], c: ReqContext) -> list[int]:
        for kk in keys:
            self.ref[kk] += 1
        self._access(c, keys)
        return [self.slot[kk] for kk in keys]

    def complete_load(self, keys: list[bytes]) -> None:
        for kk in keys:
            self.ref[kk] -= 1

    def prepare_store(self, keys: list[bytes], c: ReqContext) -> tuple[list[bytes], list[int], list[bytes]] | None:
        absent = [kk for kk in keys if kk not in self.slot]
        self._access(c, [kk for kk in keys if kk not in self.slot or self.ref[kk] >= 0])
        if not absent:
            return [], [], []
        need = len(absent) - (self.n - self.allocated + len(self.free))
        evicted: list[bytes] = []
        if need > 0:
            cands = sorted(
                (kk for kk in self.slot if self.ref[kk] == 0 and kk not in keys), key=lambda x: (self.rank[x], x)
            )
            if len(cands) < need:
                return None
            evicted = cands[:need]
            for kk in evicted:
                self.free.append(self.slot.pop(kk))
                del self.ref[kk], self.rank[kk]
        slots = []
        major = 0
        for kk in absent:
            s = self.allocated if self.allocated < self.n else self.free.pop()
            self.allocated += self.allocated < self.n
            self.slot[kk], self.ref[kk] = s, -1
            p = c.get_offload_key_position(kk)
            if p is None:
                self.rank[kk] = self._fresh()
            else:
                major = major or self._major(c)
                self.rank[kk] = (major, -p)
            slots.append(s)
        return absent, slots, evicted

    def complete_store(self, keys: list[bytes], ok: bool) -> None:
        for kk in keys:
            if self.ref.get(kk) == -1:
                if ok:
                    self.ref[kk] = 0
                else:
                    self.free.append(self.slot.pop(kk))
                    del self.ref[kk], self.rank[kk]

    def finish(self, c: ReqContext) -> None:
        keys = self.seen.pop(c.req_id, None)
        self.major.pop(c.req_id, None)
        if not keys:
            return
        keys = sorted(keys, key=lambda kk: c.get_offload_key_position(kk))  # type: ignore[arg-type,return-value]
        for kk in reversed(keys):
            if kk in self.rank:
                self.rank[kk] = self._fresh()


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_reference_on_interleaved_requests(seed: int) -> None:
    rng = random.Random(seed)
    real, ref = manager(8), RefRequestLRU(8)
    live: dict[str, tuple[ReqContext, list[bytes]]] = {}
    loads: list[tuple[ReqContext, list[bytes]]] = []
    stores: list[tuple[ReqContext, list[bytes]]] = []
    n = 0
    for step in range(1500):
        what = rng.random()
        if what < 0.15 and len(live) < 4:
            chain = rng.randrange(4)
            keys = [k(100 * chain + d) for d in range(rng.randint(1, 6))]
            live[f"r{n}"] = (request(f"r{n}", keys), keys)
            n += 1
        elif what < 0.55 and live:
            c, keys = live[rng.choice(list(live))]
            hits = []
            for kk in keys:
                if real.lookup(kk, c) is not True:
                    break
                hits.append(kk)
            if hits and rng.random() < 0.7:
                assert list(real.prepare_load(hits, c).block_ids) == ref.prepare_load(hits, c), step
                loads.append((c, hits))
            rest = keys[len(hits) :]
            if rest:
                out, want = real.prepare_store(rest, c), ref.prepare_store(rest, c)
                assert (out is None) == (want is None), step
                if out is not None and want is not None:
                    got = (out.keys_to_store, list(out.store_spec.block_ids), out.evicted_keys)
                    assert got == want, step
                    if out.keys_to_store:
                        stores.append((c, out.keys_to_store))
        elif what < 0.7 and loads:
            c, keys = loads.pop(rng.randrange(len(loads)))
            real.complete_load(keys, c)
            ref.complete_load(keys)
        elif what < 0.85 and stores:
            c, keys = stores.pop(rng.randrange(len(stores)))
            ok = rng.random() < 0.9
            real.complete_store(keys, c, ok)
            ref.complete_store(keys, ok)
        elif live:
            rid = rng.choice(list(live))
            c, _ = live.pop(rid)
            real.on_request_finished(c, c.get_offload_key_position)
            ref.finish(c)
    assert n > 50
