"""What ``kvoffload simulate`` shows: token counts without exponents, a plot title that stays inside
the figure, a ``--help`` that names every capacity unit, and the infinite cache in trace blocks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvoffload.app.cli import main
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.plot import TITLE_LINES, TITLE_WIDTH, fit_title, title_lines
from kvoffload.simulate.trace_block_view import trace_block_view
from kvoffload.simulate.units import tokens_label
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


@pytest.mark.parametrize(
    ("n", "want"),
    [
        (0, "0"),
        (999, "999"),
        (1_000, "1K"),
        (1_024, "1.02K"),
        (500_000, "500K"),
        (999_499, "999K"),
        (999_936, "1M"),  # 1,953 blocks of 512 tokens: once printed as 1e+03K
        (1_500_000, "1.5M"),
        (99_950_000, "100M"),
        (2_500 * 10**9, "2500G"),
    ],
)
def test_token_counts_read_as_numbers(n: int, want: str) -> None:
    assert tokens_label(n) == want


def test_no_token_count_in_exponent_notation() -> None:
    rnd = random.Random(0)
    for n in [*range(0, 2_000_000, 977), *(rnd.randrange(10**13) for _ in range(2_000))]:
        text = tokens_label(n)
        assert "e" not in text and len(text) <= 6, (n, text)
        value = float(text.rstrip("KMG")) * {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1)
        assert value == pytest.approx(n, rel=0.006, abs=0.5), (n, text)


def test_long_titles_wrap_and_keep_both_ends() -> None:
    src = "How much host memory? Mooncake trace " + "/very/long/dir" * 40 + "/conv.jsonl (12,031 requests)"
    lines = title_lines(src).split("\n")
    assert 1 < len(lines) <= TITLE_LINES and all(len(line) <= TITLE_WIDTH for line in lines)
    joined = "".join(lines)
    assert joined.startswith("How much host memory?") and joined.endswith("/conv.jsonl (12,031 requests)")
    assert "..." in joined
    assert title_lines("How much host memory? chat workload") == "How much host memory? chat workload"


@pytest.mark.parametrize("name", ["W" * 10 + " /" + "m" * 400 + ".jsonl", "/data/traces/conversation_trace.jsonl"])
def test_title_stays_inside_the_figure(name: str) -> None:
    """The plot's figure size, with the widest characters a title can have and with a usual one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot([0, 1], [0, 1])
    title = fit_title(fig, title_lines(f"How much host memory? Mooncake trace {name} (12,031 requests)"))
    box, figbox = title.get_window_extent(fig.canvas.get_renderer()), fig.bbox  # type: ignore[attr-defined]
    plt.close(fig)
    assert figbox.x0 <= box.x0 and box.x1 <= figbox.x1 and figbox.y0 <= box.y0 and box.y1 <= figbox.y1
    assert title.get_fontsize() >= 6 and (title.get_fontsize() == 11) == ("m" * 100 not in name)


def test_help_names_every_capacity_unit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    capacities = text.split("--capacities CAPACITIES comma-separated", 1)[1].split("--tier-capacity", 1)[0]
    for unit in ("256", "GiB", "MiB", "Mtok", "Ktok"):
        assert unit in capacities, unit


def _brute_force(blocks: list[list[int]], first: int) -> tuple[int, int, int, int]:
    hits = total = w_hits = w_total = 0
    for r, req in enumerate(blocks):
        earlier = [set(b) for b in blocks[:r]]
        run = 0
        while run < len(req) and any(req[run] in e for e in earlier):
            run += 1
        hits, total = hits + run, total + len(req)
        if r >= first:
            w_hits, w_total = w_hits + run, w_total + len(req)
    return hits, total, w_hits, w_total


@pytest.mark.parametrize("seed", range(5))
def test_trace_block_view_matches_brute_force(seed: int) -> None:
    lines = random_mooncake(60, seed, block_tokens=64)
    blocks = [list(x["hash_ids"]) for x in lines]  # type: ignore[call-overload]
    for warmup in (0.0, 0.3, 0.5):
        v = trace_block_view(blocks, warmup)
        first = int(len(blocks) * warmup)
        assert v.warmup_requests == first
        assert (v.hit_blocks, v.total_blocks, v.window_hit_blocks, v.window_total_blocks) == _brute_force(blocks, first)


@pytest.mark.parametrize("warmup", [-0.1, 1.0, True, "0.5"])
def test_trace_block_view_refuses_bad_warmup(warmup: object) -> None:
    with pytest.raises(InvalidArgumentError, match="warmup"):
        trace_block_view([[1]], warmup)  # type: ignore[arg-type]


def test_cli_prints_the_definition_and_the_trace_block_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = random_mooncake(80, 3, block_tokens=64)
    (tmp_path / ("d" * 120)).mkdir()
    trace = write_mooncake(tmp_path / ("d" * 120) / "m.jsonl", lines)  # a long path: the plot's title wraps
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1"]
    assert main([*argv, "--policies", "lru", "--capacities", "8,1Ktok", "--trace-block-view", "0.5",
                 "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "at most its prompt - 1 tokens" in text and "e+" not in text
    view = trace_block_view([list(x["hash_ids"]) for x in lines], 0.5)  # type: ignore[call-overload]
    assert (
        f"{view.hit_rate:.1%} of trace blocks over every request; {view.window_hit_rate:.1%} over the requests "
        f"after the first {view.warmup_requests:,} (warm-up)"
    ) in text
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--trace-block-view", "1", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert "--trace-block-view: expected a number in [0, 1), got '1'" in capsys.readouterr().err
