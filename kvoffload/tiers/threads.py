"""The tier's lookup thread, which gives way to the engine thread when it wakes up.

:class:`LookupThread` runs, in order, what the engine thread hands it: probe batches, calls of a
backend, and store/load batches it submits to the I/O threads (so the engine thread wakes one
thread per step at most and never starts a pool thread).

On a machine whose cores are all busy, a woken thread of the default
policy preempts the thread running on that core -- often the engine thread that just woke it, in
the middle of its step, which then waits for a core again. A ``SCHED_BATCH`` thread (Linux) is
never scheduled by preempting another on wake-up: it runs on an idle core at once, otherwise at
the next scheduler tick, with the same share of CPU time (same nice value). Elsewhere, or when
the policy cannot be set, nothing changes. (The I/O threads keep the default policy: they are
woken by the lookup thread, and delaying them would hold host slots pinned longer.)
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from kvoffload.tiers.step_probe import Probe
from kvoffload.tiers.workers import IOThreads

__all__ = ["as_background_thread", "LookupThread"]

#: Store/load batches for the I/O threads: their priority, the task function and its argument tuples.
Tasks = tuple[int, Callable[..., None], list[tuple[object, ...]]]

logger = logging.getLogger(__name__)


def as_background_thread() -> None:
    """Put the calling thread under ``SCHED_BATCH`` where the OS has it (best effort, never raises)."""
    policy = getattr(os, "SCHED_BATCH", None)
    setter = getattr(os, "sched_setscheduler", None)
    if policy is None or setter is None:
        return
    try:
        setter(0, policy, os.sched_param(0))  # 0: the calling thread
    except OSError as exc:  # e.g. forbidden by a seccomp profile: keep the default policy
        logger.debug("tier thread keeps the default scheduling policy: %s", exc)


class LookupThread:
    """A tier's lookup thread (named ``name``, under ``SCHED_BATCH``): answers each :class:`Probe`
    with ``answer``, runs each call, and submits each batch of tasks to ``pool``, in the order
    they were handed over; :meth:`stop` lets it finish them and joins it."""

    def __init__(self, name: str, pool: IOThreads, answer: Callable[[Probe], None]) -> None:
        self._q: queue.SimpleQueue[Probe | Tasks | Callable[[], None] | None] = queue.SimpleQueue()
        self._pool = pool
        self._answer = answer
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def probe(self, probe: Probe) -> None:
        """Answer ``probe`` (send it, or read its late reply)."""
        self._q.put(probe)

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (it must not raise)."""
        self._q.put(fn)

    def submit(self, tasks: Tasks) -> None:
        """Submit ``tasks`` (priority, function, argument tuples) to the I/O threads."""
        self._q.put(tasks)

    def stop(self) -> None:
        """Finish what was handed over, then end the thread."""
        self._q.put(None)
        self._thread.join()

    def _loop(self) -> None:
        as_background_thread()
        while (item := self._q.get()) is not None:
            if isinstance(item, Probe):
                self._answer(item)
            elif callable(item):
                item()
            else:
                priority, run, tasks = item
                for args in tasks:
                    self._pool.submit(priority, run, *args)
