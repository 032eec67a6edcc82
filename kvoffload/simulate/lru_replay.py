"""The one-tier LRU replay without the manager's per-call machinery: the same decisions, several times faster.

:func:`~kvoffload.simulate.cache_replay.replay_cache` drives a
:class:`~kvoffload.cache.manager.CPUOffloadingManager` with six calls per request; for the ``lru``
policy without a shared tier, :func:`replay_lru` makes the decisions those calls make, restated
over one :class:`collections.OrderedDict` of dense block ids (least recent first), per request:

1. the hit is the leading run of the request's blocks present (``lookup_batch``);
2. its present blocks move to the most recent end, the last one first, so that its first block
   ends up most recent (``touch``; the load that follows pins and unpins, changing no order);
3. the absent blocks after the hit need free slots: when there are too few, the least recent
   blocks are evicted, sparing the present blocks after the hit (``store_plan``'s protected keys;
   the hit's own blocks may go), and when even all the others would not make room nothing is
   stored (``store_plan`` returned None); else the absent blocks are inserted, in order, at the
   most recent end (``complete_store``).

The tests replay random traces through both at capacities down to one block (failed stores and
evictions of the hit included) and compare every request's hit, the stores, evictions and failures.
A trace whose request repeats a block is left to the manager (the replay never builds such keys).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace

__all__ = ["replay_lru"]


def replay_lru(trace: BlockTrace, capacity: int) -> tuple[np.ndarray, np.ndarray, int, int, int, float]:
    """The one-tier LRU replay of ``trace`` at ``capacity`` blocks (module docstring).

    Returns every request's hit blocks (``int64[R]``), whether each block was ever stored
    (``bool[num_blocks]``), the blocks stored, evicted, the failed stores and the wall seconds.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidArgumentError(f"capacity must be a positive int, got {capacity!r}")
    t0 = time.perf_counter()
    ids, st = trace.ids.tolist(), trace.starts.tolist()
    order: OrderedDict[int, None] = OrderedDict()
    move, popfirst = order.move_to_end, order.popitem
    hits = [0] * trace.num_requests
    ever = bytearray(trace.num_blocks)
    stored = evicted = failed = 0
    for r in range(trace.num_requests):
        keys = ids[st[r] : st[r + 1]]
        n = len(keys)
        if not n:
            continue
        h = 0
        for k in keys:
            if k not in order:
                break
            h += 1
        hits[r] = h
        for k in reversed(keys):  # touch: the first block ends up most recent
            if k in order:
                move(k)
        if h == n:
            continue
        rest = keys[h:]
        absent = [k for k in rest if k not in order]
        if not absent:
            continue
        need = len(absent) - (capacity - len(order))
        if need > 0:
            spared = len(rest) - len(absent)  # the present blocks after the hit
            if need > len(order) - spared:
                failed += 1
                continue
            if spared:
                keep = set(rest)
                victims = []
                for k in order:
                    if k not in keep:
                        victims.append(k)
                        if len(victims) == need:
                            break
                for k in victims:
                    del order[k]
            else:
                for _ in range(need):
                    popfirst(last=False)
            evicted += need
        for k in absent:
            order[k] = None
            ever[k] = 1
        stored += len(absent)
    ever_stored = np.frombuffer(bytes(ever), dtype=np.uint8).astype(bool)
    return np.array(hits, dtype=np.int64), ever_stored, stored, evicted, failed, time.perf_counter() - t0
