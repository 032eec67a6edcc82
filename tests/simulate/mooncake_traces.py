"""Small random traces in the Mooncake format, for the cache-level replay tests."""

from __future__ import annotations

import random
from pathlib import Path

from kvoffload.engine.reference.workload import write_jsonl

__all__ = ["random_mooncake", "system_prompt_headed", "write_mooncake"]


def random_mooncake(
    n: int, seed: int, block_tokens: int = 64, max_blocks: int = 10, max_output: int = 0
) -> list[dict[str, object]]:
    """``n`` requests as Mooncake lines: each either continues an earlier request's prefix (a
    conversation's next turn, or a shared system prompt) with new blocks, or starts afresh;
    lengths make the last block partial most of the time."""
    rnd = random.Random(seed)
    out: list[dict[str, object]] = []
    next_id = 0
    ts = 0
    for _ in range(n):
        if out and rnd.random() < 0.75:
            parent = rnd.choice(out[-20:])
            pids = list(parent["hash_ids"])  # type: ignore[arg-type]
            full = int(parent["input_length"]) // block_tokens  # type: ignore[arg-type]
            keep = rnd.randint(0, full)
            ids = pids[:keep]
        else:
            ids = []
        extra = rnd.randint(1 if not ids else 0, max_blocks - len(ids)) if len(ids) < max_blocks else 0
        ids += list(range(next_id, next_id + max(extra, 0)))
        next_id += max(extra, 0)
        if not ids:
            ids = [next_id]
            next_id += 1
        tail = rnd.randint(1, block_tokens)  # tokens in the last block (block_tokens: full)
        ts += rnd.randint(0, 50)
        out.append(
            {
                "timestamp": ts,
                "input_length": (len(ids) - 1) * block_tokens + tail,
                "output_length": rnd.randint(0, max_output),
                "hash_ids": ids,
            }
        )
    return out


#: The hash id of the system-prompt block of :func:`system_prompt_headed` (no random line uses it).
SYSTEM_BLOCK = 10**6


def system_prompt_headed(
    n: int, seed: int, max_blocks: int, gap_ms: int, block_tokens: int = 64
) -> list[dict[str, object]]:
    """:func:`random_mooncake` lines, each headed by one shared system-prompt block
    (:data:`SYSTEM_BLOCK`, ``block_tokens`` more input tokens), ``gap_ms`` apart."""
    lines = random_mooncake(n, seed, block_tokens, max_blocks=max_blocks)
    for i, line in enumerate(lines):
        line["hash_ids"] = [SYSTEM_BLOCK, *line["hash_ids"]]  # type: ignore[list-item]
        line["input_length"] = int(line["input_length"]) + block_tokens  # type: ignore[call-overload]
        line["timestamp"] = i * gap_ms
    return lines


def write_mooncake(path: Path, lines: list[dict[str, object]]) -> Path:
    """Write ``lines`` to ``path`` as a Mooncake JSONL trace; returns ``path``."""
    write_jsonl(path, lines)
    return path
