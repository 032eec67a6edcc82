"""Alibaba Bailian request traces (the "KVCache in the wild" study, USENIX ATC 2025), read as they are.

One JSON object per line::

    {"chat_id": 12, "parent_chat_id": 7, "timestamp": 61.25, "input_length": 1187,
     "output_length": 311, "type": "text", "turn": 2, "hash_ids": [3, 4, 5, ..., 880]}

``timestamp`` is the arrival time in seconds (non-decreasing), ``chat_id`` the request's id,
``parent_chat_id`` the request whose conversation it continues (-1: none), ``type`` the request
type (``text``, ``file``, ``image``, ``search``, ...), ``turn`` its turn in the conversation (1 for
the first), ``hash_ids`` one prefix-block id per 16 tokens of the prompt (the last block may be
partial, so ``len(hash_ids) == ceil(input_length / 16)``): equal ids at the same position mean
equal prompts up to the end of that block, as in a Mooncake trace with 16-token blocks, and the
prompt is keyed the same way (:mod:`kvoffload.simulate.mooncake`). Each request carries the workload
tag ``"<type>/<turn>"`` (:attr:`BailianRequest.tag`), which the cache-level replay passes to the
manager as ``ReqContext.workload``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from kvoffload.engine.reference.workload import read_jsonl, write_jsonl
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.mooncake import MooncakeRequest, check_hash_ids

__all__ = [
    "BAILIAN_BLOCK_TOKENS",
    "BAILIAN_FIELDS",
    "BailianRequest",
    "generate_bailian_trace",
    "read_bailian_trace",
    "write_bailian_trace",
]

BAILIAN_BLOCK_TOKENS = 16
BAILIAN_FIELDS = (
    "chat_id",
    "parent_chat_id",
    "timestamp",
    "input_length",
    "output_length",
    "type",
    "turn",
    "hash_ids",
)


@dataclass(frozen=True)
class BailianRequest(MooncakeRequest):
    """One line of a Bailian trace (``timestamp`` converted to milliseconds, as Mooncake's)."""

    chat_id: int = 0
    parent_chat_id: int = -1
    type: str = ""
    turn: int = 1

    @property
    def tag(self) -> str:
        """The workload tag: ``"<type>/<turn>"``."""
        return f"{self.type}/{self.turn}"


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse(obj: object, where: str, last_ts: float, line: int) -> BailianRequest:
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(BAILIAN_FIELDS))
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown field {unknown[0]!r} (Bailian fields: {', '.join(BAILIAN_FIELDS)})"
        )
    missing = [f for f in BAILIAN_FIELDS if f not in obj]
    if missing:
        raise InvalidArgumentError(f"{where}: missing field {missing[0]!r}")
    chat, parent, ts = obj["chat_id"], obj["parent_chat_id"], obj["timestamp"]
    if not _int(chat) or chat < 0:
        raise InvalidArgumentError(f"{where}: field 'chat_id' must be a non-negative int, got {chat!r}")
    if not _int(parent) or parent < -1:
        raise InvalidArgumentError(f"{where}: field 'parent_chat_id' must be an int >= -1 (-1: none), got {parent!r}")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not ts >= 0:
        raise InvalidArgumentError(f"{where}: field 'timestamp' must be a non-negative number (s), got {ts!r}")
    if ts * 1000 < last_ts:
        raise InvalidArgumentError(f"{where}: field 'timestamp' {ts} is before the previous line's (arrival order)")
    n_in, n_out = obj["input_length"], obj["output_length"]
    if not _int(n_in) or n_in < 1:
        raise InvalidArgumentError(f"{where}: field 'input_length' must be a positive int, got {n_in!r}")
    if not _int(n_out) or n_out < 0:
        raise InvalidArgumentError(f"{where}: field 'output_length' must be a non-negative int, got {n_out!r}")
    kind, turn = obj["type"], obj["turn"]
    if not isinstance(kind, str) or not kind:
        raise InvalidArgumentError(f"{where}: field 'type' must be a non-empty str, got {kind!r}")
    if not _int(turn) or turn < 1:
        raise InvalidArgumentError(f"{where}: field 'turn' must be a positive int, got {turn!r}")
    ids = check_hash_ids(obj["hash_ids"], n_in, BAILIAN_BLOCK_TOKENS, where, "field 'hash_ids'")
    return BailianRequest(float(ts) * 1000, n_in, n_out, tuple(ids), line, chat, parent, kind, turn)


