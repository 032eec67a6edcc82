"""A model-free tensor-parallel engine on CPU: vLLM's Scheduler, one ``KVOffloadConnector`` per rank.

Test infrastructure of the replicated-layout tests. :class:`TPEngine` runs vLLM's real Scheduler
(the connector's scheduler role) and ``tp`` worker-role connectors, each with its own CPU KV cache
and its own copy of vLLM's config at its rank, all of one engine (one ``engine_id``: one shared
offload region). vLLM's ``KVOutputAggregator`` folds the ranks' outputs into one, as vLLM's
executor does. Two models, both tiny configs written to a temporary folder:

* ``mla=True``: a DeepSeek-V2 config (MLA). vLLM decides the replicated layout itself
  (``build_offloading_config``: MLA, tensor-parallel > 1, ``kv_tp_replicas == tp``, the ``mp``
  executor, one node); every rank holds the same KV (the latent), as on real MLA ranks.
* ``mla=False``: an OPT config whose heads are split across the ranks: each rank holds different
  KV (its own heads), and vLLM keeps one copy per rank.

The "model" writes, for every scheduled token, a known value per (token id, position, channel)
into each rank's cache; :meth:`TPEngine.check` (run after every step) verifies every computed
position of every running request on every rank.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import tempfile
from typing import Any

import torch
from transformers import DeepseekV2Config, OPTConfig
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MLAAttentionSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 4  # tokens per GPU block
MAX_LEN = 256
LAYER = "model.layers.0.self_attn.attn"
LATENT = 16 + 8  # MLA: kv_lora_rank + qk_rope_head_dim channels per token, every rank
HEADS, HEAD_DIM = 4, 4  # OPT: KV heads of the whole model (split across the ranks), channels per head
SPEC_MODULE = "kvoffload.integrations.vllm"
NULL_BLOCK = 0


def _model_dir(mla: bool) -> str:
    """A tiny model config in one fixed folder per user (written once, atomically)."""
    name = "deepseek-v2-mla" if mla else f"opt-{HEADS}x{HEAD_DIM}"
    d = os.path.join(tempfile.gettempdir(), f"kvoffload-{name}-{os.getuid()}-{MAX_LEN}")
    if not os.path.exists(os.path.join(d, "config.json")):
        tmp = tempfile.mkdtemp(prefix="kvoffload-model-")
        if mla:
            DeepseekV2Config(
                num_hidden_layers=1,
                hidden_size=32,
                num_attention_heads=4,
                num_key_value_heads=4,
                kv_lora_rank=16,
                q_lora_rank=None,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=8,
                intermediate_size=32,
                moe_intermediate_size=16,
                first_k_dense_replace=1,
                vocab_size=1000,
                max_position_embeddings=MAX_LEN,
            ).save_pretrained(tmp)
        else:
            OPTConfig(
                num_hidden_layers=1,
                hidden_size=HEADS * HEAD_DIM,
                num_attention_heads=HEADS,
                ffn_dim=16,
                vocab_size=1000,
                max_position_embeddings=MAX_LEN,
            ).save_pretrained(tmp)
        try:
            os.rename(tmp, d)  # another process may have won
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return d


@functools.lru_cache(maxsize=8)
def _base_config(mla: bool, tp: int) -> VllmConfig:
    d = _model_dir(mla)
    mc = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_LEN, seed=0)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=MAX_LEN, is_encoder_decoder=False)
    sc.async_scheduling = False
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        scheduler_config=sc,
        parallel_config=ParallelConfig(tensor_parallel_size=tp, distributed_executor_backend="mp"),
        device_config=DeviceConfig("cpu"),
    )
    init_none_hash(sha256)
    return vc


def vllm_config(extra: dict[str, Any], tp: int, mla: bool = True, num_gpu_blocks: int = 64) -> VllmConfig:
    """vLLM's config of a ``tp``-way engine with ``KVOffloadConnector`` (a fresh ``engine_id``)."""
    vc = copy.copy(_base_config(mla, tp))
    vc.kv_transfer_config = KVTransferConfig(
        kv_connector="KVOffloadConnector",
        kv_connector_module_path=SPEC_MODULE,
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config=dict(extra),
    )
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.num_gpu_blocks = num_gpu_blocks
    return vc


