"""Mooncake request traces (the FAST'25 release, ``FAST25-release/traces/*.jsonl``), read as they are.

One JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}

``timestamp`` is the arrival time in milliseconds (non-decreasing in the file), ``input_length``
and ``output_length`` the prompt and generated token counts, ``hash_ids`` one remapped prefix-block
hash per block of ``block_tokens`` tokens (512 in the release) covering the prompt: equal ids at
the same position mean equal prompts up to the end of that block. The last block of a prompt is
partial when ``input_length`` is not a multiple of ``block_tokens``; its id then names those
tokens only, so ``len(hash_ids) == ceil(input_length / block_tokens)``.

A trace block is cut into 16-token pieces; piece ``k`` of the block with id ``h`` gets the hash
:func:`piece_hash` ``(h, k)``. Because ``h`` commits to the whole prefix up to the end of its block,
two prompts share piece ``(h, k)`` exactly when they share their first tokens up to the end of that
piece, which is what the kvoffload engine's chained 16-token block hashes mean. An offloaded block
of ``B`` tokens (a multiple of 16) is then keyed by its last piece, as everywhere in kvoffload:
blocks larger than the offloaded block hold several offloaded blocks, offloaded blocks larger than
a trace block span several trace blocks (keyed by the last one's piece). Only full offloaded blocks
of a prompt are stored and looked up: a partial last trace block contributes the full offloaded
blocks it holds (``(input_length mod block_tokens) // B`` of them), the tokens after the prompt's
last full offloaded block are always computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.engine.reference.workload import read_jsonl
from kvoffload.errors import InvalidArgumentError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_FIELDS",
    "PIECE_TOKENS",
    "MooncakeRequest",
    "detect_trace_format",
    "piece_hash",
    "prompt_piece_ids",
    "read_mooncake_trace",
]

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in the FAST'25 release
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
PIECE_TOKENS = 16  # tokens per piece: the GPU block and hash block of the kvoffload engine
_FIELD_SET = frozenset(MOONCAKE_FIELDS)
_MAX_ID = 2**63 - 1


@dataclass(frozen=True)
class MooncakeRequest:
    """One line of a Mooncake trace; ``line`` is its line in the file (for messages)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int = 0


def piece_hash(piece_id: int) -> bytes:
    """The 16-token block hash of a piece id (:func:`prompt_piece_ids`): 8 bytes, big-endian."""
    return piece_id.to_bytes(8, "big")


def prompt_piece_ids(req: MooncakeRequest, block_tokens: int) -> list[int]:
    """Piece ids of the prompt's full 16-token pieces, in order: piece ``k`` of the trace block
    with id ``h`` is ``h * (block_tokens // 16) + k`` (distinct for distinct ``(h, k)``)."""
    per = block_tokens // PIECE_TOKENS
    n = req.input_length // PIECE_TOKENS
    ids = req.hash_ids
    return [ids[t // per] * per + t % per for t in range(n)]


def _nonneg_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ids_ok(ids: list[Any], block_tokens: int) -> bool:
    """Every id a non-negative int (not a bool) at most ``2**63 / block_tokens``: C-level passes."""
    return not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) <= _MAX_ID // block_tokens)


def check_hash_ids(ids: object, n_in: int, block_tokens: int, where: str, label: str, hint: str = "") -> list[int]:
    """``ids`` as a trace line's prefix-block ids: a list of distinct non-negative ints, one per
    ``block_tokens`` of the ``n_in``-token prompt (the last block may be partial); else an
    :class:`InvalidArgumentError` at ``where`` naming the field as ``label``."""
    if not isinstance(ids, list) or not _ids_ok(ids, block_tokens):
        raise InvalidArgumentError(f"{where}: {label} must be a list of non-negative ints (below 2**63 / block size)")
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError(f"{where}: {label} repeats an id (prefix-block hashes are distinct within a prompt)")
    need = -(-n_in // block_tokens)
    if len(ids) != need:
        raise InvalidArgumentError(
            f"{where}: {label} has {len(ids)} entries, input_length {n_in} needs {need} "
            f"(one per block of {block_tokens} tokens, the last one may be partial{hint})"
        )
    return ids


def _parse(obj: object, where: str, block_tokens: int, last_ts: float, line: int) -> MooncakeRequest:
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(obj.keys() - _FIELD_SET)
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown field {unknown[0]!r} (Mooncake fields: {', '.join(MOONCAKE_FIELDS)})"
        )
    for name in ("input_length", "hash_ids"):
        if name not in obj:
            raise InvalidArgumentError(f"{where}: missing field {name!r}")
    ts = obj.get("timestamp", last_ts)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise InvalidArgumentError(f"{where}: timestamp must be a non-negative number (ms), got {ts!r}")
    if ts < last_ts:
        raise InvalidArgumentError(f"{where}: timestamp {ts} is before the previous line's {last_ts} (arrival order)")
    n_in, n_out = obj["input_length"], obj.get("output_length", 0)
    if not _nonneg_int(n_in) or n_in < 1:
        raise InvalidArgumentError(f"{where}: input_length must be a positive int, got {n_in!r}")
    if not _nonneg_int(n_out):
        raise InvalidArgumentError(f"{where}: output_length must be a non-negative int, got {n_out!r}")
    ids = check_hash_ids(obj["hash_ids"], n_in, block_tokens, where, "hash_ids", "; see --trace-block-size")
    return MooncakeRequest(float(ts), n_in, n_out, tuple(ids), line)


def read_mooncake_trace(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[MooncakeRequest]:
    """Read and check a whole Mooncake trace (format in the module docstring).

    Raises:
        InvalidArgumentError: ``block_tokens`` is not a positive multiple of 16, the file cannot be
            read, holds no request, or the first bad line (``FILE:LINE:`` and the field): not JSON,
            an unknown field, a missing ``input_length``/``hash_ids``, a bad value, a repeated hash id, a timestamp
            earlier than the line before, or a ``hash_ids`` count that does not match ``input_length``.
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise InvalidArgumentError(f"--trace-block-size must be a positive int, got {block_tokens!r}")
    if block_tokens % PIECE_TOKENS:
        raise InvalidArgumentError(
            f"--trace-block-size must be a multiple of {PIECE_TOKENS} tokens, got {block_tokens}"
        )
    p = Path(path)
    out: list[MooncakeRequest] = []
    last_ts = 0.0
    for lineno, obj in read_jsonl(p):
        req = _parse(obj, f"{p}:{lineno}", block_tokens, last_ts, lineno)
        last_ts = req.timestamp
        out.append(req)
    if not out:
        raise InvalidArgumentError(f"trace {p} holds no request")
    return out


def detect_trace_format(path: str | Path) -> str:
    """``"bailian"`` when the first request line has a ``chat_id`` or ``parent_chat_id`` field (an
    Alibaba Bailian trace, :mod:`kvoffload.simulate.bailian`), ``"mooncake"`` when it has a ``hash_ids``
    or ``input_length`` field, else ``"kvoffload"`` (the engine's own JSONL format); a file that
    cannot be read is left to the reader."""
    try:
        with Path(path).open() as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    return "kvoffload"
                if isinstance(obj, dict) and ("chat_id" in obj or "parent_chat_id" in obj):
                    return "bailian"
                if isinstance(obj, dict) and ("hash_ids" in obj or "input_length" in obj):
                    return "mooncake"
                return "kvoffload"
    except (OSError, UnicodeDecodeError):
        pass
    return "kvoffload"
