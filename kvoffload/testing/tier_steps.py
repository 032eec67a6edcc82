"""Steps a tier test takes as an engine would: distinct keys, engine steps until lookups settle, one
job submitted and waited for. Shared by the tier conformance suite and kvoffload's own tier tests."""

from __future__ import annotations

import time

import numpy as np

from kvoffload.core.lookup_code import LOOKUP_RETRY
from kvoffload.tiers import Tier

__all__ = ["make_keys", "run_job", "settle"]


def make_keys(n: int, tag: bytes = b"k") -> list[bytes]:
    """``n`` distinct 36-byte keys (a 32-byte hash + a 4-byte group index)."""
    return [(tag + i.to_bytes(4, "big")).ljust(32, b".") + (0).to_bytes(4, "big") for i in range(n)]


def settle(tier: Tier, keys: list[bytes], timeout: float = 10.0) -> np.ndarray:
    """Run engine steps (lookup + end_step) until no key answers RETRY; returns the codes."""
    deadline = time.monotonic() + timeout
    while True:
        codes = tier.lookup(keys)
        tier.end_step()
        if not (codes == LOOKUP_RETRY).any():
            return codes
        assert time.monotonic() < deadline, "lookups still RETRY after the timeout"
        tier.drain(timeout=1.0)


def run_job(
    tier: Tier, kind: str, job_id: int, keys: list[bytes], slots: list[int], drain_timeout: float = 30.0
) -> tuple[bool, ...]:
    """Submit one job, wait for it, return its per-key ok (the result names the job's keys)."""
    submit = tier.submit_store if kind == "store" else tier.submit_load
    submit(job_id, keys, slots)
    assert tier.drain(timeout=drain_timeout)
    done = [r for r in tier.get_finished() if r.job_id == job_id]
    assert len(done) == 1 and done[0].kind == kind and done[0].keys == tuple(keys)
    return done[0].ok
