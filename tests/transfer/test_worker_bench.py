"""Smoke tests of the transfer benchmark and its results file (bench/common.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_kvoffload_bench_{name}", BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"_kvoffload_bench_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_slug_and_merge(tmp_path: Path) -> None:
    common = _load("common")
    assert common.slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert common.slugify("  ") == "unknown"
    slug = common.machine_slug()
    assert slug == common.slugify(slug) and (torch.cuda.is_available() or slug.startswith("cpu-"))
    out = tmp_path / "r.json"
    prov = {"commit": "abc"}
    common.write_section("a", {"x": 1}, out, prov=prov)
    common.write_section("b", [1, 2], out, prov={"commit": "def"})
    common.write_section("a", {"x": 2}, out, prov=prov)
    doc = json.loads(out.read_text())
    assert doc["provenance"] == prov
    assert doc["sections"]["a"]["results"] == {"x": 2} and doc["sections"]["b"]["results"] == [1, 2]
    assert doc["sections"]["b"]["provenance"] == {"commit": "def"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_provenance_fields() -> None:
    prov = _load("common").provenance()
    for key in ("torch", "triton", "commit", "cpu", "gpu", "date"):
        assert key in prov


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-mode smoke test")
def test_run_tiny_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bt = _load("bench_transfer")
    monkeypatch.setattr(bt, "_plan", lambda gpu, quick: ([4096], [128]))
    res = bt.run(quick=True, verbose=False)
    assert res["mode"] == "cpu" and res["methods"] == ["direct", "staged", "dma", "loop"]
    assert res["missing"] == {"batched": "CPU-only machine"}
    assert all(all(v.values()) for v in res["verified"].values()) and len(res["verified"]) == 2
    methods = {(r["shape"], r["direction"], r["method"]) for r in res["rows"]}
    names = ("memcpy", "direct", "staged", "dma", "loop")
    assert methods == {(s, d, m) for s in ("llama8b", "mla") for d in ("pack", "unpack") for m in names}
    for r in res["rows"]:
        assert r["gbps"] > 0 and r["bytes"] == r["pages"] * r["page_bytes"]
        assert r["vs_batched"] is None and r["vs_loop"] > 0
        if r["method"] == "memcpy":
            assert r["ratio_to_peak"] == 1.0
    assert {"pack_P_at_4k", "unpack_vs_loop_4_24k"} <= set(res["summary"])
    assert all(v["target"] is None for v in res["summary"].values())  # no target claimed on CPU
    path = bt.common.write_section("transfer", res, tmp_path / "x.json")
    assert json.loads(path.read_text())["sections"]["transfer"]["results"]["mode"] == "cpu"
    png = bt.plot(res, tmp_path / "x.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_budget_truncates(monkeypatch: pytest.MonkeyPatch) -> None:
    bt = _load("bench_transfer")
    monkeypatch.setattr(bt, "_plan", lambda gpu, quick: ([4096, 8192], [64]))
    res = bt.run(quick=True, verbose=False, budget_s=0.0)
    assert res["truncated"] and res["rows"] == []
