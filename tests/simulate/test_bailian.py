"""The Bailian trace reader on small files written from the documented format: keys, tags, errors
(FILE:LINE and the field), detection, and the tag reaching the manager's request context."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import kvoffload.simulate.cache_replay as cache_replay
from kvoffload.app.cli import main
from kvoffload.core.base import ReqContext, workload_tag
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.bailian import BailianRequest, generate_bailian_trace, read_bailian_trace, write_bailian_trace
from kvoffload.simulate.block_trace import BlockTrace
from kvoffload.simulate.cache_cli import block_trace_of
from kvoffload.simulate.cache_replay import replay_cache
from kvoffload.simulate.mooncake import MooncakeRequest, detect_trace_format


def line(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "chat_id": 1,
        "parent_chat_id": -1,
        "timestamp": 0.5,
        "input_length": 40,
        "output_length": 7,
        "type": "text",
        "turn": 1,
        "hash_ids": [10, 11, 12],
    }
    obj.update(over)
    return obj


def write(tmp_path: Path, *objs: dict[str, Any]) -> Path:
    p = tmp_path / "bailian.jsonl"
    p.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return p


def test_reads_requests_tags_and_keys(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        line(),
        line(chat_id=2, parent_chat_id=1, timestamp=2, input_length=64, turn=2, hash_ids=[10, 11, 12, 13]),
        line(chat_id=3, timestamp=2.25, type="image", input_length=16, hash_ids=[99]),
    )
    reqs = read_bailian_trace(p)
    assert [r.tag for r in reqs] == ["text/1", "text/2", "image/1"]
    assert [r.timestamp for r in reqs] == [500.0, 2000.0, 2250.0]
    assert (reqs[1].chat_id, reqs[1].parent_chat_id, reqs[1].line) == (2, 1, 2)
    assert detect_trace_format(p) == "bailian"
    # the same prompts as a Mooncake trace with 16-token blocks: same keys
    plain = [MooncakeRequest(r.timestamp, r.input_length, r.output_length, r.hash_ids) for r in reqs]
    bt = block_trace_of(list(reqs), 32, 16)
    ref = BlockTrace.from_mooncake(plain, 16, 32)
    assert bt.keys == ref.keys and bt.ids.tolist() == ref.ids.tolist()
    assert bt.tags == ("text/1", "text/2", "image/1") and ref.tags is None
    # 32-token blocks: the second request's first block is the first's (10, 11 -> piece 11's key)
    assert bt.ids[bt.starts[1]] == bt.ids[bt.starts[0]]


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (line(chat_id="7"), "chat_id"),
        (line(parent_chat_id=-2), "parent_chat_id"),
        (line(timestamp=-1), "timestamp"),
        (line(input_length=0), "input_length"),
        (line(output_length=None), "output_length"),
        (line(type=""), "type"),
        (line(turn=0), "turn"),
        (line(turn=True), "turn"),
        (line(hash_ids=[1, 2]), "hash_ids"),
        (line(hash_ids=[1, 1, 2]), "hash_ids"),
        (line(hash_ids="1,2,3"), "hash_ids"),
        (line(extra=1), "extra"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, obj: dict[str, Any], field: str) -> None:
    p = write(tmp_path, line(), obj)
    with pytest.raises(InvalidArgumentError, match=rf"{p}:2: .*'{field}'"):
        read_bailian_trace(p)


def test_missing_field_late_timestamp_and_bad_json(tmp_path: Path) -> None:
    obj = line()
    del obj["turn"]
    p = write(tmp_path, line(), obj)
    with pytest.raises(InvalidArgumentError, match=rf"{p}:2: missing field 'turn'"):
        read_bailian_trace(p)
    p = write(tmp_path, line(timestamp=3), line(timestamp=2))
    with pytest.raises(InvalidArgumentError, match=rf"{p}:2: field 'timestamp' 2 is before"):
        read_bailian_trace(p)
    p.write_text(json.dumps(line()) + "\n{not json\n")
    with pytest.raises(InvalidArgumentError, match=rf"{p}:2: not valid JSON"):
        read_bailian_trace(p)
    p.write_text("")
    with pytest.raises(InvalidArgumentError, match="holds no request"):
        read_bailian_trace(p)


def test_replay_passes_the_tag_as_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = write(
        tmp_path, line(), line(chat_id=2, timestamp=1, turn=2, type="file", input_length=48, hash_ids=[10, 11, 12])
    )
    seen: list[str | None] = []

    class Recording(ReqContext):
        def __init__(self, req_id: str = "", kv_transfer_params: Any = None, workload: str | None = None) -> None:
            super().__init__(req_id, kv_transfer_params, workload)
            seen.append(workload_tag(self))

    monkeypatch.setattr(cache_replay, "ReqContext", Recording)
    bt = block_trace_of(list(read_bailian_trace(p)), 16, 16)
    r = cache_replay.replay_cache(bt, "headstart", 8)
    assert seen[-2:] == ["text/1", "file/2"]
    assert r.hit_blocks == 2  # the second request finds the first's two full blocks (its last is computed)


def test_workload_tag_from_either_context() -> None:
    assert workload_tag(ReqContext("a")) is None
    assert workload_tag(ReqContext("a", workload="search/3")) == "search/3"
    assert workload_tag(ReqContext("a", {"kv_workload": "text/1"})) == "text/1"
    assert workload_tag(ReqContext("a", {"kv_workload": 5})) is None

    class VLLMContext:  # an engine's own context: req_id and kv_transfer_params only
        req_id = "b"
        kv_transfer_params = {"kv_workload": "image/2"}

    assert workload_tag(VLLMContext()) == "image/2"


def test_simulate_reads_a_bailian_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objs = [
        line(chat_id=i, timestamp=i, turn=1 + i % 3, input_length=16 * (4 + i % 5), hash_ids=list(range(4 + i % 5)))
        for i in range(30)
    ]
    p = write(tmp_path, *objs)
    argv = ["simulate", "--trace", str(p), "--replay", "cache", "--jobs", "1", "--block-size", "32"]
    rc = main([*argv, "--capacities", "4,16", "--policies", "lru,headstart", "--out", str(tmp_path / "out")])
    assert rc == 0
    assert "Bailian trace" in capsys.readouterr().out
    assert main([*argv, "--trace-format", "bailian", "--trace-block-size", "512"]) == 2
    assert isinstance(read_bailian_trace(p)[0], BailianRequest)


def test_generated_trace_round_trips_and_follows_its_shapes(tmp_path: Path) -> None:
    """The generated trace is written in the format the reader takes, unchanged by the round trip;
    every conversation continues its parent's prompt; image conversations have exactly two turns,
    searches one, and each search starts with one of the shared tool prompts."""
    reqs = generate_bailian_trace(600, seed=4)
    assert generate_bailian_trace(600, seed=4) == reqs
    p = tmp_path / "gen.jsonl"
    write_bailian_trace(p, reqs)
    assert read_bailian_trace(p) == reqs
    by_id = {r.chat_id: r for r in reqs}
    turns: dict[str, set[int]] = {}
    for r in reqs:
        turns.setdefault(r.type, set()).add(r.turn)
        assert r.input_length == 16 * len(r.hash_ids)
        if r.parent_chat_id >= 0:
            parent = by_id[r.parent_chat_id]
            assert (parent.type, parent.turn + 1) == (r.type, r.turn)
            assert r.hash_ids[: len(parent.hash_ids)] == parent.hash_ids and len(r.hash_ids) > len(parent.hash_ids)
        else:
            assert r.turn == 1
    assert turns["image"] == {1, 2} and turns["search"] == {1} and max(turns["text"]) >= 3
    tools = {r.hash_ids[:32] for r in reqs if r.type == "search"}
    assert 1 < len(tools) <= 8


def test_tagged_headstart_never_far_below_lru_on_the_generated_trace() -> None:
    """The issue's robustness bound with tags: at capacities from well below to about the working
    set, headstart with the requests' tags is never more than 0.5 point of prompt tokens below LRU,
    and somewhere the tags gain over the same policy without them."""
    tagged = block_trace_of(list(generate_bailian_trace(2000, seed=1)), 512, 16)
    untagged = replace(tagged, tags=None)
    lists = tagged.key_lists()
    gains = []
    for frac in (0.02, 0.05, 0.1, 0.4):
        cap = max(4, round(tagged.num_blocks * frac))
        lru = replay_cache(untagged, "lru", cap, lists).hit_rate
        with_tags = replay_cache(tagged, "headstart", cap, lists).hit_rate
        without = replay_cache(untagged, "headstart", cap, lists).hit_rate
        assert with_tags >= lru - 0.005, (cap, with_tags, lru)
        gains.append(with_tags - without)
    assert max(gains) > 0.005, gains
