"""The policy contract's workload tags: a policy that sets ``uses_workload`` reads the tag of the
request each call is made for; any other policy is never told."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.policies.base import available_policies
from kvoffload.cache.policies.lru import LRUPolicy
from kvoffload.core.base import ReqContext, make_offload_key


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


class TagRecorder(LRUPolicy):
    """LRU that notes the tag it saw at each call."""

    uses_workload = True
    takes_lists = False

    def __init__(self, capacity: int, table: Any) -> None:
        super().__init__(capacity, table)
        self.seen: list[tuple[str, str | None]] = []

    def insert(self, slots: Any, keys: Sequence[bytes]) -> None:
        self.seen.append(("insert", self.workload))
        super().insert(slots, keys)

    def touch(self, keys: Sequence[bytes], slots: Any, unique: bool = False) -> None:
        self.seen.append(("touch", self.workload))
        super().touch(keys, slots, unique)

    def evict(self, n: int, protected: Any) -> Any:
        self.seen.append(("evict", self.workload))
        return super().evict(n, protected)

    def on_request_finished(self, keys: Sequence[bytes], slots: Any, inserted_only: Any, reused: Any) -> None:
        self.seen.append(("finished", self.workload))
        super().on_request_finished(keys, slots, inserted_only, reused)


def test_a_policy_that_uses_tags_sees_each_requests_tag() -> None:
    m = CPUOffloadingManager(2, cache_policy=f"{__name__}:TagRecorder", record_requests=True)
    p = m.policy
    assert isinstance(p, TagRecorder)
    text = ReqContext("a", workload="text/1")
    vllm_style = ReqContext("b", {"kv_workload": "file/2"})
    plain = ReqContext("c")
    m.on_new_request(text)
    out = m.prepare_store([key(1), key(2)], text)
    assert out is not None
    m.complete_store(out.keys_to_store, text)
    m.touch([key(1)], vllm_style)
    m.prepare_store([key(3)], plain)  # evicts one block for the untagged request
    m.on_request_finished(text)
    assert p.seen == [
        ("insert", "text/1"),
        ("touch", "file/2"),
        ("evict", None),
        ("insert", None),
        ("finished", "text/1"),
        ("touch", "text/1"),  # the default on_request_finished touches
    ]


def test_policies_that_ignore_tags_are_never_told() -> None:
    """Every registered policy but those that opt in: tagged calls leave no ``workload`` on it and
    decide exactly as untagged calls do."""
    for name in available_policies():
        tagged = CPUOffloadingManager(8, cache_policy=name)
        if tagged.policy.uses_workload:
            continue
        plain = CPUOffloadingManager(8, cache_policy=name)
        rng = np.random.default_rng(3)
        for i in range(200):
            keys = [key(int(k)) for k in dict.fromkeys(rng.integers(0, 30, size=4).tolist())]
            outs = []
            for m, ctx in ((tagged, ReqContext(f"r{i}", workload=f"t/{i % 3}")), (plain, ReqContext(f"r{i}"))):
                m.touch(keys, ctx)
                out = m.prepare_store(keys, ctx)
                if out is not None:
                    m.complete_store(out.keys_to_store, ctx)
                outs.append(None if out is None else (out.keys_to_store, out.evicted_keys))
            assert outs[0] == outs[1], name
        assert "workload" not in vars(tagged.policy), name
