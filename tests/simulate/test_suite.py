"""The generated workload suite: well-formed, deterministic, runnable by simulate, and what each
pattern does to the policies (headstart never far below LRU; S3-FIFO's collapse on two turns)."""

from __future__ import annotations

import pytest

from kvoffload.app.cli import main
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.suite import SUITE, suite_workload


def trace_of(name: str, scale: float, block_tokens: int = 512) -> BlockTrace:
    reqs = suite_workload(name, seed=3, scale=scale)
    return BlockTrace.from_block_hashes(
        [r.block_hashes or () for r in reqs], [r.num_tokens for r in reqs], block_tokens
    )


@pytest.mark.parametrize("name", list(SUITE))
def test_workloads_are_deterministic_prefix_traces(name: str) -> None:
    a = suite_workload(name, seed=1, scale=0.05)
    assert a == suite_workload(name, seed=1, scale=0.05)
    assert len(a) == max(1, round(SUITE[name][1] * 0.05))
    for r in a:
        assert r.block_hashes is not None and r.token_ids is None
        assert r.num_tokens == 16 * len(r.block_hashes) and r.num_tokens % 512 == 0
    if name != "loop":
        assert a != suite_workload(name, seed=2, scale=0.05)


def test_two_turn_conversations_have_exactly_two_turns() -> None:
    """Every request extends no earlier request (a first turn) or exactly one first turn, and no
    first turn is extended twice."""
    hashes = [r.block_hashes or () for r in suite_workload("two-turn", seed=4, scale=0.1)]
    extends: list[int] = []
    for i, h in enumerate(hashes):
        parents = [j for j in range(i) if h[: len(hashes[j])] == hashes[j]]
        assert len(parents) <= 1
        if parents:
            assert parents[0] not in extends and not any(
                hashes[parents[0]][: len(hashes[k])] == hashes[k] for k in range(parents[0])
            )
            extends.append(parents[0])
    assert len(extends) > len(hashes) // 4


@pytest.mark.parametrize("name", list(SUITE))
def test_headstart_never_far_below_lru(name: str) -> None:
    """The issue's robustness bound, at a small scale: never more than 0.5 point of prompt tokens
    below LRU, at capacities from well below to about the working set."""
    trace = trace_of(name, 0.25)
    lists = trace.key_lists()
    for frac in (0.02, 0.1, 0.4):
        cap = max(4, round(trace.num_blocks * frac))
        lru = replay_cache(trace, "lru", cap, lists).hit_rate
        hs = replay_cache(trace, "headstart", cap, lists).hit_rate
        assert hs >= lru - 0.005, (name, cap, hs, lru)


def test_s3fifo_collapses_on_two_turn_traffic() -> None:
    """Documented, not fixed: S3-FIFO admits first turns into its small queue (10 % of the pool),
    evicts them before the second turn comes, then admits the second turn straight into the main
    queue from the ghost -- where, conversations having exactly two turns, it is dead. The main
    queue fills with dead blocks and S3-FIFO loads far less than LRU."""
    trace = trace_of("two-turn", 0.5)
    lists = trace.key_lists()
    cap = round(trace.num_blocks * 0.2)
    lru = replay_cache(trace, "lru", cap, lists).hit_rate
    s3 = replay_cache(trace, "s3fifo", cap, lists).hit_rate
    hs = replay_cache(trace, "headstart", cap, lists).hit_rate
    assert s3 < 0.85 * lru
    assert hs >= lru - 0.005


def test_simulate_runs_a_suite_workload(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path)
    rc = main(
        ["simulate", "--suite", "scan", "--replay", "cache", "--jobs", "1", "--policies", "lru,headstart"]
        + ["--capacities", "200,800", "--block-size", "512", "--out", out]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "suite workload scan" in text and "headstart" in text
    # the ratio-to-LRU table: LRU is 1.00x at every capacity, headstart's figures follow the hit table
    table = text[text.index("relative to LRU's") :].splitlines()[2:4]
    assert len(table) == 2 and all(row.split()[-2] == "1.00x" for row in table)


def test_suite_and_trace_are_exclusive(tmp_path: object) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--suite", "nope"])
    from kvoffload.simulate.cli import _read_workload

    class Args:
        suite = "loop"
        trace = "x.jsonl"
        seed = 0

    with pytest.raises(InvalidArgumentError, match="--suite and --trace"):
        _read_workload(Args(), None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="--suite must be one of"):
        suite_workload("nope")
    with pytest.raises(InvalidArgumentError, match="scale"):
        suite_workload("loop", scale=0)


def test_legend_ranges_of_share_and_ratio() -> None:
    from kvoffload.simulate.plot import legend_ranges
    from kvoffload.simulate.sweep import SimPoint

    def pt(policy: str, blocks: int, hits: int) -> SimPoint:
        return SimPoint(
            policy, blocks, 0.0, blocks, 100, 100, hits, 0, 100 - hits, hits / 100, hits / 100, 0, 0, 0, 0.0
        )

    points = [pt("lru", 10, 10), pt("lru", 20, 20), pt("headstart", 10, 20), pt("headstart", 20, 30)]

    class Ref:
        belady = [pt("belady", 10, 40), pt("belady", 20, 40)]

    assert legend_ranges("headstart", points, Ref()) == " (0.50-0.75 of Belady, 1.50-2.00x LRU)"  # type: ignore[arg-type]
    assert legend_ranges("lru", points, None) == ""
