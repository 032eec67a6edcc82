"""Bounded promotions: without a cap, blocks promoted from a tier and not yet read by a load crowd the
host pool and evict blocks another request is about to load; with ``max_promoted_blocks`` the
promotions beyond it answer a miss (counted) and the pool keeps those blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING
from kvoffload.engine.tiered import TieredManager
from kvoffload.errors import InvalidTypeError
from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import DiskTier
from tests.keys import CTX
from tests.tiers.conftest import ASYNC, NS, make_records

RB = 4096
POOL = 8


def _pool_with_hot_blocks(tmp_path: Path, cap: int | None) -> tuple[TieredManager, list[bytes], list[bytes]]:
    """A pool of 8 slots holding 4 "hot" blocks (ready, about to be loaded by a waiting request) over a
    disk tier holding 12 other blocks."""
    tier_keys, hot = make_keys(12, b"tier"), make_keys(4, b"hot")
    src = make_records(12, RB, seed=1)
    with DiskTier(src, NS, tmp_path, o_direct=False) as writer:
        assert all(run_job(writer, "store", 1, tier_keys, list(range(12))))
    records = np.zeros((POOL, RB), np.uint8)
    m = TieredManager(
        CPUOffloadingManager(POOL), [DiskTier(records, NS, tmp_path, o_direct=False)], max_promoted_blocks=cap, **ASYNC
    )
    out = m.prepare_store(hot, CTX)
    assert out is not None
    m.complete_store(hot, CTX)
    assert m.drain(timeout=30)  # the write-through of the hot blocks
    return m, tier_keys, hot


def _promote(m: TieredManager, keys: list[bytes], req: str) -> list[int]:
    """One request's lookup of ``keys`` until its tier probe is answered; its codes then."""
    ctx = ReqContext(req)
    for _ in range(50):
        codes = m.lookup_batch(keys, ctx).tolist()
        m.end_step()
        if LOOKUP_PENDING not in codes or m.num_reserved():
            return codes
        m.tiers[0].drain(timeout=5)
    raise AssertionError("probe never answered")


@pytest.mark.parametrize("cap", [POOL, None], ids=["no-cap", "default-cap"])
def test_promotions_crowd_the_pool_only_without_a_cap(tmp_path: Path, cap: int | None) -> None:
    m, tier_keys, hot = _pool_with_hot_blocks(tmp_path, cap)
    try:
        for r in range(3):  # three requests, each a 2-block prefix found in the tier
            _promote(m, tier_keys[2 * r : 2 * r + 2], f"y{r}")
            assert m.drain(timeout=30)
        hot_codes = m.primary.peek(hot).tolist()
        u = m.usage()[0]
        if cap == POOL:  # no effective cap: 6 promoted blocks no load has read evicted 2 hot blocks
            assert u.blocks_promoted == 6 and u.promotions_capped == 0
            assert hot_codes.count(LOOKUP_MISS) == 2
        else:  # half the pool: 4 promoted, 2 capped; every hot block kept
            assert m.max_promoted_blocks == POOL // 2
            assert u.blocks_promoted == 4 and u.promotions_capped == 2
            assert hot_codes == [LOOKUP_HIT] * 4
            assert m.num_promoted_unread() == 4
            # once a load reads the promoted blocks, the next request may promote
            spec = m.prepare_load(tier_keys[:2], ReqContext("y0"))
            assert len(spec.block_ids) == 2
            m.complete_load(tier_keys[:2], ReqContext("y0"))
            assert m.num_promoted_unread() == 2
            codes = _promote(m, tier_keys[4:6], "y2-again")
            assert codes == [LOOKUP_PENDING, LOOKUP_PENDING]
            assert m.drain(timeout=30) and m.usage()[0].blocks_promoted == 6
    finally:
        m.close()


def test_max_promoted_blocks_is_checked(tmp_path: Path) -> None:
    records = np.zeros((4, 64), np.uint8)
    with DiskTier(records, NS, tmp_path, o_direct=False) as tier:
        with pytest.raises(InvalidTypeError, match="max_promoted_blocks"):
            TieredManager(CPUOffloadingManager(4), [tier], max_promoted_blocks="2")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_promoted_blocks"):
            TieredManager(CPUOffloadingManager(4), [tier], max_promoted_blocks=0)
