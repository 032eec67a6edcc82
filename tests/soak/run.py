"""One soak run per seed, with a one-line reproducer when it fails."""

from __future__ import annotations

from tests.soak.engine import SoakEngine
from tests.soak.model import SoakConfig

POOLS = {"random": None, "shared": True, "per-group": False}


def reproducer(seed: int, steps: int, pools: str) -> str:
    return f"PYTHONPATH=$PWD python -m tests.soak --seed {seed} --steps {steps} --pools {pools}"


def run_seed(seed: int, steps: int, pools: str = "random") -> dict[str, int]:
    """Run ``steps`` engine steps of seed ``seed`` (``pools``: one GPU block pool shared by every
    group, one per group, or chosen by the seed); returns the counts. Any failure is re-raised as
    an AssertionError naming the seed and the command that reproduces it."""
    eng = SoakEngine(seed, SoakConfig(shared_pool=POOLS[pools]))
    try:
        return eng.run(steps)
    except Exception as exc:
        raise AssertionError(
            f"soak seed {seed} failed at step {eng.step_no}: {type(exc).__name__}: {exc}\n"
            f"reproduce: {reproducer(seed, steps, pools)}"
        ) from exc


def format_counts(counts: dict[str, int]) -> str:
    faults = {k: v for k, v in counts.items() if k.startswith(("fault_", "abort_", "preempt_", "reset_"))}
    checks = {k: v for k, v in counts.items() if k.endswith(("checked", "_checks"))}
    rest = {k: v for k, v in counts.items() if k not in faults and k not in checks}
    part = [" ".join(f"{k}={v}" for k, v in sorted(d.items())) for d in (rest, faults, checks)]
    return f"{part[0]} | faults: {part[1]} | checks: {part[2]}"
