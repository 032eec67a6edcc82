"""A policy x capacity (x shared-tier capacity) sweep of cache-level replays, with the reference
lines, on several cores.

The runs are independent: each is one :func:`~kvoffload.simulate.cache_replay.replay_cache` (or one
:func:`~kvoffload.simulate.optimal.replay_belady`) over the same :class:`BlockTrace`. Belady's optimum
and the infinite cache are one-tier references (host memory alone), computed per host capacity. With ``jobs > 1``
they run in forked worker processes, which inherit the trace and its key lists from the parent
(nothing is pickled but the task and its totals), longest runs first.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import ReplayResult, replay_cache
from kvoffload.simulate.optimal import BeladyPlan, replay_belady, replay_infinite

logger = logging.getLogger(__name__)

__all__ = ["BELADY", "CacheSweep", "sweep_cache"]

BELADY = "belady"
_Task = tuple[str, int, int]  # (policy or BELADY, host capacity, tier capacity)
# the trace of the sweep under way, set before the workers fork (they read it, never write it)
_shared: dict[str, object] = {}


@dataclass
class CacheSweep:
    """Results of :func:`sweep_cache`: one :class:`ReplayResult` per (policy, tier capacity,
    capacity) in that order, Belady's per capacity, the infinite cache's, and the sweep's wall time."""

    runs: list[ReplayResult]
    belady: dict[int, ReplayResult]
    infinite: ReplayResult
    seconds: float


def _run(task: _Task) -> ReplayResult:
    name, capacity, tier_capacity = task
    trace = _shared["trace"]
    assert isinstance(trace, BlockTrace)
    if name == BELADY:
        plan = _shared.get("plan")
        if plan is None:
            plan = _shared["plan"] = BeladyPlan(trace)
        assert isinstance(plan, BeladyPlan)
        return replay_belady(plan, capacity)
    lists = _shared.get("lists")
    if lists is None:
        lists = _shared["lists"] = trace.key_lists()
    return replay_cache(trace, name, capacity, lists, tier_capacity)  # type: ignore[arg-type]


def _cost(task: _Task) -> float:
    """Rough relative cost, to start the long runs first (Belady and one-tier lru, which run without
    the manager, are the cheapest)."""
    name, capacity, tier_capacity = task
    weight = 0.2 if name == BELADY else 3.0 if name != "lru" else 1.0 if tier_capacity else 0.3
    return weight * (1 + capacity**0.1) * (1.5 if tier_capacity else 1)


def sweep_cache(
    trace: BlockTrace,
    policies: list[str],
    capacities: list[int],
    jobs: int = 2,
    progress: Callable[[int, int, ReplayResult, float, float], None] | None = None,
    tier_capacities: list[int] | None = None,
) -> CacheSweep:
    """Replay ``trace`` for every policy, capacity and shared-tier capacity (``tier_capacities``,
    blocks; default ``[0]``: host memory alone), plus Belady at every capacity and the infinite
    cache; ``jobs`` worker processes (1: in this process).

    ``progress(done, total, result, elapsed_s, remaining_s)`` is called as each run finishes;
    ``remaining_s`` is an estimate from the runs' relative costs.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"--jobs must be a positive int, got {jobs!r}")
    tiers = [0] if tier_capacities is None else tier_capacities
    if not tiers or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tiers):
        raise InvalidArgumentError(f"--tier-capacity must be non-negative block counts, got {tiers!r}")
    t0 = time.perf_counter()
    tasks = [(p, c, t) for p in policies for t in tiers for c in capacities] + [(BELADY, c, 0) for c in capacities]
    tasks.sort(key=_cost, reverse=True)
    _shared.clear()
    _shared["trace"] = trace
    if jobs > 1:
        if any(p != "lru" for p in policies) or any(tiers) or trace.has_repeats:  # runs through the manager
            _shared["lists"] = trace.key_lists()  # built once, inherited by the forked workers
        _shared["plan"] = BeladyPlan(trace)
    results: list[ReplayResult] = []
    try:
        if jobs == 1 or len(tasks) == 1:
            it = map(_run, tasks)
            results = _collect(it, tasks, t0, progress)
        else:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(jobs, len(tasks))) as pool:
                results = _collect(pool.imap_unordered(_run, tasks), tasks, t0, progress)
    finally:
        _shared.clear()
    infinite = replay_infinite(trace)
    runs = sorted(
        (r for r in results if r.policy != BELADY),
        key=lambda r: (policies.index(r.policy), tiers.index(r.tier_capacity), r.capacity),
    )
    belady = {r.capacity: r for r in results if r.policy == BELADY}
    return CacheSweep(runs, belady, infinite, time.perf_counter() - t0)


def _collect(
    it: object,
    tasks: list[_Task],
    t0: float,
    progress: Callable[[int, int, ReplayResult, float, float], None] | None,
) -> list[ReplayResult]:
    out: list[ReplayResult] = []
    total_cost = sum(_cost(t) for t in tasks)
    done_cost = 0.0
    for res in it:  # type: ignore[attr-defined]
        out.append(res)
        done_cost += _cost((res.policy, res.capacity, res.tier_capacity))
        if progress is not None:
            elapsed = time.perf_counter() - t0
            progress(len(out), len(tasks), res, elapsed, elapsed * (total_cost - done_cost) / done_cost)
    return out
