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
prompt is keyed the same way (:mod:`kvoffload.sim.mooncake`). Each request carries the workload
tag ``"<type>/<turn>"`` (:attr:`BailianRequest.tag`), which the cache-level replay passes to the
manager as ``ReqContext.workload``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvoffload.errors import InvalidArgumentError
from kvoffload.sim.mooncake import MooncakeRequest, check_hash_ids
from kvoffload.sim.workload import read_jsonl

__all__ = ["BAILIAN_BLOCK_TOKENS", "BAILIAN_FIELDS", "BailianRequest", "read_bailian_trace"]

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
