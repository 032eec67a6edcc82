"""Reachability of a tier's store: exponential back-off after failures, one log line per outage,
and the check when an engine starts (:func:`check_at_start`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kvoffload.errors import InvalidArgumentError

__all__ = ["TierUnavailable", "Health", "ON_UNAVAILABLE", "check_on_unavailable", "check_at_start"]

logger = logging.getLogger(__name__)


class TierUnavailable(Exception):
    """Raised by a backend when its store cannot be reached (refused, reset, timed out).

    Internal to :mod:`kvoffload.tiers`: the tier turns it into misses, dropped writes and failed
    loads, and backs off; it reaches the engine only from :meth:`Tier.check_store`, the check at
    start (see :func:`check_at_start`).
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


#: what a tier whose store does not answer at start does: start and serve degraded (lookups miss,
#: writes drop, until the store answers), or refuse to start
ON_UNAVAILABLE = ("start_degraded", "fail")


def check_on_unavailable(on_unavailable: object, where: str = "on_unavailable") -> None:
    """Raise :class:`InvalidArgumentError` naming ``where`` unless ``on_unavailable`` is one of
    :data:`ON_UNAVAILABLE`."""
    if on_unavailable not in ON_UNAVAILABLE:
        raise InvalidArgumentError(f"{where} must be one of {list(ON_UNAVAILABLE)}, got {on_unavailable!r}")


def check_at_start(tier: Any, on_unavailable: str = "start_degraded") -> None:
    """``tier.check_store()`` when an engine starts: a configuration error is raised (the tier
    closed first); a store that does not answer is raised too with ``on_unavailable="fail"``,
    else logged once and the tier starts degraded (it reconnects with back-off by itself).

    The default starts: an engine should not depend on the order its stores come up in, and a
    store that is down later is served the same way.

    Raises:
        InvalidArgumentError: a configuration error, an unknown ``on_unavailable``, or (``fail``)
            a store that does not answer.
    """
    check_on_unavailable(on_unavailable)
    try:
        tier.check_store()
        return
    except TierUnavailable as exc:
        down = str(exc)  # only the text leaves the handler: its frames reference the tier
    except BaseException:
        tier.close()
        raise
    if on_unavailable == "fail":
        tier.close()
        raise InvalidArgumentError(f"{down} (does not answer at start; on_unavailable is 'fail')")
    logger.warning(
        "%s (does not answer at start): starting degraded, lookups miss and writes drop until it answers; "
        "on_unavailable='fail' refuses to start instead",
        down,
    )