def at_rank(vc: VllmConfig, rank: int) -> VllmConfig:
    """``vc`` as the worker of ``rank`` sees it."""
    out = copy.copy(vc)
    out.parallel_config = copy.copy(vc.parallel_config)
    out.parallel_config.rank = rank
    return out


def kv_cache_config(tp: int, mla: bool, num_gpu_blocks: int) -> KVCacheConfig:
    """One attention layer: MLA's latent (replicated on every rank) or this rank's share of the heads."""
    if mla:
        spec: Any = MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=LATENT, dtype=torch.float32)
    else:
        spec = FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=HEADS // tp, head_size=HEAD_DIM, dtype=torch.float32
        )
    size = num_gpu_blocks * spec.page_size_bytes
    return KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[
            KVCacheTensor(size=size, layers=[LAYER], layer_stride=size, block_stride=spec.page_size_bytes)
        ],
        kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)],
        kv_tp_replicas=tp if mla else 1,
    )


def offloading_config(vc: VllmConfig, kcc: KVCacheConfig, rank: int) -> Any:
    """vLLM's ``OffloadingConfig`` of ``rank`` (where vLLM decides ``replicated_layout``)."""
    return build_offloading_config(at_rank(vc, rank), kcc)


class TPEngine:
    """vLLM's Scheduler + ``tp`` worker-role connectors + a KV-writing fake model.

    Args:
        extra: ``kv_connector_extra_config``.
        tp: tensor-parallel size (the workers).
        mla: the MLA model (replicated KV) or the head-split one.
        num_gpu_blocks: GPU blocks of every rank.
    """

    def __init__(self, extra: dict[str, Any], tp: int, mla: bool = True, num_gpu_blocks: int = 64) -> None:
        self.tp, self.mla = tp, mla
        self.vllm_config = vllm_config(extra, tp, mla, num_gpu_blocks)
        self.kv_cache_config = kv_cache_config(tp, mla, num_gpu_blocks)
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=BLOCK_SIZE,
            log_stats=True,
        )
        if mla:
            shape: tuple[int, ...] = (num_gpu_blocks, BLOCK_SIZE, LATENT)
        else:
            shape = (num_gpu_blocks, 2, BLOCK_SIZE, HEADS // tp, HEAD_DIM)
        #: each rank's KV cache (its one layer)
        self.kvs = [torch.zeros(shape, dtype=torch.float32) for _ in range(tp)]
        self.ranks: list[Any] = []
        try:
            for r in range(tp):
                c = KVConnectorFactory.create_connector(
                    at_rank(self.vllm_config, r), KVConnectorRole.WORKER, self.kv_cache_config
                )
                self.ranks.append(c)
                c.register_kv_caches({LAYER: self.kvs[r]})
        except Exception:
            self.close()
            raise
        self.aggregator = KVOutputAggregator(expected_finished_count=tp)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.outputs: dict[str, list[int]] = {}
        self.steps = 0

    # ------------------------------------------------------------------ plumbing
    @property
    def manager(self) -> Any:
        return self.scheduler.connector.connector_scheduler.manager

    def worker(self, rank: int) -> Any:
        """kvoffload's worker of ``rank``."""
        return self.ranks[rank].connector_worker.worker

    def spec(self, rank: int) -> Any:
        return self.ranks[rank].connector_worker.spec

    def value(self, token: int, pos: int, rank: int) -> torch.Tensor:
        """The KV ``rank`` holds for ``token`` at ``pos``: one distinct float per channel (MLA: the
        same latent on every rank; otherwise the rank's own heads)."""
        base = float((token * MAX_LEN + pos) * 64)
        if self.mla:
            return base + torch.arange(LATENT, dtype=torch.float32)
        per = HEADS // self.tp
        ch = torch.arange(2 * HEADS * HEAD_DIM, dtype=torch.float32).reshape(2, HEADS, HEAD_DIM)
        return base + ch[:, rank * per : (rank + 1) * per]

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 3) -> None:
        req = Request(
            request_id=req_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.scheduler.add_request(req)
        self.outputs[req_id] = []

    def _blocks(self, req_id: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    def _write(self, rank: int, req_id: str, toks: list[int], start: int, end: int) -> None:
        kv, blocks = self.kvs[rank], self._blocks(req_id)
        for pos in range(start, end):
            b, off = blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            if self.mla:
                kv[b, off] = self.value(toks[pos], pos, rank)
            else:
                kv[b, :, off] = self.value(toks[pos], pos, rank)

    def step(self) -> None:
        sched_out = self.scheduler.schedule()
        meta = sched_out.kv_connector_metadata
        for c in self.ranks:
            c.handle_preemptions(meta)
            c.bind_connector_metadata(meta)
            c.start_load_kv(None)
        req_ids = list(sched_out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            req = self.scheduler.requests[rid]
            n = sched_out.num_scheduled_tokens[rid]
            end = req.num_computed_tokens  # already advanced by schedule()
            toks = req.all_token_ids
            for r in range(self.tp):
                self._write(r, rid, toks, end - n, end)
            sampled.append([(len(toks) * 7 + sum(toks[-3:])) % 1000] if end >= req.num_tokens else [])
        outs: list[ModelRunnerOutput | None] = []
        for c in self.ranks:
            c.wait_for_save()
            sending, recving = c.get_finished(sched_out.finished_req_ids)
            invalid = c.get_block_ids_with_load_errors()
            worker_meta = c.build_connector_worker_meta()
            c.clear_connector_metadata()
            outs.append(
                ModelRunnerOutput(
                    req_ids=req_ids,
                    req_id_to_index={r: i for i, r in enumerate(req_ids)},
                    sampled_token_ids=sampled,
                    kv_connector_output=KVConnectorOutput(
                        finished_sending=sending or None,
                        finished_recving=recving or None,
                        invalid_block_ids=invalid,
                        kv_connector_worker_meta=worker_meta,
                    ),
                )
            )
        out = self.aggregator.aggregate(outs, 0)
        engine_out = self.scheduler.update_from_output(sched_out, out)
        for eco in engine_out.values():
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
        self.steps += 1
        self.check()

    def check(self) -> int:
        """Verify every computed position of every running request on every rank; returns positions checked."""
        n = 0
        for req in self.scheduler.running:
            toks, blocks = req.all_token_ids, self._blocks(req.request_id)
            for pos in range(req.num_computed_tokens):
                b, off = blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
                for r, kv in enumerate(self.kvs):
                    held = kv[b, off] if self.mla else kv[b, :, off]
                    if b == NULL_BLOCK or not torch.equal(held, self.value(toks[pos], pos, r)):
                        raise AssertionError(
                            f"step {self.steps}: request {req.request_id} rank {r} position {pos} holds wrong KV"
                        )
                    n += 1
        return n

    def run(self, max_steps: int = 500) -> None:
        """Step until every request finished, then a few empty steps (store completions)."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                for _ in range(3):
                    self.step()
                return
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps")

    def reset_gpu(self) -> None:
        """Forget the GPU prefix cache and zero every rank's KV (only the CPU tier remains)."""
        assert not self.scheduler.has_unfinished_requests()
        assert self.scheduler.kv_cache_manager.reset_prefix_cache()
        for kv in self.kvs:
            kv.zero_()

    def close(self) -> None:
        """Shut the manager and every rank's worker down (releases the shared region)."""
        self.scheduler.connector.connector_scheduler.manager.shutdown()
        for c in self.ranks:
            if c.connector_worker.worker is not None:
                c.connector_worker.worker.shutdown()


__all__ = ["TPEngine", "BLOCK_SIZE", "kv_cache_config", "offloading_config", "vllm_config", "at_rank"]
