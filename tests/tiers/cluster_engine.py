"""One engine process sharing a tier until told to stop:
``python -m tests.tiers.cluster_engine SPEC STOP_FILE OUT_JSON``.

The engine's host pool is a :class:`TieredManager` over a small :class:`CPUOffloadingManager`
(24 slots) with the tier beneath it, driven as the engine drives it. Every step it stores 8
blocks of the step (keys ``s<step>-<j>``; another engine storing the same keys writes the same
bytes, so whichever write lands, every reader can check it) and waits for their write-through;
then it looks up the keys of five steps back (long evicted from its pool: they come back from the
tier, stored by it or by the other engine), loads the hits and checks every byte against the
record the key stands for. It appends each step's wall-clock start to ``OUT_JSON.steps`` when
the step is done; after 8 steps it creates ``OUT_JSON.ready``; it stops when
``STOP_FILE`` exists, drains, and writes to ``OUT_JSON``: per step its wall-clock start and how
many of its writes reached the tier, the blocks loaded and verified, the loaded blocks whose bytes
were wrong (must be none), the host-pool slots still pinned, pending, reserved or write-pinned
(must be none) and the tier's counters.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_PENDING
from kvoffload.engine.tiered import TieredManager
from kvoffload.tiers import open_tier
from tests.tiers.conftest import NS

RB = 16 << 10
PER_STEP = 8
POOL = 24


def record_of(key: bytes) -> np.ndarray:
    """The bytes every engine stores under ``key``."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, RB, dtype=np.uint8)


def step_keys(step: int) -> list[bytes]:
    return [f"s{step}-{j}".encode().ljust(36, b".") for j in range(PER_STEP)]


def _settle(m: TieredManager, keys: list[bytes], ctx: ReqContext) -> np.ndarray:
    """Engine steps (lookup + end_step) until no key is pending."""
    deadline = time.monotonic() + 30
    while True:
        codes = m.lookup_batch(keys, ctx)
        m.end_step()
        if not (codes == LOOKUP_PENDING).any():
            return codes
        assert time.monotonic() < deadline, "lookups still pending"
        time.sleep(0.002)


def main(spec: str, stop_file: str, out_json: str) -> None:
    records = np.zeros((POOL, RB), dtype=np.uint8)
    tier = open_tier(spec, records, NS, connect_timeout=0.5, backoff_max=0.5)  # 2 s replies: a loaded machine
    m = TieredManager(CPUOffloadingManager(POOL), [tier])
    steps: list[tuple[float, int]] = []
    loaded = verified = wrong = 0
    step = 0
    while not os.path.exists(stop_file):
        t0 = time.time()
        ctx = ReqContext(f"step-{step}")
        keys = step_keys(step)
        written = m.usage()[0].blocks_written
        out = m.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == keys
        for k, slot in zip(keys, out.store_spec.block_ids.tolist(), strict=True):
            records[slot] = record_of(k)
        m.complete_store(keys, ctx)
        assert m.drain(timeout=30)
        steps.append((t0, m.usage()[0].blocks_written - written))
        if step >= 5:
            back = step_keys(step - 5)
            codes = _settle(m, back, ctx)
            hits = [k for k, c in zip(back, codes, strict=True) if c == LOOKUP_HIT]
            if hits:
                spec_ = m.prepare_load(hits, ctx)
                for k, slot in zip(hits, spec_.block_ids.tolist(), strict=True):
                    same = bool((records[slot] == record_of(k)).all())
                    loaded += 1
                    verified += same
                    wrong += not same
                m.complete_load(hits, ctx)
        with open(out_json + ".steps", "a") as f:  # progress the test waits on
            f.write(f"{t0!r}\n")
        step += 1
        if step == 8:  # stored and loaded for a while: the test may start its event
            open(out_json + ".ready", "w").close()
        time.sleep(0.02)
    assert m.drain(timeout=30)
    st = m.primary.get_stats()
    leaked = st.num_pending + st.num_pinned + m.num_reserved() + m.num_write_pinned()
    stats = dict(tier.stats().__dict__)
    m.close()
    result = {"steps": steps, "loaded": loaded, "verified": verified, "wrong": wrong, "leaked": leaked}
    with open(out_json, "w") as f:
        json.dump({**result, "stats": stats}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
