"""No import cycle inside kvoffload.kernels, not even a lazy (function-level) one."""

from __future__ import annotations

import ast
from pathlib import Path

import kvoffload.kernels

PKG = Path(kvoffload.kernels.__file__).resolve().parent


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[:2] == ["kvoffload", "kernels"]:
                    if len(parts) > 2:
                        deps.add(parts[2])
                    else:  # from kvoffload.kernels import x
                        deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[:2] == ["kvoffload", "kernels"] and len(parts) > 2:
                        deps.add(parts[2])
        graph[m] = deps & mods
    return graph


def test_kernels_import_graph_is_acyclic() -> None:
    graph = _graph()
    assert graph["triton_backend"] and "registry" not in graph["triton_backend"]
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, f"import cycle: {' -> '.join([*stack, m, d])}"
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
