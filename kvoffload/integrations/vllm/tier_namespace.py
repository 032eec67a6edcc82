"""The :class:`~kvoffload.tiers.TierNamespace` of a vLLM deployment, from vLLM's ``OffloadingConfig``.

Two engines read each other's tier values only when everything that shapes a host record's bytes
is the same: the model, the KV dtype, the KV-cache layout and who wrote the record (vLLM's own CPU
worker and kvoffload's worker lay a chunk out differently), the record size, the block geometry
(tokens per hash, GPU blocks per chunk), every KV-cache group (tokens per block and layer names),
the parallel layout (tensor, pipeline, prefill- and decode-context parallel sizes; a record holds
every worker's part of a chunk), the block-hash algorithm and seed, and an optional tenant tag.
"""

from __future__ import annotations

import os
from typing import Any

from kvoffload.errors import InvalidTypeError
from kvoffload.tiers import TierNamespace

__all__ = ["namespace_from_offloading_spec", "VLLM_CPU_LAYOUT", "KVOFFLOAD_LAYOUT"]

#: ``host_layout`` of a record written by vLLM's own CPU worker (``TieringOffloadingSpec``).
VLLM_CPU_LAYOUT = "vllm-cpu"
#: ``host_layout`` of a record written by kvoffload's worker (``KVOffloadSpec``).
KVOFFLOAD_LAYOUT = "kvoffload"


def namespace_from_offloading_spec(
    offloading_spec: Any,
    record_bytes: int,
    *,
    hash_algo: str = "sha256",
    tag: str = "",
) -> TierNamespace:
    """The namespace of the records behind ``offloading_spec`` (a vLLM ``OffloadingSpec``).

    Args:
        offloading_spec: the spec whose ``config`` (vLLM's ``OffloadingConfig``) describes the
            deployment; its ``host_layout`` attribute, when present, names the record layout
            (default :data:`VLLM_CPU_LAYOUT`).
        record_bytes: bytes of one host record (one row of the primary memoryview).
        hash_algo: vLLM's ``prefix_caching_hash_algo`` (not part of ``OffloadingConfig``).
        tag: tenant / adapter tag keeping otherwise identical deployments apart.
    """
    for name, v in (("hash_algo", hash_algo), ("namespace_tag", tag)):
        if not isinstance(v, str):
            raise InvalidTypeError(f"secondary tier option {name!r} must be a str, got {type(v).__name__}")
    config = offloading_spec.config
    par = config.parallel
    host_layout = str(getattr(offloading_spec, "host_layout", VLLM_CPU_LAYOUT))
    layout = ";".join(
        (
            host_layout,
            f"kv_cache_layout={config.kv_cache_layout or 'default'}",
            f"canonical={int(bool(config.canonical_layout))}",
            f"replicated={int(bool(config.replicated_layout))}",
            f"pcp={par.pcp_size};dcp={par.dcp_size};world={par.world_size}",
        )
    )
    groups = tuple(f"{g.group_id}:{g.tokens_per_block}:{','.join(g.layer_names)}" for g in config.groups) or ("none",)
    tokens_per_block = max((g.tokens_per_block for g in config.groups), default=1) * config.cache.blocks_per_chunk
    return TierNamespace(
        model_id=str(config.model.name),
        k_dtype=str(config.model.dtype),
        v_dtype=str(config.model.dtype),
        layout=layout,
        page_geometry=(int(record_bytes), max(1, int(config.worker_kv_bytes_per_block)), config.cache.tokens_per_hash),
        tokens_per_block=max(1, int(tokens_per_block)),
        gpu_blocks_per_block=int(config.cache.blocks_per_chunk),
        groups=groups,
        tp_size=int(par.tp_size),
        pp_size=int(par.pp_size),
        rank=None,
        hash_algo=hash_algo,
        hash_seed=os.environ.get("PYTHONHASHSEED", ""),
        tag=tag,
    )
