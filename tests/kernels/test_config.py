"""Per-GPU launch parameters: packaged files, lookup order, validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.config import LaunchConfig, launch_config, load_tables, resolve_config

TABLES = {
    "default": {"num_programs": 16, "block_bytes": 16384, "num_warps": 8},
    "interpreter": {"num_programs": 2},
    "compute_capability": {"9": {"num_warps": 16}, "9.0": {"block_bytes": 32768}},
    "device_name": {"Big GPU": {"num_programs": 8}},
}


def test_packaged_configs_load_and_cap_programs() -> None:
    tables = load_tables()
    assert "default" in tables and "interpreter" in tables and "compute_capability" in tables
    for cap in [(8, 0), (8, 9), (9, 0), (10, 0), (7, 5)]:
        cfg = resolve_config(tables, "Some GPU", cap)
        assert 1 <= cfg.num_programs <= 16
    assert launch_config(torch.device("cpu")) == resolve_config(tables, None, None, interpreter=True)


def test_lookup_order_device_name_then_capability_then_default() -> None:
    assert resolve_config(TABLES, "Other", (8, 0)) == LaunchConfig(16, 16384, 8)
    assert resolve_config(TABLES, "Other", (9, 0)) == LaunchConfig(16, 32768, 16)
    assert resolve_config(TABLES, "Other", (9, 4)) == LaunchConfig(16, 16384, 16)
    assert resolve_config(TABLES, "Big GPU", (9, 0)) == LaunchConfig(8, 32768, 16)
    assert resolve_config(TABLES, None, None, interpreter=True) == LaunchConfig(2, 16384, 8)


def test_files_merge_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"default": {"num_programs": 4, "block_bytes": 1024}}))
    (tmp_path / "b.json").write_text(
        json.dumps({"note": "x", "default": {"num_programs": 6}, "device_name": {"G": {"num_warps": 2}}})
    )
    tables = load_tables(str(tmp_path))
    assert resolve_config(tables, "G", (9, 0)) == LaunchConfig(6, 1024, 2)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"defaults": {}}),
        json.dumps({"compute_capability": {"9": 3}}),
    ],
)
def test_bad_files_rejected(tmp_path: Path, content: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(InvalidArgumentError):
        load_tables(str(tmp_path))


def test_bad_values_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown launch"):
        resolve_config({"default": {"programs": 3}}, None, None)
    with pytest.raises(InvalidArgumentError):
        LaunchConfig(block_bytes=3000)
    with pytest.raises(InvalidArgumentError):
        LaunchConfig(num_warps=64)
    with pytest.raises(InvalidTypeError):
        LaunchConfig(num_programs=2.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        LaunchConfig(num_programs=True)  # type: ignore[arg-type]
