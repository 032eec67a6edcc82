"""The tier's lookup thread gives way to the engine thread when it wakes up.

The engine thread wakes the tier's lookup thread at most once per step (a probe batch, jobs to
hand to the I/O threads). On a machine whose cores are all busy, a woken thread of the default
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

__all__ = ["as_background_thread"]

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
