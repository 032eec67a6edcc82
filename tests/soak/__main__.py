"""Run the soak from the command line: ``python -m tests.soak --seed 3 --steps 800``.

Prints one line of counts per seed (steps, faults injected by kind, checks made); exits 1 on the
first failing seed, with the reproducer.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.soak.run import POOLS, format_counts, run_seed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.soak")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds")
    ap.add_argument("--steps", type=int, default=600, help="engine steps per seed")
    ap.add_argument("--minutes", type=float, default=0.0, help="keep running new seeds for this long")
    ap.add_argument(
        "--pools", choices=list(POOLS), default="random", help="GPU block pools: shared by all groups or one per group"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    total: dict[str, int] = {}
    seed = args.seed
    while True:
        try:
            counts = run_seed(seed, args.steps, args.pools)
        except AssertionError as exc:
            print(exc, file=sys.stderr)
            return 1
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
        print(f"seed {seed}: {format_counts(counts)}", flush=True)
        seed += 1
        done = seed - args.seed
        if done >= args.seeds and time.perf_counter() - t0 >= args.minutes * 60:
            break
    print(f"TOTAL {seed - args.seed} seeds in {time.perf_counter() - t0:.1f} s: {format_counts(total)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
