"""Mooncake traces: the reader, its errors, and the keys of partial and split blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.core.base import make_offload_key
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_cli import block_trace_of
from kvoffload.simulate.cli import _mooncake_to_trace
from kvoffload.simulate.mooncake import detect_trace_format, piece_hash, read_mooncake_trace
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake


def _write(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "m.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return p


def test_reads_the_release_format(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        '{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": '
        + json.dumps(list(range(46, 58)) + [2353, 2354])
        + "}",
        "",
        '{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": '
        + json.dumps(list(range(46, 58)) + [2366])
        + "}",
    )
    assert detect_trace_format(p) == "mooncake"
    a, b = read_mooncake_trace(p)
    assert (a.timestamp, a.input_length, a.output_length, a.line) == (27482.0, 6955, 52, 1)
    assert b.hash_ids[-1] == 2366 and b.line == 3
    bt = BlockTrace.from_mooncake([a, b], 512, 32)
    # 6955 // 32 = 217 full offloaded blocks, 6472 // 32 = 202; the first 12 trace blocks (192
    # offloaded blocks) are shared, so 217 + 202 - 192 distinct blocks
    assert bt.starts.tolist() == [0, 217, 419]
    assert bt.num_blocks == 217 + 202 - 192
    assert bt.ids[217 : 217 + 192].tolist() == bt.ids[:192].tolist()


def test_kvoffload_traces_are_detected_as_such(tmp_path: Path) -> None:
    assert detect_trace_format(_write(tmp_path, "# c", '{"token_ids": [1, 2]}')) == "kvoffload"


def test_split_and_partial_blocks_keyed_like_the_engine(tmp_path: Path) -> None:
    """Trace blocks of 64 tokens, offloaded blocks of 32 (a trace block holds two) or 128 (one
    spans two trace blocks): the keys are the engine's for the converted trace, and a partial
    last block contributes exactly its full offloaded blocks."""
    p = write_mooncake(tmp_path / "r.jsonl", random_mooncake(80, 3, block_tokens=64))
    reqs = read_mooncake_trace(p, 64)
    items = _mooncake_to_trace(reqs, 64)
    for block in (16, 32, 64, 128):
        bt = BlockTrace.from_mooncake(reqs, 64, block)
        via_engine = block_trace_of(items, block, 16)
        assert [bt.keys[i] for i in bt.ids] == [via_engine.keys[i] for i in via_engine.ids]
        assert (bt.starts[1:] - bt.starts[:-1]).tolist() == [r.input_length // block for r in reqs]
    # the first offloaded block of 32 tokens in trace block h=7 is its piece 1 (tokens 16..31)
    one = read_mooncake_trace(_write(tmp_path, '{"input_length": 100, "hash_ids": [7, 8]}'), 64)
    bt = BlockTrace.from_mooncake(one, 64, 32)
    want = [make_offload_key(piece_hash(p), 0) for p in (7 * 4 + 1, 7 * 4 + 3, 8 * 4 + 1)]
    assert [bt.keys[i] for i in bt.ids] == want  # 100 tokens: 3 full blocks of 32, the last from the partial block


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"input_length": 10, "hash_ids": [1], "foo": 1}', "unknown field 'foo'"),
        ('{"input_length": 600, "hash_ids": [1]}', "hash_ids has 1 entries, input_length 600 needs 2"),
        ('{"input_length": 600, "hash_ids": [1, 1]}', "hash_ids repeats an id"),
        ('{"hash_ids": [1]}', "missing field 'input_length'"),
        ('{"input_length": 0, "hash_ids": []}', "input_length must be a positive int"),
        ('{"input_length": 5, "output_length": -1, "hash_ids": [1]}', "output_length must be a non-negative int"),
        ('{"input_length": 5, "hash_ids": ["a"]}', "hash_ids must be a list of non-negative ints"),
        ('{"input_length": 600, "hash_ids": [1, true]}', "hash_ids must be a list of non-negative ints"),
        ('{"input_length": 600, "hash_ids": [1, -2]}', "hash_ids must be a list of non-negative ints"),
        ('{"input_length": 600, "hash_ids": [1.0, 2]}', "hash_ids must be a list of non-negative ints"),
        ('{"input_length": 5, "hash_ids": [18014398509481984]}', "hash_ids must be a list of non-negative ints"),
        ('{"input_length": 5, "hash_ids": {"1": 1}}', "hash_ids must be a list of non-negative ints"),
        ('{"timestamp": "x", "input_length": 5, "hash_ids": [1]}', "timestamp must be a non-negative number"),
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, line: str, needle: str) -> None:
    p = _write(tmp_path, '{"timestamp": 5, "input_length": 5, "hash_ids": [9]}', line)
    with pytest.raises(InvalidArgumentError) as exc:
        read_mooncake_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:2: ") and needle in msg, msg


def test_timestamps_must_not_go_back_and_sizes_must_be_pieces(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        '{"timestamp": 5, "input_length": 5, "hash_ids": [9]}',
        '{"timestamp": 4, "input_length": 5, "hash_ids": [9]}',
    )
    with pytest.raises(InvalidArgumentError, match=r":2: timestamp 4 is before the previous line's 5"):
        read_mooncake_trace(p)
    with pytest.raises(InvalidArgumentError, match="--trace-block-size must be a multiple of 16"):
        read_mooncake_trace(p, 500)
    with pytest.raises(InvalidArgumentError, match="holds no request"):
        read_mooncake_trace(_write(tmp_path, "# nothing"))
