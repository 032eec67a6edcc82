"""A routing x replicas x policy x host capacity x tier capacity (x arrival rate x router weight)
sweep of fleet replays, on several cores.

A fleet without a shared tier whose routing does not read the caches splits into one
:func:`~kvoffload.simulate.fleet.replay_replica` task per replica (the replicas are independent); any
other fleet (a tier beneath all replicas, ``kv-aware`` or ``prefix`` routing, or no host pool at
all) is one :func:`~kvoffload.simulate.fleet.replay_fleet` task, its replicas replayed together in
arrival order. ``kv-aware`` routes depend on the arrival rate and the router's weight: one task per
rate scale and weight; the other routings' routes do not (their load window counts trace time), and
a single replica is the same fleet whatever the routing: replayed once, reported under each. Host
capacity 0 (``no_offload``) is the fleet without offloading: every prompt token computed. With
``jobs > 1`` the tasks run in forked worker processes that inherit the trace, its key lists and the
routes from the parent (only the task and its result cross), longest tasks first.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.cache_replay import ReplayResult
from kvoffload.simulate.engine_time import EngineTime
from kvoffload.simulate.fleet import FleetResult, FleetTrace, fleet_of_parts, replay_fleet, replay_replica
from kvoffload.simulate.kv_router import KV_AWARE, KV_WEIGHT
from kvoffload.simulate.routing import LOAD_WINDOW_S, PREFIX

__all__ = ["FleetSpec", "sweep_fleet"]

# (routing, replicas, policy, host capacity, tier capacity, rate scale (0: any), kv weight (-1: none))
_Key = tuple[str, int, str, int, int, float, float]
# a key and the replica index of a split task, or -1 for the joint replay
_Task = tuple[_Key, int]
_shared: dict[str, object] = {}  # the sweep under way, set before the workers fork (read only there)


@dataclass(frozen=True)
class FleetSpec:
    """What to sweep: every combination of these (capacities in blocks per replica; tier
    capacities in blocks, 0: none), the ``kv-aware`` router's rate scales and weights, whether to
    add the fleets without offloading (``no_offload``: host capacity 0), the random routing's
    ``seed`` and the load model's window."""

    routings: list[str]
    replicas: list[int]
    policies: list[str]
    capacities: list[int]
    tier_capacities: list[int]
    seed: int = 0
    window_s: float = LOAD_WINDOW_S
    rate_scales: list[float] = field(default_factory=lambda: [1.0])
    kv_weights: list[float] = field(default_factory=lambda: [KV_WEIGHT])
    no_offload: bool = False

    def keys(self) -> list[_Key]:
        """Every fleet, in report order (routing, replicas, policy, tier, capacity, scale, weight)."""
        out: list[_Key] = []
        caps = [0, *self.capacities] if self.no_offload else list(self.capacities)
        for routing in self.routings:
            for n in self.replicas:
                for policy in self.policies:
                    for tier in self.tier_capacities:
                        for cap in caps:
                            if cap == 0 and tier:
                                continue
                            if routing == KV_AWARE and n > 1:
                                out.extend(
                                    (routing, n, policy, cap, tier, s, w)
                                    for s in self.rate_scales
                                    for w in self.kv_weights
                                )
                            elif routing == KV_AWARE:
                                out.extend((routing, n, policy, cap, tier, 0.0, w) for w in self.kv_weights)
                            else:
                                out.append((routing, n, policy, cap, tier, 0.0, -1.0))
        return out

    def replayed(self, key: _Key) -> _Key:
        """The key of the replay that gives fleet ``key``: one replica is the same fleet whatever
        the routing (and weight), replayed once under a key of its own."""
        routing, n, policy, cap, tier, *_ = key
        return ("one", 1, policy, cap, tier, 0.0, -1.0) if n == 1 else key

    def tasks(self) -> list[_Task]:
        out: list[_Task] = []
        for key in dict.fromkeys(self.replayed(k) for k in self.keys()):
            routing, n, _, cap, tier, *_ = key
            split = tier == 0 and cap > 0 and n > 1 and routing not in (PREFIX, KV_AWARE)
            out.extend((key, i) for i in (range(n) if split else [-1]))
        return out


