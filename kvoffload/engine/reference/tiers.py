"""Secondary tiers for the reference engine: its namespace and the tiers over its host pool.

The engine's KV bytes are a function of the tokens, their positions and ``EngineConfig.seed``
(:mod:`kvoffload.engine.reference.kvcache`), so two engine processes with the same configuration write the
same bytes for the same prefix, and each can verify what the other stored. The namespace below
names exactly that: the seed is the "model".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvoffload.engine.reference.config import EngineConfig
from kvoffload.engine.tiered import TieredManager
from kvoffload.engine.tiered_options import TieredOptions
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.tiers import Tier, TierNamespace, TierSpec, check_tier_spec, open_tier
from kvoffload.tiers.health import check_at_start

__all__ = ["engine_namespace", "check_tier_specs", "open_engine_tiers", "tiered_manager"]


def engine_namespace(cfg: EngineConfig, tag: str = "") -> TierNamespace:
    """The :class:`TierNamespace` of the reference engine's records under ``cfg``.

    Every field that changes the bytes of a host record is in it: the KV "weights" (the seed), the
    dtype, each group's layout, layers, block size and block size factor, heads and head size, the
    hash block size, and the block-hash algorithm of :mod:`kvoffload.engine.reference.request`.
    """
    groups = cfg.groups
    if len({(g.gpu_block_size * g.block_size_factor) for g in groups}) != 1:
        raise InvalidArgumentError("tiers need every group to have the same offloaded block size (tokens)")
    dtype = str(cfg.dtype).removeprefix("torch.")
    return TierNamespace(
        model_id=f"kvoffload-sim-kv/seed={cfg.seed}",
        k_dtype=dtype,
        v_dtype=dtype,
        layout="+".join(g.layout for g in groups),
        page_geometry=(cfg.num_heads, cfg.head_dim, *(d for g in groups for d in (g.num_layers, g.gpu_block_size))),
        tokens_per_block=groups[0].offloaded_block_size,
        gpu_blocks_per_block=max(g.block_size_factor for g in groups),
        groups=tuple(
            "full" if g.sliding_window_blocks is None else f"window={g.sliding_window_blocks}" for g in groups
        ),
        hash_algo=f"blake2b-16-chained/{cfg.scheduler_config().effective_hash_block_size}",
        tag=tag,
    )


def check_tier_specs(specs: Sequence[TierSpec]) -> None:
    """Check every tier spec's syntax and options before anything is allocated (typed errors
    naming the spec; nothing connects; see :mod:`kvoffload.tiers.registry`)."""
    if isinstance(specs, str):
        raise InvalidTypeError("tiers must be a list of tier specs, not a single str")
    for spec in specs:
        check_tier_spec(spec)


def open_engine_tiers(
    specs: Sequence[TierSpec], records: Any, cfg: EngineConfig, options: dict[str, Any] | None = None
) -> list[Tier]:
    """Open one tier per spec (``redis://…``, ``disk:/path…``, any registered scheme or
    ``{"type", "module_path", …}``; see :func:`kvoffload.tiers.open_tier`)
    over ``records`` (the host pool's ``(num_slots, slot_bytes)`` uint8 view), each checked as
    :func:`~kvoffload.tiers.health.check_at_start` does (a store that does not answer starts
    degraded). On an error the tiers already opened are closed."""
    if isinstance(records, torch.Tensor):
        records = records.numpy()
    ns = engine_namespace(cfg)
    tiers: list[Tier] = []
    try:
        for spec in specs:
            tier = open_tier(spec, records, ns, **(options or {}))
            tiers.append(tier)
            check_at_start(tier)  # a misconfigured store stops the start; one that is down starts degraded
    except BaseException:
        for t in tiers:
            t.close()
        raise
    return tiers


def tiered_manager(
    manager: Any,
    worker: Any,
    specs: Sequence[TierSpec],
    cfg: EngineConfig,
    options: dict[str, Any] | None = None,
    tiered: TieredOptions | None = None,
) -> TieredManager:
    """``manager`` wrapped in a :class:`TieredManager` (its options: ``tiered``) over one tier per
    spec, opened on ``worker``'s host pool records (the worker needs a ``host_pool``: its records
    are what tiers move)."""
    pool = getattr(worker, "host_pool", None)
    if pool is None:
        raise InvalidArgumentError("tiers need a worker with a host_pool (its records are what tiers move)")
    keywords = tiered.keywords() if tiered is not None else {}
    return TieredManager(manager, open_engine_tiers(list(specs), pool.records(), cfg, options), **keywords)
