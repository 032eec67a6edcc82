"""docs/contract.md §1 import direction, checked on the source: kernels -> (errors, checks, registry only); offload -> kernels;
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


#: modules every layer may import; they import nothing of kvoffload but each other
LEAVES = {"errors", "checks", "registry"}


def test_kernels_import_only_leaves() -> None:
    for f in (PKG / "kernels").rglob("*.py"):
        assert _kvoffload_imports(f) <= {"kernels"} | LEAVES, f


def test_leaves_import_only_leaves() -> None:
    for leaf in LEAVES:
        assert _kvoffload_imports(PKG / f"{leaf}.py") <= LEAVES, leaf
