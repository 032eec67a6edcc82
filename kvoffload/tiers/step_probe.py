"""A tier's lookups on the engine thread: verdicts, the step's probe batch, and the wait for it.

:class:`StepProbe` answers :meth:`Tier.lookup <kvoffload.tiers.base.Tier.lookup>` from the verdicts
known, takes each step's queued keys for one probe batch, applies the answers the lookup thread
sends back, and waits for them up to ``probe_wait`` while a request was deferred on a key not
probed yet. Which backend call probes the batch stays the tier's (:meth:`Tier.end_step
<kvoffload.tiers.base.Tier.end_step>`).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvoffload.tiers.health import Health
from kvoffload.tiers.verdicts import Verdicts

__all__ = ["Probe", "StepProbe"]


class Probe(NamedTuple):
    """A probe batch for the lookup thread: ``run()`` answers it; ``fresh``: not sent yet (a tier
    in back-off answers it with misses instead)."""

    keys: list[bytes]
    run: Callable[[], list[bool]]
    fresh: bool = False


class StepProbe:
    """The engine thread's side of a tier's lookups.

    Args:
        verdicts: the tier's lookup verdicts.
        health: the tier's health (in back-off, keys without a verdict miss and nothing waits).
        probe_wait: seconds :meth:`wait` may wait for answers while a deferred key is unprobed.
    """

    def __init__(self, verdicts: Verdicts, health: Health, probe_wait: float) -> None:
        self.verdicts = verdicts
        self._health = health
        self.probe_wait = probe_wait
        self._unanswered = 0  # probe batches sent and not applied yet
        self._done: queue.SimpleQueue[tuple[list[bytes], list[bool] | None]] = queue.SimpleQueue()

    def lookup(self, keys: list[bytes]) -> np.ndarray:
        """Per key HIT / MISS / RETRY from the verdicts known (see :meth:`Verdicts.answer`)."""
        self._apply()
        return self.verdicts.answer(keys, self._health.is_down())

    def take_batch(self) -> tuple[list[bytes], float]:
        """The step's queued keys, and how long the step may wait for their answers: ``probe_wait``
        while a key a lookup answered RETRY is unprobed and the store is not in back-off, else 0."""
        self._apply()
        deferred = self.verdicts.deferred
        batch = self.verdicts.take_batch()
        return batch, self.probe_wait if deferred and not self._health.is_down() else 0.0

    def sent(self) -> None:
        """A batch went to the lookup thread; its answers come back by :meth:`answered`."""
        self._unanswered += 1

    def answered(self, keys: list[bytes], found: list[bool] | None) -> None:
        """The lookup thread: the answers to a batch (None: not probed, the keys stay unknown)."""
        self._done.put((keys, found))

    def wait(self, wait: float) -> None:
        """Apply answers as they come for up to ``wait`` seconds, while a sent batch is unanswered."""
        if not self._unanswered or wait <= 0:
            return
        deadline = time.monotonic() + wait  # this step's probe, or a late one of earlier steps
        while self._unanswered and (left := deadline - time.monotonic()) > 0:
            try:
                done = self._done.get(timeout=left)
            except queue.Empty:
                return
            self._unanswered -= 1
            self.verdicts.probed(*done)

    def take_answered(self) -> list[bytes]:
        """The keys whose probe has returned since the last call (see :meth:`Verdicts.take_answered`)."""
        self._apply()
        return self.verdicts.take_answered()

    def _apply(self) -> None:
        done = self._done
        while not done.empty():  # the engine thread is the only consumer
            self._unanswered -= 1
            self.verdicts.probed(*done.get_nowait())
