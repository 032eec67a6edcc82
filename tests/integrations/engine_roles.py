"""Engines with ``KVOffloadSpec`` + ``secondary_tiers`` (vLLM's Scheduler and connector in both roles).

``python -m tests.integrations.engine_roles first '<json>'`` is the *first* engine of the
two-engine tests, in its own process: for each configuration ``{"name", "tiers"}`` in the JSON
list it runs :data:`PROMPTS` on a fresh engine, waits until every store has cascaded to the tiers
and prints one JSON line per configuration (outputs, seconds).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tests.integrations.vllm_harness import Engine

ROW = 4096  # one chunk of the harness model (256 KV bytes) rounded up to the page by the region


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 997 + 1 for i in range(n)]


#: the two-engine workload: two prompts sharing a 16-token prefix, and one of its own
PROMPTS: dict[str, list[int]] = {
    "p0": prompt(101, 16) + prompt(102, 13),
    "p1": prompt(101, 16) + prompt(103, 9),
    "p2": prompt(104, 23),
}


def extra(tiers: list[dict[str, Any]], chunks: int = 64, **kw: Any) -> dict[str, Any]:
    return {
        "spec_name": "KVOffloadSpec",
        "spec_module_path": "kvoffload.integrations.vllm",
        "cpu_bytes_to_use": chunks * ROW,
        "kernel_backend": "torch",
        "secondary_tiers": tiers,
        **kw,
    }


def run_until_done(e: Engine, timeout: float = 60.0) -> None:
    """Step until every request finished; tier lookups and promotions complete on tier threads,
    so the loop gives them a moment between steps instead of counting steps."""
    deadline = time.monotonic() + timeout
    while e.scheduler.has_unfinished_requests():
        if time.monotonic() > deadline:
            raise AssertionError(f"requests unfinished after {timeout} s ({e.steps} steps)")
        e.step()
        time.sleep(0.001)
    e.drain()  # finished requests are signalled to the manager on the next steps
    e.settle()


def run_prompts(e: Engine, prompts: dict[str, list[int]], suffix: str = "", max_tokens: int = 3) -> None:
    for rid, p in prompts.items():
        e.add(rid + suffix, p, max_tokens)
    run_until_done(e)


def _first(configs: list[dict[str, Any]]) -> None:
    for cfg in configs:
        t0 = time.perf_counter()
        e = Engine(extra(cfg["tiers"]))
        try:
            run_prompts(e, PROMPTS)
            outputs = {rid: e.outputs[rid] for rid in PROMPTS}
        finally:
            e.close()
        print(json.dumps({"name": cfg["name"], "outputs": outputs, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    assert sys.argv[1] == "first"
    _first(json.loads(sys.argv[2]))