def read_bailian_trace(path: str | Path) -> list[BailianRequest]:
    """Read and check a whole Bailian trace (format in the module docstring).

    Raises:
        InvalidArgumentError: the file cannot be read, holds no request, or its first bad line
            (``FILE:LINE:`` and the field): not JSON, an unknown or missing field, a bad value, a
            repeated hash id, a timestamp earlier than the line before, or a ``hash_ids`` count
            that does not match ``input_length``.
    """
    p = Path(path)
    out: list[BailianRequest] = []
    last_ts = 0.0
    for lineno, obj in read_jsonl(p):
        req = _parse(obj, f"{p}:{lineno}", last_ts, lineno)
        last_ts = req.timestamp
        out.append(req)
    if not out:
        raise InvalidArgumentError(f"trace {p} holds no request")
    return out


def write_bailian_trace(path: str | Path, requests: list[BailianRequest]) -> None:
    """Write ``requests`` as a Bailian trace (one JSON object per line, the fields in order)."""
    write_jsonl(
        path,
        (
            {
                "chat_id": r.chat_id,
                "parent_chat_id": r.parent_chat_id,
                "timestamp": r.timestamp / 1000,
                "input_length": r.input_length,
                "output_length": r.output_length,
                "type": r.type,
                "turn": r.turn,
                "hash_ids": list(r.hash_ids),
            }
            for r in requests
        ),
    )


#: per request type of :func:`generate_bailian_trace`: (share of new conversations, turns (min,
#: max), document units at turn 1 (min, max), units added per later turn (min, max), gap to the
#: next turn in requests (min, max))
_TYPES = {
    "text": (0.35, (2, 10), (1, 2), (1, 2), (20, 1500)),
    "file": (0.15, (2, 4), (4, 12), (1, 1), (10, 300)),
    "image": (0.25, (2, 2), (2, 4), (1, 1), (0, 600)),
    "search": (0.25, (1, 1), (1, 6), (0, 0), (0, 0)),
}
_UNIT_IDS = 32  # 16-token hash ids per 512-token unit


def generate_bailian_trace(n: int, seed: int = 0) -> list[BailianRequest]:
    """A synthetic trace in the Bailian format whose request types reuse differently (``n``
    requests, eight per second, deterministic in ``seed``; sizes in 512-token units):

    * ``text``: chats of 2-10 turns, each turn its previous prompt plus 1-2 units, 20-1500
      requests later (reused again until the last turn);
    * ``file``: a 4-12 unit document asked about 2-4 times, 10-300 requests apart;
    * ``image``: exactly two turns, the second 0-600 requests after the first ("seen before" then
      means "done");
    * ``search``: one of 8 one-unit tool prompts ahead of 1-6 units of one-shot results.
    """
    rng = random.Random(seed)
    nxt = iter(range(1, 1 << 62))
    tools = [[next(nxt) for _ in range(_UNIT_IDS)] for _ in range(8)]
    kinds = list(_TYPES)
    weights = [t[0] for t in _TYPES.values()]
    due: dict[int, tuple[str, list[int], int, int, int]] = {}  # request -> (type, ids, turn, turns, parent)
    out: list[BailianRequest] = []
    while len(out) < n:
        r = len(out)
        if r in due:
            kind, ids, turn, turns, parent = due.pop(r)
        else:
            kind = rng.choices(kinds, weights)[0]
            _, (t0, t1), (u0, u1), _, _ = _TYPES[kind]
            head = rng.choice(tools) if kind == "search" else []
            ids, turn, turns, parent = head, 0, rng.randint(t0, t1), -1
            ids = ids + [next(nxt) for _ in range(rng.randint(u0, u1) * _UNIT_IDS)]
        if turn:
            _, _, _, (a0, a1), _ = _TYPES[kind]
            ids = ids + [next(nxt) for _ in range(rng.randint(a0, a1) * _UNIT_IDS)]
        turn += 1
        out.append(BailianRequest(r * 125.0, len(ids) * 16, 256, tuple(ids), r + 1, r, parent, kind, turn))
        if turn < turns:
            g0, g1 = _TYPES[kind][4]
            at = r + 1 + rng.randint(g0, g1)
            while at in due:
                at += 1
            due[at] = (kind, ids, turn, turns, r)
    return out
