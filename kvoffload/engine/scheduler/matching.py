"""How many tokens beyond the GPU-computed ones a request can load (multi-group lookup).

:func:`find_loadable_tokens` runs the lookups of ``get_num_new_matched_tokens``:

* the candidate end starts at the request's hashed tokens, minus the last prompt token when any
  group uses a sliding window (that token is always recomputed);
* groups are visited full-attention first; a full-attention group keeps its maximal prefix of
  hits from the first offloaded block not on the GPU, a sliding-window group the last full window
  of hits (blocks already on the GPU count as hits); each shrinks the candidate to its own end,
  aligned to its offloaded block size;
* a group that shrank the candidate makes every group re-validate, until a pass changes nothing
  (full-attention prefixes are monotone; a window must end exactly at the final end);
* a pending key met on the way defers the request (returns None).

Codes come from the manager's batch lookup (``lookup_batch``) in chunks, fetched once per call
and shared by the re-validation passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvoffload.core.base import OffloadKey, ReqContext
from kvoffload.core.lookup_code import LOOKUP_PENDING, lookup_code
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.engine.scheduler.lookup import LookupCodes
from kvoffload.engine.scheduler.state import RequestOffloadState

__all__ = ["find_loadable_tokens", "make_fetch", "load_ranges", "touch_request"]


def make_fetch(manager: Any, ctx: ReqContext) -> tuple[Callable[[Sequence[OffloadKey]], np.ndarray], bool]:
    """``(fetch, batched)``: ``fetch(keys) -> np.int8 codes`` over the manager's ``lookup_batch``
    when it has one (``batched`` True), else over ``lookup`` key by key."""
    if hasattr(manager, "lookup_batch"):
        return (lambda keys: manager.lookup_batch(keys, ctx)), True

    def fetch(keys: Sequence[OffloadKey]) -> np.ndarray:
        out = np.empty(len(keys), dtype=np.int8)
        for i, k in enumerate(keys):
            out[i] = lookup_code(manager.lookup(k, ctx))
        return out

    return fetch, False


def find_loadable_tokens(
    config: OffloadingSchedulerConfig,
    group_keys: Sequence[Sequence[OffloadKey]],
    num_computed_tokens: int,
    max_end_tokens: int,
    fetch: Callable[[Sequence[OffloadKey]], np.ndarray],
    batched: bool = True,
    pending: list[OffloadKey] | None = None,
) -> int | None:
    """The end (in tokens) of the longest loadable range, or None to defer.

    Args:
        config: the groups.
        group_keys: per group, the request's offload keys (prefix order), covering at least
            ``max_end_tokens // offloaded_block_size`` blocks.
        num_computed_tokens: tokens already in the GPU cache (multiple of each GPU block size).
        max_end_tokens: upper bound of the end.
        fetch: batch lookup returning ``np.int8`` codes.
        batched: False: fetch one key at a time (a manager without ``lookup_batch`` is asked
            exactly what the key-by-key pure functions would ask).
        pending: when given and the answer is None, the keys that answered ``LOOKUP_PENDING``
            are appended to it (what the deferred request waits on).

    Returns:
        An end ``e`` aligned to every group's offloaded block size with ``e <= max_end_tokens``;
        ``e <= num_computed_tokens`` means nothing to load. None when a pending key decides.
    """
    groups = config.groups
    order = [g for g in groups if not g.is_sliding_window] + [g for g in groups if g.is_sliding_window]
    codes: dict[int, LookupCodes] = {}
    candidate = max_end_tokens
    changed = True
    while changed:
        changed = False
        for gcfg in order:
            obs = gcfg.offloaded_block_size
            end_block = candidate // obs
            start_block = num_computed_tokens // obs
            lc = codes.get(gcfg.group_idx)
            if lc is None:
                keys = group_keys[gcfg.group_idx]
                # full attention: blocks below start_block are never looked up (the prefix scan
                # starts there); sliding window: they are on the GPU, i.e. hits
                lc = LookupCodes(
                    keys, fetch, known_hits=start_block, first_chunk=32 if batched else 1, growth=4 if batched else 1
                )
                codes[gcfg.group_idx] = lc
            if gcfg.sliding_window_size_in_blocks is None:
                if end_block <= start_block:
                    end = end_block * obs
                else:
                    hits = lc.prefix(start_block, end_block)
                    if hits is None:
                        _note_pending(codes, pending)
                        return None
                    end = (start_block + hits) * obs
            else:
                e = lc.window(end_block, gcfg.sliding_window_size_in_blocks)
                if e is None:
                    _note_pending(codes, pending)
                    return None
                end = e * obs
            if end < candidate:
                candidate = end
                changed = True
            if candidate <= num_computed_tokens:
                return candidate
    return candidate


def _note_pending(codes: dict[int, LookupCodes], pending: list[OffloadKey] | None) -> None:
    """Append the keys fetched as ``LOOKUP_PENDING`` to ``pending`` (when given)."""
    if pending is not None:
        for lc in codes.values():
            pending.extend(lc.keys[i] for i in np.flatnonzero(lc.codes == LOOKUP_PENDING).tolist())


def load_ranges(config: OffloadingSchedulerConfig, n_comp: int, end: int) -> tuple[tuple[int, int], ...]:
    """Per group, GPU block indices ``[first, last)`` that a load of tokens ``[n_comp, end)`` writes
    (a sliding-window group: only the window ending at ``end``)."""
    out = []
    for gcfg in config.groups:
        bs = gcfg.gpu_block_size
        first = n_comp
        if gcfg.sliding_window_size_in_blocks is not None:
            first = max(first, end - gcfg.sliding_window_size_in_blocks * gcfg.offloaded_block_size)
        last = max(end, first)
        out.append((first // bs, last // bs))
    return tuple(out)


def touch_request(config: OffloadingSchedulerConfig, st: RequestOffloadState, end_tokens: int, manager: Any) -> None:
    """Touch the request's keys, group by group: all of a full-attention group's keys; a
    sliding-window group's keys from ``max(0, hit_blocks - window)`` on, ``hit_blocks`` being
    the offloaded blocks covered once ``end_tokens`` tokens are on the GPU."""
    for gcfg, gs in zip(config.groups, st.groups, strict=False):
        hit_blocks = end_tokens // gcfg.offloaded_block_size
        gs.num_hit_blocks = hit_blocks
        w = gcfg.sliding_window_size_in_blocks
        keys = gs.keys if w is None else gs.keys[max(0, hit_blocks - w) :]
        if keys:
            manager.touch(keys, st.req_context)
