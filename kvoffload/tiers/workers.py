"""The tier's I/O threads: a fixed set of threads taking tasks by priority, loads before stores.

A promotion (a tier -> host load) holds a deferred request; a write-through store holds only host
slots pinned for it. With one first-in first-out queue a promotion waits behind every write
queued before it; here a queued load batch is taken before any queued store batch (batches
already running finish first), and tasks of one priority keep their order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["IOThreads", "LOAD", "STORE"]

logger = logging.getLogger(__name__)

#: Priorities of :meth:`IOThreads.submit` (smaller first).
LOAD = 0
STORE = 1
_STOP = 2


class IOThreads:
    """``n`` daemon threads named ``{name}_{i}`` running submitted tasks, smallest priority first.

    Args:
        n: threads.
        name: thread-name prefix.
    """

    def __init__(self, n: int, name: str) -> None:
        self._q: queue.PriorityQueue[tuple[int, int, Callable[..., None] | None, tuple[Any, ...]]] = (
            queue.PriorityQueue()
        )
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, priority: int, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on a thread (any thread; never blocks)."""
        self._q.put((priority, next(self._seq), fn, args))

    def _run(self) -> None:
        while True:
            _, _, fn, args = self._q.get()
            if fn is None:
                return
            try:
                fn(*args)
            except Exception:  # the task's own errors are counted by it; a bug must not kill the thread
                logger.exception("tier I/O task failed")

    def shutdown(self) -> None:
        """Run what is queued, then stop the threads (waits for them)."""
        for _ in self._threads:
            self._q.put((_STOP, next(self._seq), None, ()))
        for t in self._threads:
            t.join()
