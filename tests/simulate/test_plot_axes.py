"""The sweep plot's x axis spans the swept capacities (references far beyond are named, not drawn),
and its title names the trace by its file name."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from kvoffload.app.cli import main
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.axis_span import LOG_RATIO, NEAR_RATIO, XSpan
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


@pytest.mark.parametrize(
    ("values", "log"),
    [([1.0, 2.0], False), ([2.0], False), ([1.0, 9.99], False), ([1.0, 10.0], True), ([50.0, 0.5, 3.0], True)],
)
def test_span_covers_the_swept_values_with_a_margin(values: list[float], log: bool) -> None:
    span = XSpan(values)
    left, right = span.limits()
    assert span.log is log and span.log == (max(values) >= LOG_RATIO * min(values))
    assert 0 <= left < min(values) and max(values) < right
    if len(set(values)) == 1:  # one value: in the middle
        assert right - values[0] == pytest.approx(values[0] - left)
    elif log:  # the margin is a small share of the decades shown, each side
        shown = math.log10(right / left)
        assert math.log10(min(values) / left) < 0.1 * shown and math.log10(right / max(values)) < 0.1 * shown
    else:
        shown = right - left
        assert right - max(values) < 0.1 * shown and (left == 0 or min(values) - left < 0.1 * shown)


def test_far_references_are_not_near_and_near_ones_widen_the_span() -> None:
    span = XSpan([1.0, 2.0])  # linear, width 1
    assert span.near(2.0 + (NEAR_RATIO - 1) * 0.99) and not span.near(11_049.0) and not span.near(float("nan"))
    log = XSpan([1.0, 100.0])
    assert log.near(100 * NEAR_RATIO * 0.99) and not log.near(100 * NEAR_RATIO * 1.01)
    assert log.near(1 / NEAR_RATIO * 1.01) and not log.near(1 / NEAR_RATIO * 0.99)
    log.include(140.0)
    assert log.limits()[1] > 140.0
    left, right = log.limits()
    assert (log.share(left), log.share(right), log.share(math.sqrt(left * right))) == pytest.approx((0, 1, 0.5))
    assert (span.share(span.limits()[0]), span.share(1.5)) == pytest.approx((0, 0.5))


@pytest.mark.parametrize("values", [[], [0.0, 1.0], [-1.0], [float("inf")], [float("nan")]])
def test_span_refuses_values_it_cannot_draw(values: list[float]) -> None:
    with pytest.raises(InvalidArgumentError, match="values"):
        XSpan(values)


def _drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures ``savefig`` is called on (still saved)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figs: list[Any] = []
    save = Figure.savefig

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        figs.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return figs


def test_two_capacities_fill_the_axis_and_the_title_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    figs = _drawn(monkeypatch)
    (tmp_path / "deep" / "dir").mkdir(parents=True)
    trace = write_mooncake(tmp_path / "deep" / "dir" / "conv.jsonl", random_mooncake(200, 7, block_tokens=64))
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1"]
    assert main([*argv, "--policies", "lru", "--capacities", "4,8", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    (fig,) = figs
    ax = fig.axes[0]
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "conv.jsonl" in title and str(tmp_path) not in title and "deep" not in title
    left, right = ax.get_xlim()
    gib_per_block = 32 * 131072 / 2**30  # 32-token blocks of the 8b shape
    lo, hi = 4 * gib_per_block, 8 * gib_per_block
    assert ax.get_xscale() == "linear" and left < lo < hi < right
    assert right - left < 1.3 * (hi - lo)  # the two points span the axis, not its left edge
    # the working set, far beyond 8 blocks, is not a line on the axis but named at its edge
    assert not [line for line in ax.get_lines() if len(set(line.get_xdata())) == 1 and line.get_xdata()[0] > right]
    assert any("working set" in t.get_text() and "off the axis" in t.get_text() for t in ax.texts)


def test_a_sweep_over_decades_is_logarithmic_and_draws_a_near_working_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    figs = _drawn(monkeypatch)
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(120, 3, block_tokens=64))
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1"]
    assert main([*argv, "--policies", "lru", "--out", str(tmp_path / "o")]) == 0  # default: 1/256 to 2x the set
    capsys.readouterr()
    ax = figs[0].axes[0]
    assert ax.get_xscale() == "log"
    assert any("working set" in t.get_text() and "off the axis" not in t.get_text() for t in ax.texts)
