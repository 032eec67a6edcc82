"""Feeding a workload to the reference engine: admission in arrival order, conversations turn by turn."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from kvoffload.engine.reference.engine import Engine

__all__ = ["Progress", "drive"]


class Progress(Protocol):
    """What :func:`drive` reports to (the demo's progress bar)."""

    def update(self, done: int, extra: str) -> None:
        """``done`` requests finished; ``extra``: a short status text."""


def drive(engine: Engine, items: Sequence[Any], max_concurrent: int, progress: Progress | None = None) -> None:
    """Feed ``items`` to ``engine`` in arrival order and step until all finished.

    At most ``max_concurrent`` requests are in the engine at once. Items with ``conversation``
    and ``turn`` attributes (chat turns) are admitted only after the same conversation's previous
    turn finished; others (trace requests) in plain arrival order. ``progress`` hears, after each
    step that finished requests, how many have finished and the tokens loaded so far.
    """
    pending: deque[Any] = deque(items)
    finished_turn: dict[int, int] = {}
    in_engine: dict[str, Any] = {}
    done = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(len(pending)):
            if len(in_engine) >= max_concurrent:
                break
            item = pending.popleft()
            conv = getattr(item, "conversation", None)
            if conv is None or finished_turn.get(conv, -1) == item.turn - 1:
                engine.add_request(item)
                in_engine[item.request_id] = item
            else:
                pending.append(item)
        step = engine.step()
        for rid in step.finished:
            item = in_engine.pop(rid)
            if getattr(item, "conversation", None) is not None:
                finished_turn[item.conversation] = item.turn
            done += 1
        if step.finished and progress is not None:
            s = engine.stats
            progress.update(done, f"{s.loaded_tokens:,} tokens loaded from the CPU tier")
    engine.run_until_done()  # drain in-flight stores
