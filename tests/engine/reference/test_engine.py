"""The reference engine under load: every loaded byte is checked; bad input; trace-style requests."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.core.base import ReqContext
from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.request import SimRequest, hash_blocks
from kvoffload.engine.reference.workload import ChatWorkload
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.engine.reference.helpers import make_engine, records, run, tokens


def drive_chat(eng, wl: ChatWorkload, max_waiting: int = 6) -> None:
    """Admit turns in arrival order; a conversation's next turn only after its previous one."""
    pending = wl.turns_in_order()
    done: set[str] = set()
    steps = 0
    while pending or eng.has_unfinished_requests():
        while (
            pending
            and len(eng.waiting) < max_waiting
            and (pending[0].turn == 0 or f"c{pending[0].conversation}-t{pending[0].turn - 1}" in done)
        ):
            eng.add_request(pending.pop(0))
        done.update(eng.step().finished)
        steps += 1
        assert steps < 20_000
    eng.run_until_done()


@pytest.mark.parametrize(
    ("groups", "latency", "cpu_blocks", "policy"),
    [
        ((GroupConfig(8, 2),), 0, 40, "lru"),
        ((GroupConfig(8, 2),), 2, 40, "arc"),
        ((GroupConfig(8, 2),), 1, 40, "s3fifo"),
        (
            (GroupConfig(4, 2, layout="flashinfer"), GroupConfig(4, 2, sliding_window_blocks=2, layout="mla")),
            1,
            48,
            "lru",
        ),
    ],
)
def test_chat_workload_every_loaded_block_is_right(groups, latency, cpu_blocks, policy) -> None:
    wl = ChatWorkload(
        conversations=8, turns=3, system_prompts=2, system_tokens=64, user_tokens=(8, 24), reply_tokens=(4, 12), seed=3
    )
    eng = make_engine(
        groups,
        num_gpu_blocks=48,
        num_cpu_blocks=cpu_blocks,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        transfer_latency_steps=latency,
        cache_policy=policy,
        verify_gpu_hits=True,
    )
    drive_chat(eng, wl)
    s = eng.stats
    assert s.requests_finished == len(wl)
    assert s.loaded_tokens > 0 and s.blocks_loaded > 0 and s.cpu_evictions > 0
    assert s.verified_blocks >= s.blocks_loaded and s.verification_failures == 0
    assert s.verified_gpu_hit_blocks > 0
    assert s.failed_loads == 0 and s.failed_stores == 0
    assert s.bytes_loaded > 0 and s.bytes_stored > 0
    st = eng.manager.get_stats()
    assert st.num_pinned == 0 and st.num_pending == 0 and eng.scheduler.num_in_flight_jobs == 0
    assert 0.0 < s.hit_rate <= 1.0


def run_preempting_chat() -> tuple[Engine, ChatWorkload]:
    """A small chat workload on a GPU cache small enough to preempt, with transfers in flight."""
    wl = ChatWorkload(
        conversations=6, turns=2, system_prompts=1, system_tokens=48, user_tokens=(8, 16), reply_tokens=(16, 24), seed=1
    )
    eng = make_engine(
        [GroupConfig(4, 2)],
        num_gpu_blocks=40,
        num_cpu_blocks=200,
        max_num_batched_tokens=48,
        max_num_seqs=6,
        transfer_latency_steps=2,
    )
    drive_chat(eng, wl)
    return eng, wl


def test_preemptions_under_gpu_pressure_stay_correct() -> None:
    eng, _ = run_preempting_chat()
    s = eng.stats
    assert s.preemptions > 0 and s.flushed_jobs > 0
    assert s.verified_blocks > 0 and s.verification_failures == 0


def test_corrupted_host_pool_is_detected() -> None:
    eng = make_engine([GroupConfig(4, 3)], enable_gpu_prefix_cache=False, max_num_batched_tokens=64)
    p = tokens(36)
    run(eng, SimRequest("a", p))
    slot = records(eng, "a", "store")[0].cpu_slots[1]
    view = eng.worker.host_pool.slot_view(slot)
    view[100] ^= 0xFF  # one byte of offloaded block 1 (GPU blocks 3..5)
    run(eng, SimRequest("b", list(p)))
    assert eng.stats.verified_blocks == 9
    assert eng.stats.verification_failures == 1


def test_trace_style_requests_with_block_hashes() -> None:
    eng = make_engine([GroupConfig(4, 2)], enable_gpu_prefix_cache=False)
    hashes = hash_blocks(tokens(40), 4)
    a = SimRequest("a", None, 3, prompt_block_hashes=hashes, num_prompt_tokens=42)
    b = SimRequest("b", None, 3, prompt_block_hashes=hashes[:8], num_prompt_tokens=33)
    run(eng, a)
    assert a.block_hashes[:10] == hashes and len(a.all_token_ids) == 45
    run(eng, b)
    assert records(eng, "b", "load")[0].block_offsets == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert eng.stats.verified_blocks == 8 and eng.stats.verification_failures == 0
    with pytest.raises(InvalidArgumentError, match="prompt block hashes"):
        make_engine([GroupConfig(4, 2)]).add_request(
            SimRequest("c", None, 0, prompt_block_hashes=hashes, num_prompt_tokens=20)
        )


