"""How finished requests were served adds up: prompt = GPU hits + CPU loads + prefill computed.

The references are independent of the engine's counters: prompt lengths and decode lengths come
from the workload itself (a request decoding ``m`` tokens computes ``m - 1`` of them in decode
steps: the first is sampled at the end of its prefill, the last is never fed back).
"""

from __future__ import annotations

from kvoffload.engine.reference.config import GroupConfig
from kvoffload.engine.reference.stats import EngineStats
from kvoffload.engine.reference.workload import ChatWorkload
from tests.engine.reference.helpers import make_engine
from tests.engine.reference.test_engine import drive_chat, run_preempting_chat


def _check_sums(s: EngineStats, wl: ChatWorkload) -> None:
    prompt = sum(len(t.prompt_token_ids) for t in wl)
    assert s.requests_finished == len(wl)
    assert s.prompt_tokens == prompt
    assert s.prefill_gpu_hit_tokens + s.prefill_loaded_tokens + s.prefill_computed_tokens == (
        prompt + s.readmitted_output_tokens
    )
    assert s.served_tokens == prompt + s.readmitted_output_tokens
    assert s.decode_tokens + s.readmitted_output_tokens == sum(t.max_tokens - 1 for t in wl)
    assert s.computed_tokens == s.prefill_computed_tokens + s.decode_tokens + s.discarded_tokens
    assert s.generated_tokens >= sum(t.max_tokens for t in wl)
    assert 0 < s.prefill_loaded_tokens <= s.loaded_tokens


def test_rows_add_up_without_preemption() -> None:
    wl = ChatWorkload(conversations=12, turns=3, system_prompts=2, system_tokens=40, seed=3)
    eng = make_engine(
        [GroupConfig(8, 2)], num_gpu_blocks=80, num_cpu_blocks=300, max_num_batched_tokens=64, max_num_seqs=2
    )
    drive_chat(eng, wl)
    s = eng.stats
    assert s.preemptions == 0 and s.readmitted_output_tokens == 0 and s.discarded_tokens == 0
    assert s.prefill_gpu_hit_tokens > 0
    _check_sums(s, wl)


def test_rows_add_up_with_preemptions() -> None:
    eng, wl = run_preempting_chat()
    s = eng.stats
    assert s.preemptions > 0 and s.discarded_tokens > 0
    _check_sums(s, wl)
