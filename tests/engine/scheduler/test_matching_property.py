"""find_loadable_tokens equals a brute-force search for the largest end valid in every group."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.matching import find_loadable_tokens


@st.composite
def cases(draw):
    n_groups = draw(st.integers(1, 3))
    groups = []
    for g in range(n_groups):
        bs = draw(st.sampled_from([2, 4]))
        f = draw(st.integers(1, 3))
        w = draw(st.one_of(st.none(), st.integers(1, 3)))
        groups.append(GroupOffloadConfig(g, bs, bs * f, w))
    cfg = OffloadingSchedulerConfig(tuple(groups), hash_block_size=2)
    max_end = draw(st.integers(0, 60))
    lcm_bs = int(np.lcm.reduce([g.gpu_block_size for g in groups]))
    n_comp = draw(st.integers(0, max_end // lcm_bs)) * lcm_bs
    present = [
        draw(
            st.lists(
                st.booleans(), min_size=max_end // g.offloaded_block_size, max_size=max_end // g.offloaded_block_size
            )
        )
        for g in groups
    ]
    return cfg, max_end, n_comp, present


def brute_force(cfg, max_end, n_comp, present) -> int:
    for e in range(max_end, n_comp, -1):
        ok = True
        for g, gcfg in enumerate(cfg.groups):
            obs = gcfg.offloaded_block_size
            if e % obs:
                ok = False
                break
            n, start = e // obs, n_comp // obs
            hit = [i < start or present[g][i] for i in range(n)]
            w = gcfg.sliding_window_size_in_blocks
            if w is None:
                ok = all(present[g][i] for i in range(start, n))
            else:
                ok = all(hit[max(0, n - w) : n])
            if not ok:
                break
        if ok:
            return e
    return n_comp


@settings(max_examples=400, deadline=None)
@given(cases())
def test_matches_brute_force(case) -> None:
    cfg, max_end, n_comp, present = case
    keys = [[(g, i) for i in range(len(present[g]))] for g in range(len(cfg.groups))]

    def fetch(ks):
        return np.array([LOOKUP_HIT if present[g][i] else LOOKUP_MISS for g, i in ks], dtype=np.int8)

    got = find_loadable_tokens(cfg, keys, n_comp, max_end, fetch)
    want = brute_force(cfg, max_end, n_comp, present)
    assert max(got, n_comp) == want
