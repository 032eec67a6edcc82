"""Manager operations at 10^4, 10^5 and 10^6 blocks: ``CPUOffloadingManager`` (lru) vs the
OrderedDict baseline, each on a full pool of ready blocks.

Operations: one ``lookup`` (hits, misses; fresh key objects, hash pre-computed), ``touch`` of a
512-key prompt, a 128-key load (``prepare_load`` + ``complete_load``) and a 128-key store on the
full pool (``prepare_store`` + ``complete_store``: 128 evictions). ``KVOFFLOAD_MICRO_MAX_BLOCKS``
caps the sizes (e.g. ``100000`` for a quicker run).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from bench.baseline_manager import OrderedDictLRUManager
from bench.manager_trace import CTX, _filler, _prefill
from kvoffload.cache.manager import CPUOffloadingManager

_MAX = int(os.environ.get("KVOFFLOAD_MICRO_MAX_BLOCKS", "1000000"))
SIZES = [c for c in (10_000, 100_000, 1_000_000) if c <= _MAX]
IMPLS = ["ours", "baseline"]
N_LOOKUPS = 2000
PROMPT = 512
STEP = 128


class Pool:
    """A full manager and the keys it holds (kept in step with its evictions, untimed)."""

    def __init__(self, impl: str, capacity: int) -> None:
        self.impl = impl
        self.capacity = capacity
        self.m: Any = CPUOffloadingManager(capacity) if impl == "ours" else OrderedDictLRUManager(capacity)
        keys = _filler(capacity, seed=capacity)
        _prefill(self.m, keys)
        self.present = set(keys)
        self.rng = random.Random(capacity)
        self.seq = 0

    def sample(self, n: int) -> list[bytes]:
        """``n`` fresh copies of held keys, hashes computed."""
        picked = self.rng.sample(sorted(self.present) if len(self.present) < 50_000 else list(self.present), n)
        out = [bytes(bytearray(k)) for k in picked]
        for k in out:
            hash(k)
        return out

    def new_keys(self, n: int) -> list[bytes]:
        self.seq += 1
        out = _filler(n, seed=10**9 + self.capacity + self.seq)
        for k in out:
            hash(k)
        return out


_POOLS: dict[tuple[str, int], Pool] = {}


@pytest.fixture(params=SIZES, ids=lambda c: f"{c:.0e}".replace("+0", ""), scope="module")
def capacity(request: pytest.FixtureRequest) -> Any:
    yield request.param
    for key in [k for k in _POOLS if k[1] == request.param]:
        del _POOLS[key]


def _pool(impl: str, capacity: int) -> Pool:
    if (impl, capacity) not in _POOLS:
        _POOLS[(impl, capacity)] = Pool(impl, capacity)
    return _POOLS[(impl, capacity)]


def _group(op: str, capacity: int) -> str:
    return f"manager-{op}-{capacity:.0e}".replace("+0", "")


@pytest.mark.parametrize("impl", IMPLS)
def test_lookup_hit(record: Any, capacity: int, impl: str) -> None:
    pool = _pool(impl, capacity)
    keys = pool.sample(N_LOOKUPS)
    lookup = pool.m.lookup

    def run() -> None:
        for k in keys:
            lookup(k, CTX)

    record(_group("lookup-hit", capacity), impl, run, per=N_LOOKUPS)
    assert all(lookup(k, CTX) is True for k in keys[:50])


@pytest.mark.parametrize("impl", IMPLS)
def test_lookup_miss(record: Any, capacity: int, impl: str) -> None:
    pool = _pool(impl, capacity)
    keys = pool.new_keys(N_LOOKUPS)
    lookup = pool.m.lookup

    def run() -> None:
        for k in keys:
            lookup(k, CTX)

    record(_group("lookup-miss", capacity), impl, run, per=N_LOOKUPS)
    assert all(lookup(k, CTX) is False for k in keys[:50])


@pytest.mark.parametrize("impl", IMPLS)
def test_touch_prompt(record: Any, capacity: int, impl: str) -> None:
    pool = _pool(impl, capacity)
    keys = pool.sample(PROMPT)
    record(_group("touch-512", capacity), impl, lambda: pool.m.touch(keys, CTX))


@pytest.mark.parametrize("impl", IMPLS)
def test_load(record: Any, capacity: int, impl: str) -> None:
    pool = _pool(impl, capacity)
    m = pool.m

    def setup() -> tuple[tuple[list[bytes]], dict[str, Any]]:
        return (pool.sample(STEP),), {}

    def run(keys: list[bytes]) -> None:
        m.prepare_load(keys, CTX)
        m.complete_load(keys, CTX)

    record(_group("load-128", capacity), impl, run, setup=setup)


@pytest.mark.parametrize("impl", IMPLS)
def test_store_evicting(record: Any, capacity: int, impl: str) -> None:
    pool = _pool(impl, capacity)
    m = pool.m
    done: list[Any] = []

    def setup() -> tuple[tuple[list[bytes]], dict[str, Any]]:
        for keys, out in done:  # bookkeeping of the previous round, untimed
            pool.present.difference_update(out.evicted_keys)
            pool.present.update(keys)
        done.clear()
        return (pool.new_keys(STEP),), {}

    def run(keys: list[bytes]) -> None:
        out = m.prepare_store(keys, CTX)
        m.complete_store(keys, CTX)
        done.append((keys, out))

    record(_group("store-128-evicting", capacity), impl, run, setup=setup)
    assert done and len(done[-1][1].evicted_keys) == STEP
