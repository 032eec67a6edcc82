"""``kvoffload simulate``: per-policy hit rate vs CPU capacity, PNG/CSV/JSON outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from kvoffload.cli import main
from kvoffload.demo import DemoSettings
from kvoffload.sim.workload import ChatWorkload, read_trace, write_trace
from kvoffload.simulate import default_capacities, simulate, working_set_blocks

_SMALL = DemoSettings(conversations=8, turns=3, gpu_blocks=48, max_concurrent=4)


def test_capacity_sweep_moves_hit_rate() -> None:
    items = list(ChatWorkload(conversations=8, turns=3))
    points = simulate(items, _SMALL, ["lru", "s3fifo"], [1, 400], verbose=False)
    assert [(p.policy, p.cpu_blocks) for p in points] == [("lru", 1), ("lru", 400), ("s3fifo", 1), ("s3fifo", 400)]
    by = {(p.policy, p.cpu_blocks): p for p in points}
    for policy in ("lru", "s3fifo"):
        assert by[(policy, 1)].cpu_hit_tokens == 0  # one slot never holds a whole loadable prefix
        assert by[(policy, 400)].cpu_hit_tokens > 0
        assert by[(policy, 400)].cpu_evictions == 0
        assert by[(policy, 400)].prompt_tokens == sum(len(t.prompt_token_ids) for t in items)


def test_trace_and_chat_workload_agree(tmp_path: Path) -> None:
    items = list(ChatWorkload(conversations=8, turns=3))
    path = tmp_path / "trace.jsonl"
    write_trace(path, items)
    trace = read_trace(path)
    assert working_set_blocks(trace, 16) == working_set_blocks(items, 16) > 0
    # Without the conversation ordering the trace may interleave differently; the totals agree.
    (p,) = simulate(trace, _SMALL, ["lru"], [400], verbose=False)
    assert p.prompt_tokens == sum(len(t.prompt_token_ids) for t in items)


def test_default_capacities_span_the_working_set() -> None:
    caps = default_capacities(800)
    assert caps == sorted(caps) and caps[0] == 50 and caps[-1] == 1000


def test_cli_writes_plot_csv_json(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    rc = main(["simulate", "--policies", "lru,arc", "--capacities", "8,64", "--conversations", "4", "--out", str(out)])
    assert rc == 0
    png = (out / "hit_rate.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], int(r["cpu_blocks"])) for r in rows] == [("lru", 8), ("lru", 64), ("arc", 8), ("arc", 64)]
    data = json.loads((out / "results.json").read_text())
    assert len(data["points"]) == 4 and data["working_set_blocks"] > 0


def test_block_hash_trace_matches_token_trace(tmp_path: Path) -> None:
    from kvoffload.sim.request import hash_blocks

    items = list(ChatWorkload(conversations=8, turns=3))
    tok_path, hash_path = tmp_path / "tokens.jsonl", tmp_path / "hashes.jsonl"
    write_trace(tok_path, items)
    with hash_path.open("w") as f:
        for t in items:
            n = len(t.prompt_token_ids) // 16 * 16  # whole blocks only: both traces then hash alike
            f.write(
                json.dumps(
                    {
                        "block_hashes": [h.hex() for h in hash_blocks(t.prompt_token_ids[:n], 16)],
                        "num_tokens": n,
                        "max_tokens": t.max_tokens,
                    }
                )
                + "\n"
            )
    (p_hash,) = simulate(read_trace(hash_path), _SMALL, ["lru"], [400], verbose=False)
    assert p_hash.cpu_hit_tokens > 0
    assert working_set_blocks(read_trace(hash_path), 16) == working_set_blocks(items, 16)
