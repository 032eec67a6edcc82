"""One engine process using a shared tier until told to stop:
``python -m tests.tiers.cluster_engine SPEC STOP_FILE OUT_JSON``.

Every step it stores 8 keys of the step (``s<step>-<j>``; another engine storing the same keys
writes the same bytes, so whichever write lands, every reader can check it), looks up and loads
the keys of five steps back (its own and the other engine's stores), and checks every loaded byte
against the record the key stands for. It stops when ``STOP_FILE`` exists and writes, to
``OUT_JSON``: per step its wall-clock start and how many of its stores landed, the keys loaded
and verified, the loaded keys whose bytes were wrong (must be none), and the tier's counters.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np

from kvoffload.tiers import TIER_HIT, open_tier
from tests.tiers.conftest import NS, run_job, settle

RB = 16 << 10
PER_STEP = 8


def record_of(key: bytes) -> np.ndarray:
    """The bytes every engine stores under ``key``."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, RB, dtype=np.uint8)


def step_keys(step: int) -> list[bytes]:
    return [f"s{step}-{j}".encode().ljust(36, b".") for j in range(PER_STEP)]


def main(spec: str, stop_file: str, out_json: str) -> None:
    records = np.zeros((2 * PER_STEP, RB), dtype=np.uint8)
    steps: list[tuple[float, int]] = []
    loaded = verified = wrong = 0
    job = 0
    with open_tier(spec, records, NS, socket_timeout=0.5, connect_timeout=0.5, backoff_max=0.5) as tier:
        step = 0
        while not os.path.exists(stop_file):
            t0 = time.time()
            keys = step_keys(step)
            for j, k in enumerate(keys):
                records[j] = record_of(k)
            job += 1
            steps.append((t0, sum(run_job(tier, "store", job, keys, list(range(PER_STEP))))))
            back = step_keys(step - 5) if step >= 5 else []
            if back:
                codes = settle(tier, back)
                hits = [k for k, c in zip(back, codes, strict=True) if c == TIER_HIT]
                job += 1
                ok = run_job(tier, "load", job, hits, list(range(PER_STEP, PER_STEP + len(hits))))
                for i, (k, good) in enumerate(zip(hits, ok, strict=True)):
                    if good:
                        loaded += 1
                        same = bool((records[PER_STEP + i] == record_of(k)).all())
                        verified += same
                        wrong += not same
            step += 1
            time.sleep(0.02)
        stats = dict(tier.stats().__dict__)
    with open(out_json, "w") as f:
        json.dump({"steps": steps, "loaded": loaded, "verified": verified, "wrong": wrong, "stats": stats}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
