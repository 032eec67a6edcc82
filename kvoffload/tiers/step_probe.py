"""A tier's lookups on the engine thread: verdicts, the step's probe batch, and the wait for it.

:class:`StepProbe` answers :meth:`Tier.lookup <kvoffload.tiers.base.Tier.lookup>` from the verdicts
known, sends each step's queued keys as one probe batch (:meth:`StepProbe.end_step`) or a
lookup's own keys at once (:meth:`StepProbe.probe_now`), probing on the engine thread when the
backend can (its ``probe_now``) and through the tier's lookup thread otherwise, applies the
answers, and waits for them up to ``probe_wait`` while a request was deferred on a key not
probed yet.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from kvoffload.core.lookup_code import LOOKUP_RETRY
from kvoffload.tiers.counters import TierCounters
from kvoffload.tiers.health import Health
from kvoffload.tiers.verdicts import Verdicts

__all__ = ["Probe", "StepProbe"]


class Probe(NamedTuple):
    """A probe batch for the lookup thread: ``run()`` answers it; ``fresh``: not sent yet (a tier
    in back-off answers it with misses instead)."""

    keys: list[bytes]
    run: Callable[[], list[bool]]
    fresh: bool = False


#: A probe on the engine thread: the answers, a reader of a late reply, or None (not sent).
ProbeNow = Callable[[list[bytes], float], "list[bool] | Callable[[], list[bool]] | None"]


class StepProbe:
    """The engine thread's side of a tier's lookups.

    Args:
        verdicts: the tier's lookup verdicts.
        health: the tier's health (in back-off, keys without a verdict miss and nothing waits).
        probe_wait: seconds the engine thread may wait for a probe's answers.
        counters: the tier's counters (probes answered here are counted there).
        probe: the backend's probe of a batch (called by the lookup thread).
        probe_now: the backend's probe on the engine thread, waiting up to the given seconds
            (:meth:`Tier._probe_now <kvoffload.tiers.base.Tier._probe_now>`).
        hand: hands a :class:`Probe` to the lookup thread.
    """

    def __init__(
        self,
        verdicts: Verdicts,
        health: Health,
        probe_wait: float,
        counters: TierCounters,
        probe: Callable[[list[bytes]], list[bool]],
        probe_now: ProbeNow,
        hand: Callable[[Probe], None],
    ) -> None:
        self.verdicts = verdicts
        self._health = health
        self.probe_wait = probe_wait
        self._counters = counters
        self._probe = probe
        self._probe_now = probe_now
        self._hand = hand
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

    def end_step(self) -> None:
        """Send the step's queued keys as one probe batch (see :meth:`Tier.end_step
        <kvoffload.tiers.base.Tier.end_step>`), and wait for answers as :meth:`take_batch` says."""
        batch, wait = self.take_batch()
        if batch and self._settle(batch, self._probe_now(batch, wait) if wait > 0 else None):
            return  # answered, or this step's wait is spent on a late reply
        self.wait(wait)

    def probe_now(self, keys: list[bytes]) -> np.ndarray:
        """:meth:`lookup`, with the keys it queues probed at once on the engine thread when the
        backend can (see :meth:`Tier.probe_now <kvoffload.tiers.base.Tier.probe_now>`)."""
        codes = self.lookup(keys)
        wait = self.probe_wait
        if wait <= 0 or not (codes == LOOKUP_RETRY).any() or self._health.is_down():
            return codes
        batch = self.verdicts.queued(keys)
        now = self._probe_now(batch, wait) if batch else None
        if now is None:
            return codes  # nothing sent: the keys go with the step's batch
        self.verdicts.sending(batch)
        self._settle(batch, now)
        return self.lookup(keys)

    def _settle(self, batch: list[bytes], now: list[bool] | Callable[[], list[bool]] | None) -> bool:
        """A probe of ``batch`` (its keys in flight) from the backend's ``probe_now`` outcome
        ``now``: answers applied (True); a late reply handed to the lookup thread (True); None:
        the lookup thread probes the batch (False). Answers come back by :meth:`answered`."""
        if isinstance(now, list):
            self._health.succeeded()
            self._counters.probe(batch, now)
            self.verdicts.probed(batch, now)
            return True
        self._unanswered += 1
        self._hand(Probe(batch, now) if now is not None else Probe(batch, partial(self._probe, batch), True))
        return now is not None

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
