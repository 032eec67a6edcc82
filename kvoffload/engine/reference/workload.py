"""Workloads for the demo and the simulator: multi-turn chat, and JSONL request traces.

A multi-turn chat workload has many conversations. Each starts with one of a few shared system
prompts; turn ``t`` of a conversation sends the whole history so far (system prompt, earlier user
messages and assistant replies) plus a new user message. Consecutive turns of a conversation
therefore share a growing prefix, and conversations share system prompts: exactly the reuse a CPU
tier of the KV cache is for. Turn ``t + 1`` of a conversation may only arrive after turn ``t``
finished; :meth:`ChatWorkload.turns` yields turns in an arrival order that respects this when the
caller admits them in order and waits for each conversation's previous turn.

Trace format (JSONL, one request per line, in arrival order)::

    {"token_ids": [1, 2, 3, ...]}                         # hashed into blocks by the reader
    {"block_hashes": ["9f2c...", "77ab..."], "num_tokens": 48}   # hex chained hashes, one per block

Optional fields: ``"request_id"`` (a string unique in the trace; default ``"r<line>"``),
``"max_tokens"`` (int, decode length, default 0). ``block_hashes`` holds one hash per full block
of 16 tokens (``num_tokens // 16`` of them). Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError

__all__ = ["ChatTurn", "ChatWorkload", "TraceRequest", "TRACE_FIELDS", "read_trace", "write_trace"]


@dataclass(frozen=True)
class ChatTurn:
    """One request of a chat workload.

    Attributes:
        request_id: unique id, ``"c{conversation}-t{turn}"``.
        conversation: conversation index.
        turn: turn index within the conversation (0-based).
        prompt_token_ids: the full prompt (history + new user message).
        max_tokens: tokens to decode.
    """

    request_id: str
    conversation: int
    turn: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass
class ChatWorkload:
    """A deterministic multi-turn chat workload.

    Args:
        conversations: number of conversations.
        turns: turns per conversation.
        system_prompts: number of distinct shared system prompts.
        system_tokens: length of each system prompt.
        user_tokens: (min, max) length of a user message.
        reply_tokens: (min, max) length of an assistant reply (= the turn's ``max_tokens``).
        vocab: token ids are drawn from ``[0, vocab)``.
        seed: everything is a function of the seed.
    """

    conversations: int = 24
    turns: int = 4
    system_prompts: int = 3
    system_tokens: int = 96
    user_tokens: tuple[int, int] = (24, 64)
    reply_tokens: tuple[int, int] = (8, 24)
    vocab: int = 32_000
    seed: int = 0
    _turns: list[ChatTurn] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "system_prompts", "system_tokens", "vocab"):
            check_int(getattr(self, name), name, 1)
        for name in ("user_tokens", "reply_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise InvalidArgumentError(f"{name} must be (min, max) with 1 <= min <= max, got {(lo, hi)}")
        self._turns = self._generate()

    def _generate(self) -> list[ChatTurn]:
        rng = random.Random(self.seed)
        systems = [[rng.randrange(self.vocab) for _ in range(self.system_tokens)] for _ in range(self.system_prompts)]
        histories = [list(systems[c % self.system_prompts]) for c in range(self.conversations)]
        # Arrival order: rounds of turns; within a round the conversations come shuffled, so a
        # conversation's next turn arrives after its previous one, with other traffic between.
        out: list[ChatTurn] = []
        for t in range(self.turns):
            order = list(range(self.conversations))
            rng.shuffle(order)
            for c in order:
                history = histories[c]
                history.extend(rng.randrange(self.vocab) for _ in range(rng.randint(*self.user_tokens)))
                reply = rng.randint(*self.reply_tokens)
                out.append(ChatTurn(f"c{c}-t{t}", c, t, tuple(history), reply))
                # The next turn's prompt carries this turn's reply (the engine's own decode output
                # is not fed back: its KV blocks are recomputed, as a chat front-end re-tokenises).
                history.extend(rng.randrange(self.vocab) for _ in range(reply))
        return out

    def turns_in_order(self) -> list[ChatTurn]:
        """All turns in arrival order."""
        return list(self._turns)

    def __iter__(self) -> Iterator[ChatTurn]:
        return iter(self._turns)

    def __len__(self) -> int:
        return len(self._turns)

    @property
    def prompt_tokens(self) -> int:
        """Total prompt tokens over all turns."""
        return sum(len(t.prompt_token_ids) for t in self._turns)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a JSONL trace: either token ids or precomputed block hashes.

    ``line`` is the request's line in the trace file (for messages).
    """

    request_id: str
    token_ids: tuple[int, ...] | None
    block_hashes: tuple[bytes, ...] | None
    num_tokens: int
    max_tokens: int = 0
    line: int = 0


TRACE_FIELDS = ("request_id", "token_ids", "block_hashes", "num_tokens", "max_tokens")


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_line(obj: object, lineno: int, path: Path, hash_block_size: int) -> TraceRequest:
    where = f"{path}:{lineno}"
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(TRACE_FIELDS))
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(TRACE_FIELDS)})")
    rid = obj.get("request_id", f"r{lineno}")
    if not isinstance(rid, str) or not rid:
        raise InvalidArgumentError(f"{where}: request_id must be a non-empty string, got {rid!r}")
    max_tokens = obj.get("max_tokens", 0)
    if not _non_negative_int(max_tokens):
        raise InvalidArgumentError(f"{where}: max_tokens must be a non-negative int, got {max_tokens!r}")
    if "token_ids" in obj and "block_hashes" in obj:
        raise InvalidArgumentError(f"{where}: give token_ids or block_hashes, not both")
    if "token_ids" in obj:
        ids = obj["token_ids"]
        if "num_tokens" in obj:
            raise InvalidArgumentError(f"{where}: num_tokens goes with block_hashes (token_ids count themselves)")
        if not isinstance(ids, list) or not all(_non_negative_int(t) for t in ids):
            raise InvalidArgumentError(f"{where}: token_ids must be a list of non-negative ints")
        if not ids:
            raise InvalidArgumentError(f"{where}: token_ids is empty")
        return TraceRequest(rid, tuple(ids), None, len(ids), max_tokens, lineno)
    if "block_hashes" in obj:
        hashes = obj["block_hashes"]
        num_tokens = obj.get("num_tokens")
        if not isinstance(hashes, list) or not all(isinstance(h, str) and h for h in hashes):
            raise InvalidArgumentError(f"{where}: block_hashes must be a list of hex strings")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise InvalidArgumentError(f"{where}: block_hashes needs num_tokens, a positive int, got {num_tokens!r}")
        if len(hashes) != num_tokens // hash_block_size:
            raise InvalidArgumentError(
                f"{where}: block_hashes has {len(hashes)} entries, num_tokens {num_tokens} needs "
                f"{num_tokens // hash_block_size} (one per full block of {hash_block_size} tokens)"
            )
        try:
            decoded = tuple(bytes.fromhex(h) for h in hashes)
        except ValueError as exc:
            raise InvalidArgumentError(f"{where}: block_hashes must be hex strings ({exc})") from None
        return TraceRequest(rid, None, decoded, num_tokens, max_tokens, lineno)
    raise InvalidArgumentError(f"{where}: each line needs token_ids or block_hashes")


