"""What one replica of a fleet computes per second: a GPU profile and a model's compute shape.

The engine-time model of the fleet replay (:mod:`kvoffload.simulate.engine_time`) needs rates, not
hit counts. They come from two small records, both assumptions stated here and overridable:

* :class:`GpuProfile`: a GPU's dense bf16 peak (TFLOP/s), the share of it a prefill reaches (MFU),
  its HBM bandwidth and its host link (GB/s = 10^9 bytes/s). Defaults (:data:`GPU_PROFILES`):
  ``h100`` (H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3) and ``h200`` (H200 SXM: the same
  989 TFLOP/s, 4.8 TB/s HBM3e), both at 40 % MFU and a 50 GB/s host link (PCIe Gen5 x16: one
  pinned-host-to-GPU copy of 1 GiB measured 54.6 GB/s on an H100,
  ``bench/results/nvidia-h100-80gb-hbm3.json``, rounded down). ``--gpu PATH.json`` reads another
  (:func:`read_gpu_profile`).
* :class:`ModelCompute`: parameters, layers and attention width (query heads x head dim) of the
  named shapes (:data:`MODEL_COMPUTE`: ``8b`` Llama-3.1-8B-class, 8.03 B parameters, 32 layers,
  4096; ``70b`` Llama-3.1-70B-class, 70.6 B, 80 layers, 8192) and the GPUs of one replica (1 for
  8b, 4 for 70b: 141 GB of bf16 weights need tensor parallelism on 80 GB GPUs). A replica's FLOP/s
  and bandwidths are its GPUs' sum (linear scaling: optimistic for tensor parallelism).

Prefill throughput follows: ``2 x parameters`` FLOPs per token (plus attention, in the time model)
at ``peak x MFU x GPUs``: 8b on one H100, 989e12 x 0.4 / (2 x 8.03e9) = 24.6K tokens/s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from kvoffload.errors import InvalidArgumentError

__all__ = ["GPU_PROFILES", "MODEL_COMPUTE", "GpuProfile", "ModelCompute", "read_gpu_profile", "gpu_profile"]

#: the largest rate a flag or a profile may give (TFLOP/s or GB/s): beyond it a figure is a typo
MAX_RATE = 1e6


@dataclass(frozen=True)
class GpuProfile:
    """One GPU: dense bf16 peak (TFLOP/s), the MFU a prefill reaches, HBM and host link (GB/s)."""

    name: str
    dense_tflops: float
    mfu: float
    hbm_gbps: float
    link_gbps: float

    def describe(self) -> str:
        return (
            f"{self.name}: {self.dense_tflops:g} TFLOP/s dense bf16 at {self.mfu:.0%} MFU, HBM {self.hbm_gbps:,.0f} "
            f"GB/s, host link {self.link_gbps:g} GB/s"
        )


@dataclass(frozen=True)
class ModelCompute:
    """A model's compute shape: parameters, layers, attention width, GPUs per replica."""

    name: str
    params: float
    layers: int
    attn_dim: int
    gpus: int

    @property
    def weight_bytes(self) -> float:
        """bf16 weights, read once per engine step."""
        return 2.0 * self.params


GPU_PROFILES = {
    "h100": GpuProfile("H100 SXM", 989.0, 0.40, 3350.0, 50.0),
    "h200": GpuProfile("H200 SXM", 989.0, 0.40, 4800.0, 50.0),
}

MODEL_COMPUTE = {
    "8b": ModelCompute("Llama-3.1-8B-class", 8.03e9, 32, 4096, 1),
    "70b": ModelCompute("Llama-3.1-70B-class", 70.6e9, 80, 8192, 4),
}

_RATE_FIELDS = ("dense_tflops", "hbm_gbps", "link_gbps")


def _positive(value: object, what: str, maximum: float = MAX_RATE) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"{what} must be a positive number, got {value!r}")
    if not 0 < value <= maximum:
        raise InvalidArgumentError(f"{what} must be a positive number at most {maximum:g}, got {value!r}")
    return float(value)


def read_gpu_profile(path: str | Path) -> GpuProfile:
    """A :class:`GpuProfile` from a JSON object with the fields ``name`` (text), ``dense_tflops``,
    ``mfu`` (in (0, 1]), ``hbm_gbps`` and ``link_gbps``; every field required, no other."""
    where = f"--gpu {path}"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{where}: cannot be read as JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object")
    names = [f.name for f in fields(GpuProfile)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(names)})")
    missing = [n for n in names if n not in raw]
    if missing:
        raise InvalidArgumentError(f"{where}: missing field {missing[0]!r}")
    if not isinstance(raw["name"], str) or not raw["name"].strip():
        raise InvalidArgumentError(f"{where}: field 'name' must be a non-empty string")
    rates = {n: _positive(raw[n], f"{where}: field {n!r}") for n in _RATE_FIELDS}
    mfu = _positive(raw["mfu"], f"{where}: field 'mfu'", 1.0)
    return GpuProfile(raw["name"].strip(), rates["dense_tflops"], mfu, rates["hbm_gbps"], rates["link_gbps"])


def gpu_profile(spec: str) -> GpuProfile:
    """``--gpu``: a name of :data:`GPU_PROFILES` or the path of a JSON profile."""
    key = spec.strip().lower()
    if key in GPU_PROFILES:
        return GPU_PROFILES[key]
    if not spec.strip().endswith(".json"):
        raise InvalidArgumentError(
            f"--gpu: unknown GPU {spec!r}, expected one of {', '.join(GPU_PROFILES)} or a profile .json file"
        )
    return read_gpu_profile(spec)
