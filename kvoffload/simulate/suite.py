"""Generated workloads that break cache policies: ``kvoffload simulate --suite NAME``.

Each is a list of :class:`~kvoffload.engine.reference.workload.TraceRequest` (16-token block hashes, no token
ids), so both replays read them. A prompt is a list of *pieces* (16 tokens each) whose hash is the
piece's id: a prompt that extends another repeats its pieces, so prefix keys match exactly as the
engine's chained hashes would. Sizes are in tokens, multiples of 512 so that every offloaded block
size up to 512 tiles them; ``scale`` multiplies the number of requests (tests use small scales).

* ``two-turn``: every conversation has exactly two turns; the second comes 0-600 requests after
  the first and extends it. "Seen before" then means "done": a policy that favours blocks read
  twice keeps exactly the dead ones (S-FIFO's main queue fills with them).
* ``scan``: a hot set of 48 documents (2K tokens, Zipf-like popularity) interleaved with long
  one-shot scans (32K tokens, one request in eight): LRU lets each scan flush the hot set.
* ``hot-prefix``: one 4K-token system prompt ahead of one-shot user content (0.5K-4K tokens).
* ``fast-chat``: short chats (4-16 turns of 0.5K-1K new tokens each) whose next turn comes after at
  most 12 other requests: recency is everything.
* ``loop``: 160 distinct 2K-token prompts requested in a fixed cycle (a 320K-token loop): LRU gets
  nothing at any capacity below the loop, any policy that keeps a fixed part gets that part.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from kvoffload.engine.reference.workload import TraceRequest
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.mooncake import piece_hash

logger = logging.getLogger(__name__)

__all__ = ["SUITE", "suite_workload"]

_PIECE = 16
_UNIT = 512 // _PIECE  # pieces per 512 tokens


class _Pieces:
    """Fresh piece ids."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, units: int) -> list[int]:
        n = units * _UNIT
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _request(i: int, pieces: list[int], max_tokens: int = 16) -> TraceRequest:
    return TraceRequest(f"s{i}", None, tuple(piece_hash(p) for p in pieces), len(pieces) * _PIECE, max_tokens, i + 1)


def _two_turn(rng: random.Random, n: int) -> list[list[int]]:
    ids = _Pieces()
    systems = [ids.take(1) for _ in range(4)]
    due: dict[int, list[int]] = {}
    out: list[list[int]] = []
    while len(out) < n:
        r = len(out)
        if r in due:
            out.append(due.pop(r) + ids.take(rng.randint(1, 2)))
            continue
        first = rng.choice(systems) + ids.take(rng.randint(2, 6))
        out.append(first)
        at = r + 1 + rng.randint(0, 600)
        while at in due:
            at += 1
        due[at] = first + ids.take(1)
    return out


def _scan(rng: random.Random, n: int) -> list[list[int]]:
    ids = _Pieces()
    docs = [ids.take(4) for _ in range(48)]
    weights = [1 / (k + 1) for k in range(len(docs))]
    out: list[list[int]] = []
    for _ in range(n):
        if rng.random() < 1 / 8:
            out.append(ids.take(64))
        else:
            out.append(rng.choices(docs, weights)[0] + ids.take(1))
    return out


def _hot_prefix(rng: random.Random, n: int) -> list[list[int]]:
    ids = _Pieces()
    system = ids.take(8)
    return [system + ids.take(rng.randint(1, 8)) for _ in range(n)]


def _fast_chat(rng: random.Random, n: int) -> list[list[int]]:
    ids = _Pieces()
    due: dict[int, tuple[list[int], int]] = {}
    out: list[list[int]] = []
    while len(out) < n:
        r = len(out)
        prompt, left = due.pop(r) if r in due else ([], rng.randint(4, 16))
        prompt = prompt + ids.take(rng.randint(1, 2))
        out.append(prompt)
        if left > 1:
            at = r + 1 + rng.randint(0, 12)
            while at in due:
                at += 1
            due[at] = (prompt, left - 1)
    return out


def _loop(rng: random.Random, n: int) -> list[list[int]]:
    ids = _Pieces()
    prompts = [ids.take(4) for _ in range(160)]
    return [prompts[i % len(prompts)] for i in range(n)]


#: name -> (generator of prompts as piece lists, requests at scale 1)
SUITE: dict[str, tuple[Callable[[random.Random, int], list[list[int]]], int]] = {
    "two-turn": (_two_turn, 6000),
    "scan": (_scan, 4000),
    "hot-prefix": (_hot_prefix, 4000),
    "fast-chat": (_fast_chat, 6000),
    "loop": (_loop, 1600),
}


def suite_workload(name: str, seed: int = 0, scale: float = 1.0) -> list[TraceRequest]:
    """The requests of suite workload ``name`` (module docstring), deterministic in ``seed``.

    Raises:
        InvalidArgumentError: unknown ``name``, or ``scale`` not positive.
    """
    if name not in SUITE:
        raise InvalidArgumentError(f"--suite must be one of {', '.join(SUITE)}, got {name!r}")
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
        raise InvalidArgumentError(f"scale must be a positive number, got {scale!r}")
    gen, n = SUITE[name]
    prompts = gen(random.Random(seed), max(1, round(n * scale)))
    return [_request(i, p) for i, p in enumerate(prompts)]
