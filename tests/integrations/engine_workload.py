"""A workload for the harness's engine that reaches the connector's mid-flight cases.

Waves of requests sharing prefixes, on a GPU pool too small for all of them (preemptions) and a
CPU pool too small for every chunk (evictions); some requests stop on a token they sample (under
async scheduling their next step is already scheduled when the stop is seen), two requests per
wave are aborted right after a step of theirs was scheduled (with async scheduling that step is in
flight: the first one's stores of its prompt), and the GPU prefix cache is wiped between waves, so
later waves load from the CPU tier.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.integrations.harness_model import sample
from tests.integrations.vllm_harness import Engine


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 997 + 1 for i in range(n)]


@dataclass
class Run:
    """What a run did: the requests it aborted, its preemptions, and its steps."""

    aborted: set[str] = field(default_factory=set)
    preempted: int = 0
    stopped_early: set[str] = field(default_factory=set)


def run_workload(e: Engine, seed: int = 0, waves: int = 3, per_wave: int = 6, aborts: bool = True) -> Run:
    """Run the workload on ``e`` (outputs in ``e.outputs``); ``aborts=False`` runs every request to
    its end (the reference of a run without offloading)."""
    rng = random.Random(seed)
    bases = [prompt(900 + i, 12) for i in range(3)]
    run = Run()
    for wave in range(waves):
        for i in range(per_wave):
            p = rng.choice(bases)[: rng.choice((8, 12))] + prompt(rng.randrange(1000), rng.randint(3, 14))
            stop = None
            if rng.random() < 0.3:  # stops on its second sampled token, before max_tokens
                first = sample(p)
                stop = [sample([*p, first])]
                run.stopped_early.add(f"w{wave}r{i}")
            e.add(f"w{wave}r{i}", p, max_tokens=rng.randint(3, 7), stop_token_ids=stop)
        wave_steps = 0
        while e.scheduler.has_unfinished_requests():
            out = e.step()
            wave_steps += 1
            run.preempted += len(getattr(out, "preempted_req_ids", None) or ())
            if aborts and wave_steps in (1, 4):  # after its prompt's step (a store in flight), and later
                running = sorted(r.request_id for r in e.scheduler.running if r.request_id in out.num_scheduled_tokens)
                if running:
                    e.abort(running[0])  # async: the step just scheduled is in flight
                    run.aborted.add(running[0])
        e.drain()
        e.reset_gpu()
    return run


__all__ = ["Run", "prompt", "run_workload"]