def read_jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed JSON)`` of each request line of a JSONL trace (blank lines and
    ``#`` comments skipped); a file that cannot be read or a line that is not JSON is an
    :class:`InvalidArgumentError` naming the file (and line)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"trace {path} cannot be read: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, object]]) -> None:
    """Write ``rows`` to ``path`` as a JSONL trace (one compact JSON object per line, the fields
    in the order given), the format :func:`read_jsonl` reads."""
    with Path(path).open("w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_trace(path: str | Path, hash_block_size: int = 16) -> list[TraceRequest]:
    """Read a JSONL trace (format in the module docstring); ``block_hashes`` are per
    ``hash_block_size`` tokens.

    Every line is checked before anything runs: a line that is not JSON, an unknown or malformed
    field, empty ``token_ids``, both ``token_ids`` and ``block_hashes``, a ``block_hashes`` count
    that does not match ``num_tokens``, or a ``request_id`` used twice.

    Raises:
        InvalidArgumentError: the file cannot be read, or the first bad line (the message names
            the file and line, and the field as the trace spells it).
    """
    p = Path(path)
    out: list[TraceRequest] = []
    first_line: dict[str, int] = {}
    for lineno, obj in read_jsonl(p):
        req = _parse_line(obj, lineno, p, hash_block_size)
        if req.request_id in first_line:
            raise InvalidArgumentError(
                f"{p}:{lineno}: request_id {req.request_id!r} is already used on line {first_line[req.request_id]}"
            )
        first_line[req.request_id] = lineno
        out.append(req)
    if not out:
        raise InvalidArgumentError(f"trace {p} holds no request")
    return out


def write_trace(path: str | Path, turns: list[ChatTurn]) -> None:
    """Write chat turns as a JSONL trace with ``token_ids`` (readable by :func:`read_trace`)."""
    write_jsonl(
        path,
        (
            {"request_id": t.request_id, "token_ids": list(t.prompt_token_ids), "max_tokens": t.max_tokens}
            for t in turns
        ),
    )
