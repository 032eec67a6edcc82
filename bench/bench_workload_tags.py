"""Does the workload tag help? ``headstart`` with and without request tags on a generated Bailian trace.

Run: ``python bench/bench_workload_tags.py [--requests N] [--block-size B] [--out PATH]``.

The trace is :func:`kvoffload.simulate.bailian.generate_bailian_trace` (text chats, file questions,
two-turn image requests, one-shot searches behind shared tool prompts), written in the Bailian
format to a temporary file and read back with the Bailian reader, so the tags (``"<type>/<turn>"``)
reach the manager as in ``kvoffload simulate --trace FILE``. At each capacity the cache-level
replay runs LRU, ``headstart`` with the tags stripped, ``headstart`` with them, and Belady's
optimum; reported per capacity: share of prompt tokens loaded, share of Belady's, ratio to LRU,
and the tagged/untagged ratio. Writes a JSON results file (default
``bench/results/workload-tags.json``, with the run's provenance: versions, commit, machine). Hit
rates do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from bench.common import provenance  # noqa: E402
from kvoffload.simulate.bailian import (  # noqa: E402
    BAILIAN_BLOCK_TOKENS,
    generate_bailian_trace,
    read_bailian_trace,
    write_bailian_trace,
)
from kvoffload.simulate.cache_cli import block_trace_of  # noqa: E402
from kvoffload.simulate.cache_replay import replay_cache  # noqa: E402
from kvoffload.simulate.optimal import BeladyPlan, replay_belady  # noqa: E402

CAPACITY_TOKENS = (128 * 1024, 256 * 1024, 512 * 1024, 1024**2, 2 * 1024**2, 4 * 1024**2)


def run(requests: int, seed: int, block_size: int) -> dict[str, Any]:
    """The rows of one trace and block size (module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bailian.jsonl"
        write_bailian_trace(path, generate_bailian_trace(requests, seed))
        reqs = read_bailian_trace(path)
    tagged = block_trace_of(reqs, block_size, BAILIAN_BLOCK_TOKENS)
    untagged = replace(tagged, tags=None)
    lists = tagged.key_lists()
    plan = BeladyPlan(tagged)
    rows = []
    for tokens in CAPACITY_TOKENS:
        cap = tokens // block_size
        res = {
            "lru": replay_cache(untagged, "lru", cap, lists),
            "headstart_untagged": replay_cache(untagged, "headstart", cap, lists),
            "headstart_tagged": replay_cache(tagged, "headstart", cap, lists),
        }
        best = replay_belady(plan, cap).hit_tokens
        base = res["lru"].hit_tokens
        row: dict[str, Any] = {"tokens": tokens, "blocks": cap, "belady": round(best / tagged.total_prompt_tokens, 4)}
        for name, r in res.items():
            row[name] = {
                "hit_rate": round(r.hit_tokens / r.prompt_tokens, 4),
                "share_of_belady": round(r.hit_tokens / best, 3) if best else None,
                "x_lru": round(r.hit_tokens / base, 3) if base else None,
            }
        un = res["headstart_untagged"].hit_tokens
        row["tagged_vs_untagged"] = round(res["headstart_tagged"].hit_tokens / un, 3) if un else None
        rows.append(row)
        cells = "  ".join(f"{n} {row[n]['hit_rate'] * 100:5.2f}%" for n in res)
        print(
            f"{block_size}-token blocks, {tokens // 1024:>5}K tokens: {cells}  belady {row['belady'] * 100:5.2f}%",
            flush=True,
        )
    return {"block_size": block_size, "requests": requests, "seed": seed, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, action="append", help="tokens per block (repeatable; default 512)")
    parser.add_argument("--out", default=str(_HERE / "results" / "workload-tags.json"))
    args = parser.parse_args(argv)
    sizes = args.block_size or [512]
    t0 = time.perf_counter()
    runs = [run(args.requests, args.seed, b) for b in sizes]
    result = {
        "what": "headstart with and without workload tags (type/turn) on a generated Bailian-format trace, "
        "cache-level replay; per capacity: share of prompt tokens loaded, share of Belady's, x LRU",
        "command": f"python bench/bench_workload_tags.py --requests {args.requests} --seed {args.seed} "
        + " ".join(f"--block-size {b}" for b in sizes),
        "seconds": round(time.perf_counter() - t0, 1),
        "provenance": provenance(),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
