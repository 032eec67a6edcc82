"""Every bad value of a ``kvoffload simulate`` flag is one line naming the flag and exit status 2,
never a traceback; a capacity beyond what the workload can store runs as that size, same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.app.cli import main
from kvoffload.simulate.capacity import MAX_CAPACITY_BLOCKS
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake

# (extra flags, the flag the error names); the base command is a small cache-level sweep
BAD = [
    (["--capacities", "1e30GiB"], "--capacities"),
    (["--capacities", "99999999GiB"], "--capacities"),
    (["--capacities", "1e305Mtok"], "--capacities"),
    (["--capacities", "9999999999999999999"], "--capacities"),
    (["--capacities", str(MAX_CAPACITY_BLOCKS + 1)], "--capacities"),
    (["--capacities", "99999999PiB"], "--capacities"),
    (["--capacities", "infGiB"], "--capacities"),
    (["--capacities", "nanGiB"], "--capacities"),
    (["--capacities", "nan"], "--capacities"),
    (["--capacities", "-1"], "--capacities"),
    (["--capacities", "0"], "--capacities"),
    (["--capacities", "0GiB"], "--capacities"),
    (["--capacities", "1e-30GiB"], "--capacities"),
    (["--capacities", "abc"], "--capacities"),
    (["--capacities", ""], "--capacities"),
    (["--capacities", ","], "--capacities"),
    (["--capacities", "4,4"], "--capacities"),
    (["--capacities", "1GiB,1024MiB"], "--capacities"),
    (["--tier-capacity", "1e30GiB"], "--tier-capacity"),
    (["--tier-capacity", "infGiB"], "--tier-capacity"),
    (["--tier-capacity", "-1"], "--tier-capacity"),
    (["--tier-capacity", ","], "--tier-capacity"),
    (["--tier-capacity", "8,8"], "--tier-capacity"),
    (["--policies", ""], "--policies"),
    (["--policies", ","], "--policies"),
    (["--policies", "lru,lru"], "--policies"),
    (["--policies", "lru,nosuch"], "--policies"),
    (["--policies", "no_such_module_xyz:Cls"], "--policies"),
    (["--policies", "os:path"], "--policies"),
    (["--block-size", "0"], "--block-size"),
    (["--block-size", "24"], "--block-size"),
    (["--block-size", "nan"], "--block-size"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "-2"], "--jobs"),
    (["--jobs", "inf"], "--jobs"),
    (["--trace-block-size", "0"], "--trace-block-size"),
    (["--trace-block-size", "24"], "--trace-block-size"),
    (["--layers", "0"], "--layers"),
    (["--kv-heads", "-1"], "--kv-heads"),
    (["--head-dim", "nan"], "--head-dim"),
    (["--dtype", "fp4"], "--dtype"),
    (["--model", "1t"], "--model"),
    (["--model-config", "/nonexistent/config.json"], "--model-config"),
    (["--seed", "-1"], "--seed"),
    (["--trace-block-view", "1"], "--trace-block-view"),
    (["--trace-block-view", "nan"], "--trace-block-view"),
    (["--gpu-blocks", "1"], "--gpu-blocks"),
    (["--gpu-blocks", "99999999999"], "--gpu-blocks"),
    (["--conversations", "0"], "--conversations"),
    (["--conversations", "99999999999"], "--conversations"),
    (["--out", ""], "--out"),
    (["--replay", "fast"], "--replay"),
    (["--trace-format", "csv"], "--trace-format"),
    (["--trace-format", "bailian"], "--trace"),  # a Mooncake file read as Bailian: its first bad line
]


def _base(trace: Path, out: Path) -> list[str]:
    return ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1",
            "--policies", "lru", "--capacities", "4", "--no-plot", "--out", str(out)]  # fmt: skip


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mooncake(tmp_path_factory.mktemp("t") / "m.jsonl", random_mooncake(60, 1, block_tokens=64))


@pytest.mark.parametrize(("extra", "flag"), BAD, ids=[" ".join(e) or "empty" for e, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_flag(
    extra: list[str], flag: str, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _one_line_error([*_base(trace, tmp_path / "o"), *extra], capsys)
    assert flag in line
    assert not (tmp_path / "o" / "results.json").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("path", "content"),
    [("missing.jsonl", None), ("empty.jsonl", ""), ("garbage.jsonl", "not json\n"), ("", None), ("dir", "/")],
)
def test_a_bad_trace_is_one_line_naming_the_flag(
    path: str, content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / path if path else Path("")
    if content == "/":
        target.mkdir()
    elif content is not None:
        target.write_text(content)
    argv = ["simulate", "--trace", str(target) if path else "", "--replay", "cache", "--jobs", "1", "--no-plot"]
    assert "--trace" in _one_line_error([*argv, "--policies", "lru", "--out", str(tmp_path / "o")], capsys)


@pytest.mark.parametrize("big", ["1000000", "99999GiB"])
def test_a_capacity_beyond_the_working_set_runs_as_it(
    big: str, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool of the trace's distinct blocks never evicts: a larger one (even too large to allocate)
    gives the same figures, reported at the capacity asked for."""
    base = [x for x in _base(trace, tmp_path) if x not in ("--capacities", "4", "--out", str(tmp_path))]
    ws = json.loads(_run([*base, "--capacities", "4"], tmp_path / "a", capsys))["working_set"]["prompt_blocks"]
    cap = int(float(big)) if big[-1].isdigit() else 99999 * 2**30 // (32 * 131072)
    small = json.loads(_run([*base, "--capacities", f"4,{ws}"], tmp_path / "b", capsys))
    large = json.loads(_run([*base, "--capacities", f"4,{big}"], tmp_path / "c", capsys))
    assert len(small["points"]) == len(small["belady"]) == 2
    for a, b in zip(small["points"] + small["belady"], large["points"] + large["belady"], strict=True):
        if a["cpu_blocks"] == ws:
            assert (b["cpu_blocks"], b["cpu_tokens"]) == (cap, cap * 32)
            assert b["cpu_gib"] == pytest.approx(cap * 32 * 131072 / 2**30)
        assert {k: v for k, v in a.items() if not k.startswith(("cpu_blocks", "cpu_gib", "cpu_tokens", "seconds"))} == {
            k: v for k, v in b.items() if not k.startswith(("cpu_blocks", "cpu_gib", "cpu_tokens", "seconds"))
        }


def _run(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    return (out / "results.json").read_text()