def test_request_keys_commit_to_the_prefix() -> None:
    a = SimRequest("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], 0)
    b = SimRequest("b", [1, 2, 3, 4, 5, 0, 7, 8, 9], 0)
    a.bind(4)
    b.bind(4)
    assert (a.token_keys[:5] == b.token_keys[:5]).all() and (a.token_keys[5:9] != b.token_keys[5:9]).all()
    assert a.block_hashes[0] == b.block_hashes[0] and a.block_hashes[1] != b.block_hashes[1]
    # appending tokens one by one gives the same hashes and keys as the whole prompt at once
    c = SimRequest("c", [1], 0)
    c.bind(4)
    for t in a.all_token_ids[1:]:
        c.append_output(t)
    assert c.block_hashes == a.block_hashes and (c.token_keys[:9] == a.token_keys[:9]).all()


def test_engine_bad_input() -> None:
    eng = make_engine([GroupConfig(4, 1)], num_gpu_blocks=9)
    eng.add_request(SimRequest("a", tokens(8)))
    with pytest.raises(InvalidArgumentError, match="already added"):
        eng.add_request(SimRequest("a", tokens(8)))
    with pytest.raises(InvalidArgumentError, match="needs 9 GPU blocks"):
        eng.add_request(SimRequest("big", tokens(30), max_tokens=6))
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        SimRequest("x", [1], max_tokens=-1)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        SimRequest("x", None)
    with pytest.raises(InvalidTypeError, match="request_id"):
        SimRequest(3, [1])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="num_gpu_blocks"):
        EngineConfig(num_gpu_blocks=True)
    with pytest.raises(InvalidArgumentError, match="layout"):
        make_engine([GroupConfig(4, 1, layout="paged")])
    with pytest.raises(RuntimeError, match="after 1 steps"):
        eng.run_until_done(max_steps=1)


def test_step_stats_and_chat_turn_input() -> None:
    wl = ChatWorkload(conversations=1, turns=1, system_tokens=20, user_tokens=(4, 4), reply_tokens=(2, 2))
    eng = make_engine([GroupConfig(4, 1)])
    (turn,) = wl.turns_in_order()
    req = eng.add_request(turn)
    s1 = eng.step()
    assert s1.admitted == [turn.request_id] and s1.num_scheduled_tokens == 16 and s1.store_jobs
    assert eng.status_of(turn.request_id) == "running"
    eng.run_until_done()
    assert eng.status_of(turn.request_id) == "finished"
    assert len(req.output_token_ids) == 2 and eng.stats.generated_tokens == 2
    assert eng.stats.prompt_tokens == 24 and eng.stats.requests_finished == 1
    assert eng.manager.lookup(records(eng, kind="store")[0].keys[0], ReqContext()) is True
    d = eng.stats.as_dict()
    assert {"cpu_hit_rate", "gpu_hit_rate", "hit_rate", "verified_blocks"} <= set(d)


@pytest.mark.parametrize("hbs", [1, 2, 4, 16])
def test_appended_tokens_match_a_whole_prompt(hbs: int) -> None:
    toks = tokens(70, seed=hbs)
    whole = SimRequest("w", toks, 0)
    whole.bind(hbs)
    for split in (1, 5, hbs, 33):
        part = SimRequest("p", toks[:split], 0)
        part.bind(hbs)
        for t in toks[split:]:
            part.append_output(t)
        assert part.block_hashes == whole.block_hashes
        assert (part.token_keys[:70] == whole.token_keys[:70]).all()


def test_gpu_hit_verification_detects_a_stale_block() -> None:
    eng = make_engine([GroupConfig(4, 1)], verify_gpu_hits=True, max_num_batched_tokens=64)
    p = tokens(20)
    run(eng, SimRequest("a", p))
    b0 = eng.pools[0].lookup(eng.get_request("a").block_hashes[2])
    # overwrite row 1 of the cached GPU block 2 with the KV of another prefix
    eng.kv.write(0, np.array([b0]), np.array([1]), np.array([12345], dtype=np.uint64))
    run(eng, SimRequest("b", p + [1, 2]))
    assert eng.stats.verified_gpu_hit_blocks == 5
    assert eng.stats.verification_failures == 1


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer", "mla"])
def test_kv_cache_numpy_and_torch_paths_agree(layout: str) -> None:
    import torch

    from kvoffload.engine.reference.kvcache import GroupKVSpec, SimKVCache

    spec = [GroupKVSpec(12, 4, 2, 2, 8, layout)]
    a = SimKVCache(spec, torch.float16, torch.device("cpu"), seed=1)
    b = SimKVCache(spec, torch.float16, torch.device("cpu"), seed=1, cpu_numpy=False)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, 12, dtype=np.uint64)
    blocks = np.array([3, 3, 3, 3, 7, 7, 7, 7, 5, 5, 5, 5])
    offs = np.tile(np.arange(4), 3)
    for kv in (a, b):
        kv.write(0, blocks, offs, keys)
        assert kv.check_blocks(0, [3, 7, 5], keys).all()
        assert kv.check_blocks(0, [7, 3, 5], keys).tolist() == [False, False, True]
    for ta, tb in zip(a.tensors[0], b.tensors[0], strict=True):
        assert torch.equal(ta.view(torch.int16), tb.view(torch.int16))  # raw bits (NaN patterns too)
    # only the written blocks changed
    untouched = [i for i in range(12) if i not in (3, 5, 7)]
    for t in a.tensors[0]:
        v = t.view(torch.int16)
        blocks_view = v[:, untouched] if layout == "flash_attn" else v[untouched]
        assert torch.count_nonzero(blocks_view) == 0
