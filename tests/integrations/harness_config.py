"""The vLLM configuration of the harness (:mod:`tests.integrations.vllm_harness`): a tiny OPT-shaped
text-generation model (its config written to a temporary folder, nothing downloaded), the
scheduler's limits, and the connector's ``kv_transfer_config``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
import tempfile
from typing import Any

import torch
from transformers import OPTConfig
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash

from tests.integrations.harness_model import HEAD_DIM, HEADS, MAX_LEN

BLOCK_SIZE = 4  # tokens per GPU block
PAGE = 2 * BLOCK_SIZE * HEADS * HEAD_DIM * 4  # bytes of one GPU block: 2 (K, V) * 4 tokens * 2 heads * 4 dims * 4 bytes

SPEC_MODULE = "kvoffload.integrations.vllm"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the engine runs: tokens per GPU block, the longest request, the scheduler's limits, and
    the KV of one token in one layer (``kv_heads`` heads of ``head_dim`` channels of ``kv_dtype``;
    :meth:`~tests.integrations.vllm_harness.Engine.check` needs the defaults, which :func:`kv_value` writes)."""

    block_size: int = BLOCK_SIZE
    max_len: int = MAX_LEN
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 64
    kv_heads: int = HEADS
    head_dim: int = HEAD_DIM
    kv_dtype: torch.dtype = torch.float32

    @property
    def page(self) -> int:
        """Bytes of one GPU block (K and V of every head)."""
        return 2 * self.block_size * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    @property
    def checkable(self) -> bool:
        """Whether :func:`kv_value` fits this shape's KV (what ``check_kv`` needs)."""
        return (self.kv_heads, self.head_dim, self.kv_dtype) == (HEADS, HEAD_DIM, torch.float32) and (
            self.max_len <= MAX_LEN
        )


#: the harness's default shape (4-token blocks, 256 tokens at most, 16 sequences of 64 tokens a step)
DEFAULT_SHAPE = Shape()


@functools.lru_cache(maxsize=8)
def _base_config(shape: Shape) -> VllmConfig:
    # one fixed folder per user: engines in several processes name the same model (the model name
    # is part of a shared tier's namespace)
    heads = shape.kv_heads
    d = os.path.join(tempfile.gettempdir(), f"kvoffload-opt-{os.getuid()}-{shape.max_len}-{heads}x{shape.head_dim}")
    if not os.path.exists(os.path.join(d, "config.json")):
        tmp = tempfile.mkdtemp(prefix="kvoffload-opt-")
        OPTConfig(
            num_hidden_layers=1,
            hidden_size=heads * shape.head_dim,
            num_attention_heads=heads,
            ffn_dim=16,
            vocab_size=1000,
            max_position_embeddings=shape.max_len,
        ).save_pretrained(tmp)
        try:
            os.rename(tmp, d)  # atomic; another process may have won
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    # a text-generation model (the config names no architecture, and vLLM would take OPTModel for a
    # pooling model: no token sampled per step, no async placeholders)
    mc = ModelConfig(
        model=d,
        tokenizer=d,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=shape.max_len,
        seed=0,
        runner="generate",
    )
    sc = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_len,
        is_encoder_decoder=False,
    )
    sc.async_scheduling = False
    kt = KVTransferConfig(kv_connector="KVOffloadConnector", kv_connector_module_path=SPEC_MODULE, kv_role="kv_both")
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True),
        scheduler_config=sc,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kt,
    )
    init_none_hash(sha256)
    return vc


def make_config(
    extra: dict[str, Any],
    connector: str | None = "KVOffloadConnector",
    shape: Shape = DEFAULT_SHAPE,
    async_scheduling: bool = False,
) -> VllmConfig:
    """A VllmConfig whose connector is ``connector`` with ``kv_connector_extra_config=extra`` (None:
    no KV connector, vLLM without offloading), and ``scheduler_config.async_scheduling`` as given
    (set after vLLM's CPU platform turned it off)."""
    vc = copy.copy(_base_config(shape))
    if async_scheduling:
        vc.scheduler_config = copy.copy(vc.scheduler_config)
        vc.scheduler_config.async_scheduling = True
    if connector is None:
        vc.kv_transfer_config = None
        return vc
    module = SPEC_MODULE if connector == "KVOffloadConnector" else None
    vc.kv_transfer_config = KVTransferConfig(
        kv_connector=connector,
        kv_connector_module_path=module,
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config=dict(extra),
    )
    return vc


__all__ = ["BLOCK_SIZE", "DEFAULT_SHAPE", "PAGE", "SPEC_MODULE", "Shape", "make_config"]
