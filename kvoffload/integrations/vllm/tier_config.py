"""``secondary_tiers`` of ``KVOffloadSpec``: checked at start, the same way vLLM's own spec reads them.

Each entry is resolved through vLLM's ``SecondaryTierFactory`` (vLLM's ``fs``, ``obj``, ``p2p``,
``kvcr``, ``example``, or an out-of-tree class with ``module_path``, e.g. kvoffload's
``KVOffloadRedisTier``). A top-level ``backpressure`` dict is merged under each tier's own, field
by field, as vLLM's ``TieringOffloadingSpec`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["secondary_tier_configs", "tier_classes", "tiering_manager_options"]


def secondary_tier_configs(extra: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Copies of ``extra["secondary_tiers"]`` (``[]`` when absent), each with its type resolved.

    Raises:
        InvalidArgumentError (a ``ValueError``): not a list, an entry that is not a dict with a
            ``type``, a type vLLM's factory cannot resolve, a ``backpressure`` that is not a dict.
    """
    raw = extra.get("secondary_tiers", [])
    if not isinstance(raw, list):
        raise InvalidArgumentError(
            "kv_connector_extra_config['secondary_tiers'] must be a list of tier configurations "
            f"(dicts with a 'type'), got {type(raw).__name__} {raw!r}"
        )
    defaults = extra.get("backpressure")
    if defaults is not None and not isinstance(defaults, dict):
        raise InvalidArgumentError(f"kv_connector_extra_config['backpressure'] must be a dict, got {defaults!r}")
    out = []
    for i, cfg in enumerate(raw):
        where = f"kv_connector_extra_config['secondary_tiers'][{i}]"
        if not isinstance(cfg, dict) or not cfg.get("type"):
            raise InvalidArgumentError(f"{where} must be a dict with a 'type', got {cfg!r}")
        try:
            SecondaryTierFactory.get_tier_class(cfg)
        except (ValueError, ImportError, AttributeError, AssertionError) as exc:
            raise InvalidArgumentError(f"{where}: {exc or 'not a SecondaryTierManager'}") from None
        cfg = dict(cfg)
        own = cfg.get("backpressure")
        if own is not None and not isinstance(own, dict):
            raise InvalidArgumentError(f"{where}['backpressure'] must be a dict, got {own!r}")
        if defaults or own is not None:
            cfg["backpressure"] = {**(defaults or {}), **(own or {})}
        out.append(cfg)
    return out


def tier_classes(configs: list[dict[str, Any]]) -> list[Any]:
    """The ``SecondaryTierManager`` class of each (already checked) configuration."""
    return [SecondaryTierFactory.get_tier_class(cfg) for cfg in configs]


def tiering_manager_options(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The options of vLLM's ``TieringOffloadingManager`` that ``extra`` sets, as vLLM's own
    tiering spec reads them: ``tier_poll_interval_s`` (vLLM 0.33's tier-polling thread).

    Raises:
        InvalidArgumentError: ``tier_poll_interval_s`` on a vLLM without that thread (0.32).
        InvalidTypeError: ``tier_poll_interval_s`` not a number.
    """
    if "tier_poll_interval_s" not in extra:
        return {}
    where = "kv_connector_extra_config['tier_poll_interval_s']"
    if "tier_poll_interval_s" not in inspect.signature(TieringOffloadingManager.__init__).parameters:
        raise InvalidArgumentError(f"{where}: this vLLM's tiering manager has no tier-polling thread (vLLM 0.33 has)")
    value = extra["tier_poll_interval_s"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{where} must be a number of seconds, got {value!r}")
    return {"tier_poll_interval_s": float(value)}
