"""What ``cpu_bytes_to_use`` buys: kvoffload's spec against vLLM's own, table-driven.

For MLA models (vLLM's replicated layout at tensor-parallel > 1: one copy) and head-split models
(one copy per rank), tensor-parallel 1 / 2 / 4 / 8, with and without secondary tiers, KV sizes
that are and are not a whole number of OS pages: ``KVOffloadSpec`` has the same chunk count,
chunk bytes (a page-aligned row, vLLM's ``kv_bytes_per_chunk``), per-worker bytes and
``replicated_layout`` as vLLM's ``CPUOffloadingSpec`` on CUDA (its ``_uses_shared_region``
patched to True, the answer it gives there) or ``TieringOffloadingSpec``; on vLLM 0.33, the same
capacity labels of ``kv_offload_config_info`` too.
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import dataclasses  # noqa: E402
import itertools  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvoffload.integrations.vllm import KVOffloadSpec  # noqa: E402

HAS_MAX_MODEL_LEN = "max_model_len" in {f.name for f in dataclasses.fields(OffloadingModelConfig)}
HAS_CONFIG_INFO = hasattr(CPUOffloadingSpec, "config_info_keys")
GiB = 1 << 30

#: (name, KV bytes of one GPU block on one worker at tensor-parallel tp, MLA, cpu_bytes_to_use)
MODELS: list[tuple[str, Any, bool, int]] = [
    # DeepSeek-V3: 61 layers x 16 tokens x 576 latent channels x 2 bytes, on every rank (274.5 pages)
    ("deepseek-v3-mla", lambda tp: 61 * 16 * 576 * 2, True, 3 * GiB + 12345),
    ("tiny-mla", lambda tp: 4 * 24 * 4, True, 777 * 4096 + 5),  # tests/integrations/tp_engine.py's
    # Llama-3-70B: 80 layers x 16 tokens x (K, V) x 8 KV heads split across the ranks x 128 x 2 bytes
    ("llama-70b", lambda tp: 80 * 16 * 2 * (8 // tp) * 128 * 2, False, 5 * GiB + 999),
    ("odd-pages", lambda tp: 3 * 16 * 2 * 80 * 2 // tp, False, 64 * 4096 * 8 + 17),  # 3.75 pages at tp 1
]
CASES = [
    pytest.param(name, kv(tp), mla, cpu, tp, bpc, tiers, id=f"{name}-tp{tp}-x{bpc}-{'tiers' if tiers else 'pool'}")
    for (name, kv, mla, cpu), tp, bpc, tiers in itertools.product(MODELS, (1, 2, 4, 8), (1, 3), (False, True))
]


def config(kv_bytes: int, mla: bool, cpu_bytes: int, tp: int, blocks_per_chunk: int, tiers: list[Any]) -> Any:
    """vLLM's ``OffloadingConfig`` of rank 0, with the replicated layout as vLLM decides it."""
    model: dict[str, Any] = {"name": "m", "dtype": "bfloat16"}
    if HAS_MAX_MODEL_LEN:
        model["max_model_len"] = 32768
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer",), group_id=0),),
        worker_kv_bytes_per_block=kv_bytes,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": cpu_bytes, "secondary_tiers": tiers},
        engine_id="capacity",
        model=OffloadingModelConfig(**model),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=tp,
            tp_size=tp,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=0,
            is_parallelism_agnostic=False,
        ),
        replicated_layout=mla and tp > 1,
    )


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU spec as it sizes its pool on CUDA (its shared region: the replicated layout on)."""
    monkeypatch.setattr(CPUOffloadingSpec, "_uses_shared_region", lambda self: True)


@pytest.mark.usefixtures("on_cuda")
@pytest.mark.parametrize("name, kv_bytes, mla, cpu_bytes, tp, blocks_per_chunk, tiers", CASES)
def test_capacity_equals_vllms(
    name: str, kv_bytes: int, mla: bool, cpu_bytes: int, tp: int, blocks_per_chunk: int, tiers: bool, tmp_path: Path
) -> None:
    tier_list = [{"type": "fs", "root_dir": str(tmp_path)}] if tiers else []
    cfg = config(kv_bytes, mla, cpu_bytes, tp, blocks_per_chunk, tier_list)
    theirs: Any = (TieringOffloadingSpec if tiers else CPUOffloadingSpec)(cfg)
    ours = KVOffloadSpec(cfg)
    facts = ("replicated_layout", "num_chunks", "kv_bytes_per_chunk", "cpu_page_size_per_worker")
    assert {f: getattr(ours, f) for f in facts} == {f: getattr(theirs, f) for f in facts}
    assert ours.replicated_layout is (mla and tp > 1)
    assert ours.chunk_bytes == theirs.kv_bytes_per_chunk
    if HAS_CONFIG_INFO and not tiers:  # vLLM 0.33's capacity labels (with tiers: the same two numbers)
        want = theirs.get_manager().config_info()[0]
        got = ours.get_manager().config_info()[0]
        assert {k: got[k] for k in want} == want


def test_replicated_layout_is_not_narrowed_to_cuda() -> None:
    """vLLM's CPU spec turns the layout off where its worker keeps a private tensor (here: vLLM's
    CPU platform); kvoffload's workers always share the region, so it stays on, one copy."""
    cfg = config(61 * 16 * 576 * 2, True, 3 * GiB, 8, 1, [])
    theirs, ours = CPUOffloadingSpec(cfg), KVOffloadSpec(cfg)
    assert theirs.replicated_layout is False and ours.replicated_layout is True
    assert ours.num_chunks == 3 * GiB // 1126400  # one copy: 1124352 bytes rounded up to 275 pages
    assert theirs.num_chunks == 3 * GiB // (8 * 1124352)  # eight copies (a whole number of pages)


def capacity_table() -> str:
    """The chunks ``cpu_bytes_to_use`` buys, kvoffload's spec beside vLLM's CPU spec on CUDA, for
    the table's models at tensor-parallel 1 / 2 / 4 / 8 (no tiers, one GPU block a chunk), and what
    one copy per rank held (kvoffload before it stored the replicated layout once): what
    docs/vllm.md shows, printed by ``python -m tests.integrations.test_vllm_replicated_capacity``."""
    real = CPUOffloadingSpec._uses_shared_region
    CPUOffloadingSpec._uses_shared_region = lambda self: True  # type: ignore[method-assign]
    try:
        lines = [
            "| model | cpu_bytes_to_use | TP | replicated | kvoffload chunks | vLLM chunks | a copy per rank |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, kv, mla, cpu in MODELS:
            for tp in (1, 2, 4, 8):
                cfg = config(kv(tp), mla, cpu, tp, 1, [])
                ours, theirs = KVOffloadSpec(cfg), CPUOffloadingSpec(cfg)
                lines.append(
                    f"| {name} | {cpu:,} | {tp} | {'yes' if ours.replicated_layout else 'no'} | "
                    f"{ours.num_chunks:,} | {theirs.num_chunks:,} | {cpu // (kv(tp) * tp):,} |"
                )
        return "\n".join(lines)
    finally:
        CPUOffloadingSpec._uses_shared_region = real  # type: ignore[method-assign]


if __name__ == "__main__":
    print(capacity_table())
