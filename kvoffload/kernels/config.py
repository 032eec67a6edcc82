"""Per-GPU launch parameters of the Triton kernel, read lazily from ``configs/*.json``.

Every JSON file in ``kvoffload/kernels/configs/`` may hold any of these sections::

    {"default": {...}, "interpreter": {...},
     "compute_capability": {"9": {...}, "9.0": {...}}, "device_name": {"NVIDIA H100 80GB HBM3": {...}}}

Files are merged in name order. For a CUDA device the fields are resolved from the least to the
most specific entry: ``default`` <- ``compute_capability["major"]`` <- ``compute_capability["major.minor"]``
<- ``device_name[name]``; a partial entry overrides only the fields it names. CPU tensors (the
Triton interpreter) use ``default`` <- ``interpreter``. Keys starting with ``note`` are comments.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["LaunchConfig", "CONFIG_DIR", "PATH_NAMES", "load_tables", "launch_config", "resolve_config"]

CONFIG_DIR = Path(__file__).with_name("configs")
_FIELDS = (
    "num_programs",
    "block_bytes",
    "num_warps",
    "pack_path",
    "unpack_path",
    "pack_staged_min_bytes",
    "unpack_staged_min_bytes",
    "staging_bytes",
    "staging_segments",
)
_POSITIVE = ("num_programs", "block_bytes", "num_warps", "staging_bytes", "staging_segments")
#: Data paths (see :mod:`kvoffload.kernels.paths`); "auto" picks by the crossover fields.
PATH_NAMES = ("auto", "direct", "staged", "dma")
_SECTIONS = ("default", "interpreter", "compute_capability", "device_name")


@dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters and data-path choice for one device.

    Kernel: ``num_programs`` (grid cap, the SM budget), ``block_bytes`` (bytes a program keeps in
    flight per loop step, power of two), ``num_warps`` (cap on warps per program).
    Paths (:mod:`kvoffload.kernels.paths`): ``pack_path``/``unpack_path`` one of
    :data:`PATH_NAMES`; with ``"auto"`` a job takes the staged copy-engine path when it moves at
    least ``*_staged_min_bytes`` bytes (``-1``: never), else the direct path. ``staging_bytes``:
    size of the GPU staging ring, split into ``staging_segments`` segments.
    """

    num_programs: int = 16
    block_bytes: int = 16384
    num_warps: int = 8
    pack_path: str = "auto"
    unpack_path: str = "auto"
    pack_staged_min_bytes: int = -1
    unpack_staged_min_bytes: int = -1
    staging_bytes: int = 1 << 20
    staging_segments: int = 2

    def __post_init__(self) -> None:
        for f in _FIELDS:
            v = getattr(self, f)
            if f.endswith("_path"):
                if v not in PATH_NAMES:
                    raise InvalidArgumentError(f"LaunchConfig.{f} must be one of {list(PATH_NAMES)}, got {v!r}")
                continue
            if type(v) is not int:
                raise InvalidTypeError(f"LaunchConfig.{f} must be an int, got {type(v).__name__}")
            if v < (1 if f in _POSITIVE else -1):
                raise InvalidArgumentError(f"LaunchConfig.{f} must be >= {1 if f in _POSITIVE else -1}, got {v}")
        if self.block_bytes & (self.block_bytes - 1) or self.block_bytes < 16:
            raise InvalidArgumentError(f"LaunchConfig.block_bytes must be a power of two >= 16, got {self.block_bytes}")
        if self.num_warps & (self.num_warps - 1) or self.num_warps > 32:
            raise InvalidArgumentError(f"LaunchConfig.num_warps must be a power of two <= 32, got {self.num_warps}")

    def merged(self, entry: dict[str, Any], where: str) -> LaunchConfig:
        unknown = [k for k in entry if k not in _FIELDS and not k.startswith("note")]
        if unknown:
            raise InvalidArgumentError(f"{where}: unknown launch parameters {unknown}; expected {list(_FIELDS)}")
        return replace(self, **{k: v for k, v in entry.items() if k in _FIELDS})


def _merge_into(acc: dict[str, Any], data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{where}: top level must be a JSON object")
    for key, value in data.items():
        if key.startswith("note"):
            continue
        if key not in _SECTIONS:
            raise InvalidArgumentError(f"{where}: unknown section {key!r}; expected {list(_SECTIONS)}")
        if not isinstance(value, dict):
            raise InvalidArgumentError(f"{where}: section {key!r} must be an object")
        if key in ("default", "interpreter"):
            acc.setdefault(key, {}).update(value)
        else:
            for sub, entry in value.items():
                if not isinstance(entry, dict):
                    raise InvalidArgumentError(f"{where}: {key}[{sub!r}] must be an object")
                acc.setdefault(key, {}).setdefault(str(sub), {}).update(entry)


@functools.cache
def load_tables(directory: str | None = None) -> dict[str, Any]:
    """All config files of ``directory`` (default: the packaged ``configs/``) merged; cached."""
    path = Path(directory) if directory is not None else CONFIG_DIR
    acc: dict[str, Any] = {}
    for f in sorted(path.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{f}: invalid JSON: {exc}") from exc
        _merge_into(acc, data, str(f))
    return acc


def resolve_config(
    tables: dict[str, Any], device_name: str | None, capability: tuple[int, int] | None, interpreter: bool = False
) -> LaunchConfig:
    """Resolve launch parameters from merged ``tables`` (see the module docstring for the order)."""
    cfg = LaunchConfig().merged(tables.get("default", {}), "default")
    if interpreter:
        return cfg.merged(tables.get("interpreter", {}), "interpreter")
    cc = tables.get("compute_capability", {})
    if capability is not None:
        major, minor = capability
        for key in (f"{major}", f"{major}.{minor}"):
            if key in cc:
                cfg = cfg.merged(cc[key], f"compute_capability[{key!r}]")
    names = tables.get("device_name", {})
    if device_name is not None and device_name in names:
        cfg = cfg.merged(names[device_name], f"device_name[{device_name!r}]")
    return cfg


@functools.cache
def _cuda_config(index: int) -> LaunchConfig:
    props = torch.cuda.get_device_properties(index)
    cfg = resolve_config(load_tables(), props.name, (props.major, props.minor))
    logger.debug("launch config for %s (sm_%d%d): %s", props.name, props.major, props.minor, cfg)
    return cfg


def launch_config(device: torch.device) -> LaunchConfig:
    """Launch parameters for a KV cache on ``device`` (CPU: the interpreter entry)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_config(index)
    return resolve_config(load_tables(), None, None, interpreter=True)
