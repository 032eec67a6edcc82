"""Realistic request trace for ``bench_manager.py``: prefix-sharing 8k-token prompts, replayed like a scheduler.

A prompt is ``PROMPT_BLOCKS`` (512) keys: a shared prefix (one of many documents/system
prompts, Zipf popularity, 64..448 blocks) followed by a tail unique to the request. Every
request builds fresh key objects (as an engine hashing its prompt would). :func:`run_trace`
replays requests the way a scheduler drives a manager: prefix lookup, touch, load of the hit
prefix (completed 4 requests later), stores of the rest in 128-key steps (completed 8 steps
later).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any

import numpy as np

from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT

KEY_BYTES = 36  # 32-byte block hash + 4-byte group index
PROMPT_BLOCKS = 512
STORE_STEP = 128
CTX = ReqContext(req_id="bench")


class PrefixTrace:
    """Prompts of ``PROMPT_BLOCKS`` keys: a Zipf-popular shared prefix + a unique tail.

    Each call of :meth:`request` returns fresh ``bytes`` key objects (hash not cached),
    sliced from one blob per request, as an engine that hashes a prompt would create them.
    """

    def __init__(self, seed: int, num_prefixes: int, zipf_a: float = 1.1) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_prefixes = num_prefixes
        self.lengths = self.rng.integers(64, 449, size=num_prefixes)
        self.blobs = [self.rng.bytes(KEY_BYTES * int(n)) for n in self.lengths]
        w = 1.0 / np.arange(1, num_prefixes + 1) ** zipf_a
        self.p = w / w.sum()

    def request(self) -> list[bytes]:
        f = int(self.rng.choice(self.num_prefixes, p=self.p))
        n_shared = int(self.lengths[f])
        blob = self.blobs[f] + self.rng.bytes(KEY_BYTES * (PROMPT_BLOCKS - n_shared))
        return [blob[i : i + KEY_BYTES] for i in range(0, KEY_BYTES * PROMPT_BLOCKS, KEY_BYTES)]


def _filler(n: int, seed: int) -> list[bytes]:
    blob = np.random.default_rng(seed).bytes(KEY_BYTES * n)
    return [blob[i : i + KEY_BYTES] for i in range(0, KEY_BYTES * n, KEY_BYTES)]


def _prefill(m: Any, keys: list[bytes]) -> None:
    for i in range(0, len(keys), 4096):
        chunk = keys[i : i + 4096]
        m.prepare_store(chunk, CTX)
        m.complete_store(chunk, CTX)


def run_trace(m: Any, requests: list[list[bytes]], batch_lookup: bool) -> dict[str, float]:
    """Replay ``requests`` on ``m``; return wall time, key-ops and hit statistics."""
    loads: deque[list[bytes]] = deque()
    stores: deque[list[bytes]] = deque()
    key_ops = 0
    hit_keys = 0
    failed = 0
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    for keys in requests:
        n = len(keys)
        if batch_lookup:
            codes = m.lookup_batch(keys, CTX)
            miss = np.flatnonzero(codes != LOOKUP_HIT)
            h = int(miss[0]) if len(miss) else n
            key_ops += n
        else:
            h = 0
            lookup = m.lookup
            while h < n and lookup(keys[h], CTX) is True:
                h += 1
            key_ops += min(h + 1, n)
        m.touch(keys, CTX)
        key_ops += n
        if h:
            m.prepare_load(keys[:h], CTX)
            loads.append(keys[:h])
            key_ops += h
            hit_keys += h
        for c in range(h, n, STORE_STEP):
            step = keys[c : c + STORE_STEP]
            out = m.prepare_store(step, CTX)
            key_ops += len(step)
            if out is None:
                failed += 1
            elif out.keys_to_store:
                stores.append(out.keys_to_store)
        while len(loads) > 4:
            done = loads.popleft()
            m.complete_load(done, CTX)
            key_ops += len(done)
        while len(stores) > 8:
            done = stores.popleft()
            m.complete_store(done, CTX)
            key_ops += len(done)
    elapsed = time.perf_counter() - t0
    if gc_was:
        gc.enable()
    return {
        "seconds": elapsed,
        "requests_per_s": len(requests) / elapsed,
        "key_ops_per_s": key_ops / elapsed,
        "hit_fraction": hit_keys / (len(requests) * PROMPT_BLOCKS),
        "failed_stores": failed,
    }