def _cost(task: _Task) -> float:
    (routing, n, policy, cap, tier, *_), part = task
    whole = (1.0 if policy == "lru" else 3.0) * (1.5 if tier else 1.0) * (1 + 0.1 * n if part < 0 and n > 1 else 1)
    whole *= 0.1 if cap == 0 else 1.0
    return whole / n if part >= 0 else whole


def _run(task: _Task) -> tuple[_Task, ReplayResult | FleetResult]:
    (routing, n, policy, cap, tier, scale, weight), part = task
    ft, spec, lists, timing = _shared["trace"], _shared["spec"], _shared["lists"], _shared["timing"]
    assert isinstance(ft, FleetTrace) and isinstance(spec, FleetSpec) and isinstance(lists, list)
    assert timing is None or isinstance(timing, EngineTime)
    # a pool holding every distinct block never evicts: a larger one replays the same, without its memory
    eff = min(cap, max(ft.trace.num_blocks, 1))
    if part >= 0:
        routes = _shared[f"routes:{routing}:{n}"]
        assert isinstance(routes, np.ndarray)
        return task, replay_replica(ft.trace, routes, part, policy, eff, lists)
    w = weight if weight >= 0 else KV_WEIGHT
    res = replay_fleet(ft, routing, n, policy, eff, tier, lists, spec.seed, spec.window_s, timing, w, scale or 1.0)
    return task, replace(res, capacity=cap)


def sweep_fleet(
    ft: FleetTrace,
    spec: FleetSpec,
    jobs: int = 1,
    progress: Callable[[int, int, FleetResult, float], None] | None = None,
    timing: EngineTime | None = None,
) -> list[FleetResult]:
    """Every fleet of ``spec`` over ``ft`` on ``jobs`` processes (1: in this process), in the
    order of :meth:`FleetSpec.keys`; ``timing`` is the engine-time model ``kv-aware`` routes with.

    ``progress(done, total, result, elapsed_s)`` is called as each replay is complete.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(f"--jobs must be a positive int, got {jobs!r}")
    if not spec.replicas or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in spec.replicas):
        raise InvalidArgumentError(f"--replicas must be positive ints, got {spec.replicas!r}")
    if KV_AWARE in spec.routings and timing is None:
        raise InvalidArgumentError("kv-aware routing needs the engine-time model (timing)")
    t0 = time.perf_counter()
    tasks = sorted(spec.tasks(), key=_cost, reverse=True)
    _shared.clear()
    _shared.update(trace=ft, spec=spec, lists=ft.trace.key_lists(), timing=timing)
    for (routing, n, *_), part in tasks:
        if part >= 0 and f"routes:{routing}:{n}" not in _shared:
            _shared[f"routes:{routing}:{n}"] = ft.routes(routing, n, spec.seed, spec.window_s)
    fleets: dict[_Key, FleetResult] = {}
    parts: dict[_Key, dict[int, ReplayResult]] = {}
    total = len({t[0] for t in tasks})
    try:
        if jobs == 1 or len(tasks) == 1:
            done: Iterator[tuple[_Task, ReplayResult | FleetResult]] = map(_run, tasks)
            _collect(done, ft, fleets, parts, total, t0, progress)
        else:
            with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
                _collect(pool.imap_unordered(_run, tasks), ft, fleets, parts, total, t0, progress)
    finally:
        _shared.clear()
    out = []
    for key in spec.keys():
        res = fleets[spec.replayed(key)]
        if key[1] == 1:
            out.append(replace(res, routing=key[0], kv_weight=key[6] if key[6] >= 0 else None))
        else:
            out.append(res)
    return out


def _collect(
    done: Iterator[tuple[_Task, ReplayResult | FleetResult]],
    ft: FleetTrace,
    fleets: dict[_Key, FleetResult],
    parts: dict[_Key, dict[int, ReplayResult]],
    total: int,
    t0: float,
    progress: Callable[[int, int, FleetResult, float], None] | None,
) -> None:
    for (key, part), res in done:
        if isinstance(res, FleetResult):
            fleets[key] = res
        else:
            got = parts.setdefault(key, {})
            got[part] = res
            routing, n, policy, cap, *_ = key
            if len(got) < n:
                continue
            routes = _shared[f"routes:{routing}:{n}"]
            assert isinstance(routes, np.ndarray)
            fleets[key] = fleet_of_parts(ft, routing, routes, [got[i] for i in range(n)], policy, cap)
        if progress is not None:
            progress(len(fleets), total, fleets[key], time.perf_counter() - t0)
