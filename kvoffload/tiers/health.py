"""Reachability of a tier's store: exponential back-off after failures, one log line per outage."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["TierUnavailable", "Health"]

logger = logging.getLogger(__name__)


class TierUnavailable(Exception):
    """Raised by a backend when its store cannot be reached (refused, reset, timed out).

    Internal to :mod:`kvoffload.tiers`: the tier turns it into misses, dropped writes and failed
    loads, and backs off; it never reaches the engine.
    """


class Health:
    """Tracks whether a tier is in back-off (thread-safe).

    After a failure the tier is *down* for ``initial`` seconds, doubling on each further failure
    up to ``maximum``; the first operation after the window ends tries the store again (the
    backend reconnects), and a success resets the delay.
    """

    def __init__(self, name: str, initial: float, maximum: float) -> None:
        self._name = name
        self._initial = initial
        self._maximum = maximum
        self._lock = threading.Lock()
        self._delay = 0.0
        self._until = 0.0
        self._outage_logged = False

    def is_down(self) -> bool:
        """True while the tier is in back-off."""
        return time.monotonic() < self._until

    def failed(self, exc: BaseException) -> None:
        """Record a failure to reach the store; starts or extends the back-off."""
        with self._lock:
            self._delay = self._initial if self._delay == 0.0 else min(self._delay * 2, self._maximum)
            self._until = time.monotonic() + self._delay
            first = not self._outage_logged
            self._outage_logged = True
        if first:
            logger.warning(
                "tier %s unreachable (%s): lookups miss, writes drop, loads fail; retrying with back-off",
                self._name,
                exc,
            )

    def succeeded(self) -> None:
        """Record a successful operation: clears the back-off."""
        if self._delay == 0.0:
            return
        with self._lock:
            recovered = self._outage_logged
            self._delay = 0.0
            self._until = 0.0
            self._outage_logged = False
        if recovered:
            logger.warning("tier %s reachable again", self._name)
