"""A routing x replicas x policy x host capacity x tier capacity sweep of fleet replays, on several cores.

A fleet without a shared tier whose routing does not read the caches splits into one
:func:`~kvoffload.simulate.fleet.replay_replica` task per replica (the replicas are independent); any
other fleet (a tier beneath all replicas, or ``prefix`` routing) is one
:func:`~kvoffload.simulate.fleet.replay_fleet` task, its replicas replayed together in arrival order.
With ``jobs > 1`` the tasks run in forked worker processes that inherit the trace, its key lists
and the routes from the parent (only the task and its result cross), longest tasks first.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.cache_replay import ReplayResult
from kvoffload.simulate.fleet import FleetResult, FleetTrace, fleet_of_parts, replay_fleet, replay_replica
from kvoffload.simulate.routing import LOAD_WINDOW_S

__all__ = ["FleetSpec", "sweep_fleet"]

# (routing, replicas, policy, host capacity, tier capacity, replica index or -1 for the joint replay)
_Task = tuple[str, int, str, int, int, int]
_shared: dict[str, object] = {}  # the sweep under way, set before the workers fork (read only there)


@dataclass(frozen=True)
class FleetSpec:
    """What to sweep: every combination of these (capacities in blocks per replica; tier
    capacities in blocks, 0: none), the random routing's ``seed`` and the load model's window."""

    routings: list[str]
    replicas: list[int]
    policies: list[str]
    capacities: list[int]
    tier_capacities: list[int]
    seed: int = 0
    window_s: float = LOAD_WINDOW_S

    def tasks(self) -> list[_Task]:
        out: list[_Task] = []
        for routing in self.routings:
            for n in self.replicas:
                for policy in self.policies:
                    for tier in self.tier_capacities:
                        for cap in self.capacities:
                            split = tier == 0 and routing != "prefix"
                            out.extend((routing, n, policy, cap, tier, i) for i in (range(n) if split else [-1]))
        return out


def _cost(task: _Task) -> float:
    routing, n, policy, cap, tier, part = task
    whole = (1.0 if policy == "lru" else 3.0) * (1.5 if tier else 1.0) * (1 + 0.1 * n if routing == "prefix" else 1)
    return whole / n if part >= 0 else whole


def _run(task: _Task) -> tuple[_Task, ReplayResult | FleetResult]:
    routing, n, policy, cap, tier, part = task
    ft, spec, lists = _shared["trace"], _shared["spec"], _shared["lists"]
    assert isinstance(ft, FleetTrace) and isinstance(spec, FleetSpec) and isinstance(lists, list)
    if part >= 0:
        routes = _shared[f"routes:{routing}:{n}"]
        assert isinstance(routes, np.ndarray)
        return task, replay_replica(ft.trace, routes, part, policy, cap, lists)
    return task, replay_fleet(ft, routing, n, policy, cap, tier, lists, spec.seed, spec.window_s)


def sweep_fleet(
    ft: FleetTrace,
    spec: FleetSpec,
    jobs: int = 1,
    progress: Callable[[int, int, FleetResult, float], None] | None = None,
) -> list[FleetResult]:
    """Every fleet of ``spec`` over ``ft`` on ``jobs`` processes (1: in this process), in the
    order of ``spec``'s lists (routing, replicas, policy, tier capacity, capacity).

    ``progress(done, total, result, elapsed_s)`` is called as each fleet is complete.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"--jobs must be a positive int, got {jobs!r}")
    if not spec.replicas or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in spec.replicas):
        raise InvalidArgumentError(f"--replicas must be positive ints, got {spec.replicas!r}")
    t0 = time.perf_counter()
    tasks = sorted(spec.tasks(), key=_cost, reverse=True)
    _shared.clear()
    _shared.update(trace=ft, spec=spec, lists=ft.trace.key_lists())
    for routing, n, *_ in tasks:
        if routing != "prefix" and f"routes:{routing}:{n}" not in _shared:
            _shared[f"routes:{routing}:{n}"] = ft.routes(routing, n, spec.seed, spec.window_s)
    fleets: dict[tuple[str, int, str, int, int], FleetResult] = {}
    parts: dict[tuple[str, int, str, int, int], dict[int, ReplayResult]] = {}
    total = len({t[:5] for t in tasks})
    try:
        if jobs == 1 or len(tasks) == 1:
            done: Iterator[tuple[_Task, ReplayResult | FleetResult]] = map(_run, tasks)
            _collect(done, ft, fleets, parts, total, t0, progress)
        else:
            with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
                _collect(pool.imap_unordered(_run, tasks), ft, fleets, parts, total, t0, progress)
    finally:
        _shared.clear()
    return [fleets[t[:5]] for t in spec.tasks() if t[5] <= 0]


def _collect(
    done: Iterator[tuple[_Task, ReplayResult | FleetResult]],
    ft: FleetTrace,
    fleets: dict[tuple[str, int, str, int, int], FleetResult],
    parts: dict[tuple[str, int, str, int, int], dict[int, ReplayResult]],
    total: int,
    t0: float,
    progress: Callable[[int, int, FleetResult, float], None] | None,
) -> None:
    for task, res in done:
        key, part = task[:5], task[5]
        if isinstance(res, FleetResult):
            fleets[key] = res
        else:
            got = parts.setdefault(key, {})
            got[part] = res
            routing, n, policy, cap, _ = key
            if len(got) < n:
                continue
            routes = _shared[f"routes:{routing}:{n}"]
            assert isinstance(routes, np.ndarray)
            fleets[key] = fleet_of_parts(ft, routing, routes, [got[i] for i in range(n)], policy, cap)
        if progress is not None:
            progress(len(fleets), total, fleets[key], time.perf_counter() - t0)
