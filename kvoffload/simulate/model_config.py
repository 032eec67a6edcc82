"""KV bytes per token from a model's own Hugging Face ``config.json`` (``kvoffload simulate --model-config``).

Read from the file on disk (nothing is downloaded); a multimodal config's ``text_config`` is used
when present. Three layouts:

* **GQA / MHA** (the default): every layer keeps K and V of ``num_key_value_heads`` heads (default
  ``num_attention_heads``) of ``head_dim`` channels (default ``hidden_size / num_attention_heads``):
  ``2 * kv_heads * head_dim`` values per token and layer;
* **MLA** (``kv_lora_rank`` present, DeepSeek-V2/V3-style): every layer keeps one compressed latent
  of ``kv_lora_rank`` channels plus the shared rotary key of ``qk_rope_head_dim`` channels:
  ``kv_lora_rank + qk_rope_head_dim`` values per token and layer;
* **sliding-window hybrids**: layers listed as ``"sliding_attention"`` in ``layer_types``, or, without
  that list, all but every ``sliding_window_pattern``-th layer (Gemma-style), or the layers from
  ``max_window_layers`` on when ``use_sliding_window`` is set (Qwen2-style). Their KV is counted
  per token like the full layers' (an offloaded block holds every layer's KV of its tokens, as a
  prefix cache stores it); :attr:`ConfigShape.sliding_share` states the part of the KV they hold,
  the part an engine that drops tokens outside the window would not need to keep.

The element size is the ``--dtype`` given, else ``torch_dtype`` (or ``dtype``) of the config.
A missing or malformed field raises :class:`~kvoffload.errors.InvalidArgumentError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.sweep import DTYPE_BYTES

__all__ = ["ConfigShape", "read_model_config"]

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
_DTYPES.update({k: k for k in DTYPE_BYTES})


@dataclass(frozen=True)
class ConfigShape:
    """The KV geometry of a model read from its config (module docstring).

    Attributes:
        source: the config's path; kind: ``"gqa"`` or ``"mla"``.
        layers: attention layers; sliding_layers: how many of them use a sliding window.
        values_per_token_layer: KV values one token keeps in one layer.
        dtype: the KV element type (a key of ``DTYPE_BYTES``); sliding_window: tokens (0: none).
    """

    source: str
    kind: str
    layers: int
    sliding_layers: int
    values_per_token_layer: int
    dtype: str
    sliding_window: int = 0

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.values_per_token_layer * DTYPE_BYTES[self.dtype]

    @property
    def sliding_share(self) -> float:
        """The sliding-window layers' share of the KV bytes."""
        return self.sliding_layers / self.layers

    def describe(self) -> str:
        what = "MLA latent + rope" if self.kind == "mla" else "K+V"
        sliding = (
            f", {self.sliding_layers} sliding-window layers ({self.sliding_share:.0%} of the KV, window "
            f"{self.sliding_window:,})"
            if self.sliding_layers
            else ""
        )
        return (
            f"{Path(self.source).name}: {self.layers} layers x {self.values_per_token_layer} {what} values, "
            f"{self.dtype}{sliding}"
        )


def _int(cfg: dict[str, Any], name: str, path: str, default: int | None = None) -> int:
    v = cfg.get(name, default)
    if v is None:
        raise InvalidArgumentError(f"--model-config {path}: missing field {name!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidArgumentError(f"--model-config {path}: field {name!r} must be a non-negative int, got {v!r}")
    return v


def _sliding_layers(cfg: dict[str, Any], layers: int, path: str) -> int:
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise InvalidArgumentError(
                f"--model-config {path}: field 'layer_types' must list {layers} layer types (num_hidden_layers)"
            )
        return sum(1 for t in types if t == "sliding_attention")
    if not cfg.get("sliding_window"):
        return 0
    pattern = cfg.get("sliding_window_pattern")
    if pattern is not None:
        p = _int(cfg, "sliding_window_pattern", path)
        return layers - layers // p if p else 0
    if cfg.get("use_sliding_window"):
        return max(0, layers - _int(cfg, "max_window_layers", path))
    return 0


def read_model_config(path: str | Path, dtype: str | None = None) -> ConfigShape:
    """The :class:`ConfigShape` of the Hugging Face ``config.json`` at ``path``; ``dtype``
    overrides the config's ``torch_dtype``."""
    p = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"--model-config {p}: cannot be read as JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"--model-config {p}: expected a JSON object")
    cfg = {**raw, **raw["text_config"]} if isinstance(raw.get("text_config"), dict) else raw
    layers = _int(cfg, "num_hidden_layers", p)
    if layers < 1:
        raise InvalidArgumentError(f"--model-config {p}: field 'num_hidden_layers' must be at least 1")
    if "kv_lora_rank" in cfg:
        kind = "mla"
        values = _int(cfg, "kv_lora_rank", p) + _int(cfg, "qk_rope_head_dim", p)
    else:
        kind = "gqa"
        heads = cfg.get("num_attention_heads")
        kv_heads = _int(cfg, "num_key_value_heads", p, heads)
        if cfg.get("head_dim") is not None:
            head_dim = _int(cfg, "head_dim", p)
        else:
            hidden, n_heads = _int(cfg, "hidden_size", p), _int(cfg, "num_attention_heads", p)
            if not n_heads or hidden % n_heads:
                raise InvalidArgumentError(
                    f"--model-config {p}: 'hidden_size' {hidden} is not a multiple of 'num_attention_heads' {n_heads}"
                    " and there is no 'head_dim'"
                )
            head_dim = hidden // n_heads
        values = 2 * kv_heads * head_dim
    if values < 1:
        raise InvalidArgumentError(f"--model-config {p}: the config gives no KV values per token")
    name = dtype or cfg.get("torch_dtype") or cfg.get("dtype")
    if name is None:
        raise InvalidArgumentError(f"--model-config {p}: missing field 'torch_dtype' (or give --dtype)")
    if str(name) not in _DTYPES:
        raise InvalidArgumentError(
            f"--model-config {p}: field 'torch_dtype' {name!r} is not one of {', '.join(sorted(_DTYPES))}"
        )
    sliding = _sliding_layers(cfg, layers, p)
    window = _int(cfg, "sliding_window", p, 0) if sliding else 0
    return ConfigShape(p, kind, layers, sliding, values, _DTYPES[str(name)], window)
