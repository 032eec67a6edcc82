"""One engine process sharing a tier: ``python -m tests.tiers.share_worker store|load SPEC N SEED``.

``store`` writes N records (bytes a function of SEED and the slot) under N keys; ``load`` uses a
fresh tier object to look the keys up and load them into zeroed records, checks every byte
against the records rebuilt from SEED, and prints ``{"hits": h, "loaded": l, "verified": v}``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from kvoffload.core.lookup_code import LOOKUP_HIT
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import open_tier
from tests.tiers.conftest import NS, make_records

RB = 96 << 10


def main(role: str, spec: str, n: int, seed: int) -> dict[str, int]:
    src = make_records(n, RB, seed)
    keys = make_keys(n, b"shared")
    if role == "store":
        with open_tier(spec, src, NS) as t:
            ok = run_job(t, "store", 1, keys, list(range(n)))
        return {"stored": sum(ok)}
    dst = np.zeros_like(src)
    with open_tier(spec, dst, NS) as t:
        codes = settle(t, keys)
        hits = [i for i in range(n) if codes[i] == LOOKUP_HIT]
        ok = run_job(t, "load", 2, [keys[i] for i in hits], hits)
    loaded = [i for i, good in zip(hits, ok, strict=True) if good]
    verified = sum(bool((dst[i] == src[i]).all()) for i in loaded)
    untouched = all(not dst[i].any() for i in range(n) if i not in loaded)
    return {"hits": len(hits), "loaded": len(loaded), "verified": verified, "untouched": int(untouched)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
