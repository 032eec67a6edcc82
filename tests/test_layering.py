"""docs/contract.md §1 import direction, checked on the source: kernels -> (errors only); tiers -> (errors, core);
offload -> kernels;
scheduler -> offload; nothing inside the library imports sim, cli, demo, simulate or bench."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvoffload

PKG = Path(kvoffload.__file__).resolve().parent
TOP_LAYER = {
    "sim",
    "cli",
    "demo",
    "simulate",
    "simulate_report",
    "benchrun",
    "info",
    "__main__",
    "testing",
    "integrations",
}
FORBIDDEN = {
    "tiers": {"kernels", "offload", "scheduler", "cache", "transfer", "app"} | TOP_LAYER,
    "kernels": {"offload", "scheduler"} | TOP_LAYER,
    "offload": {"scheduler"} | TOP_LAYER,
    "scheduler": {"kernels"} | TOP_LAYER,
}


def _kvoffload_imports(path: Path) -> set[str]:
    """Second-level module names (``kvoffload.X``) that ``path`` imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "kvoffload" and len(parts) > 1:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_run_one_way(layer: str) -> None:
    files = sorted((PKG / layer).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(PKG)): sorted(_kvoffload_imports(f) & FORBIDDEN[layer]) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_tiers_import_only_errors_and_core() -> None:
    """Tiers move bytes between a store and host records: no torch, no cache/scheduler layers."""
    for f in (PKG / "tiers").rglob("*.py"):
        assert _kvoffload_imports(f) <= {"tiers", "errors", "core"}, f
        assert "torch" not in {n.split(".")[0] for n in _top_imports(f)}, f


def _top_imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute imports only)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_kernels_import_only_errors() -> None:
    for f in (PKG / "kernels").rglob("*.py"):
        assert _kvoffload_imports(f) <= {"kernels", "errors"}, f
