"""The infinite cache counted the way trace-analysis tools count it: in the trace's own blocks.

kvoffload's infinite line (:mod:`kvoffload.simulate.cache_replay`) counts prompt **tokens** of **full
offloaded blocks** a request finds stored, caps a request's hit at ``prompt - 1`` tokens (the
engine always computes the last prompt token) and counts every request from the first. Tools that
analyse a trace directly usually count the trace's **blocks** (a Mooncake trace's 512-token
``hash_ids``, a partial last block counted whole), without the cap, and often only over a
steady-state window after a warm-up. Both are right for what they count; this module gives the
second, so that a reader can put the two side by side.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvoffload.errors import InvalidArgumentError

__all__ = ["TraceBlockView", "trace_block_view"]


@dataclass(frozen=True)
class TraceBlockView:
    """Hits of an infinite cache over trace blocks.

    Attributes:
        hit_blocks, total_blocks: over every request: trace blocks of the leading run a request
            shares with earlier requests, and all trace blocks.
        window_hit_blocks, window_total_blocks: the same over the requests after the warm-up.
        warmup_requests: requests counted as warm-up (they still fill the cache).
    """

    hit_blocks: int
    total_blocks: int
    window_hit_blocks: int
    window_total_blocks: int
    warmup_requests: int

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def window_hit_rate(self) -> float:
        return self.window_hit_blocks / self.window_total_blocks if self.window_total_blocks else 0.0


def trace_block_view(blocks_per_request: Sequence[Sequence[Hashable]], warmup: float) -> TraceBlockView:
    """The infinite cache over ``blocks_per_request`` (per request in arrival order, its trace
    blocks' ids, head first; an id names the whole prefix up to its block's end): a request hits
    the leading run of its blocks that some earlier request had. ``warmup`` in ``[0, 1)`` is the
    share of the requests, from the first, left out of the window counts."""
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not 0 <= warmup < 1:
        raise InvalidArgumentError(f"warmup must be a number in [0, 1), got {warmup!r}")
    first = int(len(blocks_per_request) * warmup)
    seen: set[Hashable] = set()
    hits = total = w_hits = w_total = 0
    for r, blocks in enumerate(blocks_per_request):
        run = 0
        for b in blocks:
            if b not in seen:
                break
            run += 1
        hits += run
        total += len(blocks)
        if r >= first:
            w_hits += run
            w_total += len(blocks)
        seen.update(blocks)
    return TraceBlockView(hits, total, w_hits, w_total, first)
