"""How a fleet's router sends each request to one of ``N`` replicas (``kvoffload simulate --routing``).

* ``random``: a replica drawn uniformly (``numpy.random.default_rng(seed)``), request by request;
* ``round-robin``: request ``r`` (in arrival order) goes to replica ``r mod N``;
* ``least-loaded``: the replica with the least load (:class:`LoadModel`), ties to the lowest index;
* ``session``: a conversation sticks to the replica its first request went to; a new conversation
  goes to the least loaded replica (a trace that names conversations gives them:
  :func:`chat_conversations` follows a Bailian trace's ``chat_id`` / ``parent_chat_id``; otherwise
  :func:`conversation_ids` finds them in the prompts' prefixes, e.g. Mooncake's ``hash_ids``);
* ``kv-aware``: the replica with the least prefill still to compute plus queued work
  (:mod:`kvoffload.simulate.kv_router`), the KV-aware router real fleets use;
* ``prefix``: the degenerate case of ``kv-aware`` without its load term: the replica whose host
  pool holds the longest leading run of the request's blocks, ties to the least loaded. Prompts
  that all start with one shared block (a system prompt) all go where the first one went.
  ``kv-aware`` and ``prefix`` read the caches, so their replicas replay together in arrival order.

**The load model** (``least-loaded`` and the ties of ``session`` and ``prefix``): a replica's load
is the prompt tokens routed to it whose arrival lies within the last ``window_s`` seconds of trace
time (default :data:`LOAD_WINDOW_S`), the request being routed excluded: the prefill work it was
handed recently, independent of what its cache will save.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from kvoffload.errors import InvalidArgumentError

__all__ = [
    "LOAD_WINDOW_S",
    "PREFIX",
    "ROUTINGS",
    "LoadModel",
    "chat_conversations",
    "check_routings",
    "conversation_ids",
    "static_routes",
]

ROUTINGS = ("random", "round-robin", "least-loaded", "session", "kv-aware", "prefix")
#: the routing that reads the host pools alone (longest cached run)
PREFIX = "prefix"
#: default sliding window of the load model, seconds of trace time
LOAD_WINDOW_S = 60.0


def check_routings(routings: Sequence[str]) -> list[str]:
    """``routings``, each one of :data:`ROUTINGS`, each once; InvalidArgumentError otherwise."""
    out = list(routings)
    if not out:
        raise InvalidArgumentError(f"--routing must name at least one of {', '.join(ROUTINGS)}")
    for i, r in enumerate(out):
        if r not in ROUTINGS:
            raise InvalidArgumentError(f"--routing: unknown routing {r!r}, expected one of {', '.join(ROUTINGS)}")
        if r in out[:i]:
            raise InvalidArgumentError(f"--routing names {r!r} twice; give each routing once")
    return out


class LoadModel:
    """Prompt tokens routed to each of ``replicas`` replicas over a sliding window of trace time
    (module docstring)."""

    def __init__(self, replicas: int, window_s: float = LOAD_WINDOW_S) -> None:
        if window_s <= 0:
            raise InvalidArgumentError(f"--load-window must be positive seconds, got {window_s!r}")
        self.window_s = float(window_s)
        self.load = [0] * replicas
        self._recent: deque[tuple[float, int, int]] = deque()  # (arrival, replica, tokens), oldest first

    def advance(self, now_s: float) -> None:
        """Forget what arrived ``window_s`` or more before ``now_s``."""
        recent, load, horizon = self._recent, self.load, now_s - self.window_s
        while recent and recent[0][0] <= horizon:
            _, rep, tok = recent.popleft()
            load[rep] -= tok

    def least(self, among: Sequence[int] | None = None) -> int:
        """The least loaded replica (of ``among``, default all), ties to the lowest index."""
        load = self.load
        if among is None:
            return min(range(len(load)), key=load.__getitem__)
        return min(among, key=lambda i: (load[i], i))

    def add(self, now_s: float, replica: int, tokens: int) -> None:
        self._recent.append((now_s, replica, tokens))
        self.load[replica] += tokens


def conversation_ids(prefixes: Sequence[Sequence[int]]) -> np.ndarray:
    """A conversation id per request from its prompt's prefix ids alone.

    ``prefixes[r]`` are request ``r``'s prefix-block ids, head first, where equal ids at a depth
    mean equal prompts up to the end of that block (Mooncake ``hash_ids`` of full trace blocks,
    or offloaded-block ids). A request continues the conversation of the latest earlier request
    whose whole list is a prefix of its own (the longest such list wins) and whose last block
    that request was the first to hold: a turn extends the turn before it, while a list made of
    blocks seen before (a bare shared system prompt) does not start anything others continue.
    Otherwise it starts a conversation. Returns ``int64[R]``, conversations numbered in order of
    their first request.
    """
    ends: dict[int, int] = {}  # the new last id of an earlier request's list -> its conversation
    seen: set[int] = set()
    out = np.zeros(len(prefixes), dtype=np.int64)
    count = 0
    for r, ids in enumerate(prefixes):
        conv = -1
        for d in range(len(ids) - 1, -1, -1):
            conv = ends.get(ids[d], -1)
            if conv >= 0:
                break
        if conv < 0:
            conv = count
            count += 1
        out[r] = conv
        if len(ids) and ids[-1] not in seen:
            ends[ids[-1]] = conv
        seen.update(ids)
    return out


def chat_conversations(chat_ids: Sequence[int], parent_chat_ids: Sequence[int]) -> np.ndarray:
    """A conversation id per request from the ids a trace gives (Bailian's ``chat_id`` and
    ``parent_chat_id``, -1: none), in arrival order.

    A request with a parent continues the parent's conversation; requests whose parent is not in
    the trace (before its start) continue one conversation per such parent; a request without a
    parent starts a conversation. Returns ``int64[R]``, conversations numbered in order of their
    first request.
    """
    if len(chat_ids) != len(parent_chat_ids):
        raise InvalidArgumentError(
            f"parent_chat_ids must have one id per request ({len(chat_ids)}), got {len(parent_chat_ids)}"
        )
    conv_of: dict[int, int] = {}  # chat id (a request's, or an absent parent's) -> its conversation
    out = np.zeros(len(chat_ids), dtype=np.int64)
    count = 0
    for r, (chat, parent) in enumerate(zip(chat_ids, parent_chat_ids, strict=True)):
        conv = conv_of.get(parent, -1) if parent >= 0 else -1
        if conv < 0:
            conv = count
            count += 1
            if parent >= 0:
                conv_of[parent] = conv
        conv_of[chat] = conv
        out[r] = conv
    return out


def static_routes(
    routing: str,
    replicas: int,
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    conversations: np.ndarray,
    seed: int = 0,
    window_s: float = LOAD_WINDOW_S,
) -> np.ndarray:
    """The replica of every request (``int64[R]``) for a routing that does not read the caches
    (every routing but ``kv-aware`` and ``prefix``)."""
    n = len(arrival_s)
    if routing == "random":
        return np.random.default_rng(seed).integers(0, replicas, n).astype(np.int64)
    if routing == "round-robin":
        return np.arange(n, dtype=np.int64) % replicas
    if routing not in ("least-loaded", "session"):
        raise InvalidArgumentError(f"routing {routing!r} reads the caches or is unknown: no static routes")
    load = LoadModel(replicas, window_s)
    owner: dict[int, int] = {}
    out = np.zeros(n, dtype=np.int64)
    times, tokens, convs = arrival_s.tolist(), prompt_tokens.tolist(), conversations.tolist()
    for r in range(n):
        load.advance(times[r])
        if routing == "session":
            rep = owner.get(convs[r], -1)
            if rep < 0:
                rep = owner[convs[r]] = load.least()
        else:
            rep = load.least()
        load.add(times[r], rep, tokens[r])
        out[r] = rep
    return out
