"""Chat workload generator and JSONL trace reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.engine.reference.workload import ChatWorkload, read_jsonl, read_trace, write_jsonl, write_trace
from kvoffload.errors import InvalidArgumentError, InvalidTypeError


def test_chat_workload_is_deterministic_and_shares_prefixes() -> None:
    w1 = ChatWorkload(conversations=6, turns=3, system_prompts=2, seed=7)
    w2 = ChatWorkload(conversations=6, turns=3, system_prompts=2, seed=7)
    assert w1.turns_in_order() == w2.turns_in_order()
    assert len(w1) == 18
    assert ChatWorkload(conversations=6, turns=3, system_prompts=2, seed=8).turns_in_order() != w1.turns_in_order()
    by_conv: dict[int, list] = {}
    for t in w1:
        by_conv.setdefault(t.conversation, []).append(t)
    for turns in by_conv.values():
        assert [t.turn for t in turns] == [0, 1, 2]  # arrival order respects turn order
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
            assert len(nxt.prompt_token_ids) > len(prev.prompt_token_ids) + prev.max_tokens - 1
    firsts = [turns[0].prompt_token_ids[: w1.system_tokens] for turns in by_conv.values()]
    assert len(set(firsts)) == 2  # two shared system prompts
    assert w1.prompt_tokens == sum(len(t.prompt_token_ids) for t in w1)


@pytest.mark.parametrize("kwargs", [{"conversations": 0}, {"turns": -1}, {"user_tokens": (5, 2)}])
def test_chat_workload_rejects_bad_sizes(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        ChatWorkload(**kwargs)


def test_chat_workload_rejects_a_bool_size() -> None:
    with pytest.raises(InvalidTypeError, match="system_tokens"):
        ChatWorkload(system_tokens=True)


def test_trace_round_trip(tmp_path: Path) -> None:
    w = ChatWorkload(conversations=2, turns=2, seed=1)
    path = tmp_path / "t.jsonl"
    write_trace(path, w.turns_in_order())
    reqs = read_trace(path)
    assert [r.token_ids for r in reqs] == [t.prompt_token_ids for t in w]
    assert [r.request_id for r in reqs] == [t.request_id for t in w]
    assert [r.max_tokens for r in reqs] == [t.max_tokens for t in w]


def test_jsonl_rows_round_trip_one_line_each_in_order(tmp_path: Path) -> None:
    rows = [{"b": 1, "a": [1, 2]}, {"s": "x\ny", "n": None}, {}]
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, iter(rows))
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and [json.loads(line) for line in lines[:-1]] == rows
    assert lines[0] == '{"b":1,"a":[1,2]}'  # the fields in the order given
    assert list(read_jsonl(path)) == [(1, rows[0]), (2, rows[1]), (3, rows[2])]


def test_trace_with_block_hashes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("# comment\n\n" + json.dumps({"block_hashes": ["00ff", "abcd"], "num_tokens": 40}) + "\n")
    (req,) = read_trace(path)
    assert req.block_hashes == (b"\x00\xff", b"\xab\xcd") and req.num_tokens == 40 and req.token_ids is None


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json\n", "not valid JSON"),
        ("[1,2]\n", "JSON object"),
        ('{"foo": 1}\n', "token_ids"),
        ('{"token_ids": [1, "a"]}\n', "token_ids"),
        ('{"block_hashes": ["zz"], "num_tokens": 16}\n', "hex"),
        ('{"block_hashes": ["00"]}\n', "num_tokens"),
        ('{"token_ids": [1], "max_tokens": -2}\n', "max_tokens"),
        ("\n", "no request"),
    ],
)
def test_trace_rejects_bad_lines(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(InvalidArgumentError, match=match):
        read_trace(path)


def test_trace_unreadable(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot be read"):
        read_trace(tmp_path / "missing.jsonl")
