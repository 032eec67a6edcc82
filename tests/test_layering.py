"""docs/contract.md §1 import direction, checked on the source. The rooms of the three products:
what a vLLM deployment imports (``integrations``, ``cache``, ``core``, ``transfer``, ``kernels``,
``tiers`` and the leaf modules) never imports the engine kit (``engine``) or the sizing tool
(``simulate``); inside it kernels -> the leaves (errors, checks, registry) only; core -> leaves only;
cache -> core; transfer -> core, kernels; cache and transfer never import each other; tiers ->
leaves, core only, never torch. The engine kit: its scheduler -> core only (it is handed a manager);
the tiered manager never imports the reference engine; nothing but the commands (``app``) imports
``simulate``, and nothing in the library imports ``app``, ``testing`` or ``integrations``. cache,
core and the leaves never import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kvoffload

PKG = Path(kvoffload.__file__).resolve().parent
TOP_LAYER = {"app", "__main__", "testing", "integrations"}
#: the engine kit's and the sizing tool's rooms, which nothing on the vLLM path imports
KIT = {"engine", "engine.scheduler", "engine.reference", "simulate"}
FORBIDDEN = {
    "tiers": {"kernels", "cache", "transfer"} | KIT | TOP_LAYER,
    "kernels": {"core", "cache", "transfer"} | KIT | TOP_LAYER,
    "core": {"kernels", "cache", "transfer"} | KIT | TOP_LAYER,
    "cache": {"kernels", "transfer"} | KIT | TOP_LAYER,
    "transfer": {"cache"} | KIT | TOP_LAYER,
    "integrations": KIT | TOP_LAYER - {"integrations"},
    "engine.scheduler": {"kernels", "transfer", "cache", "tiers"} | KIT - {"engine.scheduler"} | TOP_LAYER,
    "engine": {"kernels", "transfer", "engine.reference", "simulate"} | TOP_LAYER,
    "engine.reference": {"simulate"} | TOP_LAYER,
    "simulate": TOP_LAYER,
}


def _room_files(room: str) -> list[Path]:
    """The files of ``room`` (``"engine"`` is the kit's own files, its two sub-rooms apart)."""
    folder = PKG / room.replace(".", "/")
    return sorted(folder.glob("*.py") if room == "engine" else folder.rglob("*.py"))


def _top_level_imports(path: Path) -> set[str]:
    """First-level module names (``torch``, ``numpy``, ...) that ``path`` imports, at any depth."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _kvoffload_imports(path: Path) -> set[str]:
    """The rooms (``kvoffload.X``; ``engine.scheduler`` and ``engine.reference`` apart from the
    rest of ``engine``) that ``path`` imports, at any depth."""
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
                sub = len(parts) > 2 and parts[1] == "engine" and parts[2] in ("scheduler", "reference")
                out.add(".".join(parts[1:3]) if sub else parts[1])
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_run_one_way(layer: str) -> None:
    files = _room_files(layer)
    assert files
    bad = {str(f.relative_to(PKG)): sorted(_kvoffload_imports(f) & FORBIDDEN[layer]) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


#: modules every layer may import; they import nothing of kvoffload but each other
LEAVES = {"errors", "checks", "registry"}


def test_tiers_import_only_leaves_and_core() -> None:
    """Tiers move bytes between a store and host records: no torch, no cache/scheduler layers."""
    for f in (PKG / "tiers").rglob("*.py"):
        assert _kvoffload_imports(f) <= {"tiers", "core"} | LEAVES, f
        assert "torch" not in _top_level_imports(f), f


@pytest.mark.parametrize("layer", ["kernels", "core"])
def test_kernels_and_core_import_only_leaves(layer: str) -> None:
    for f in (PKG / layer).rglob("*.py"):
        assert _kvoffload_imports(f) <= {layer} | LEAVES, f


def test_leaves_import_only_leaves() -> None:
    for leaf in LEAVES:
        assert _kvoffload_imports(PKG / f"{leaf}.py") <= LEAVES, leaf


@pytest.mark.parametrize("layer", ["core", "cache", "leaves"])
def test_scheduler_process_layers_never_import_torch(layer: str) -> None:
    files = (
        [PKG / f"{leaf}.py" for leaf in sorted(LEAVES)] if layer == "leaves" else sorted((PKG / layer).rglob("*.py"))
    )
    assert files
    assert {str(f.relative_to(PKG)) for f in files if {"torch", "triton"} & _top_level_imports(f)} == set()


#: what a scheduler process or a sizing tool imports: each package as a whole, __init__ included
TORCH_FREE_PACKAGES = [
    "kvoffload",
    "kvoffload.core",
    "kvoffload.cache",
    "kvoffload.engine.scheduler",
    "kvoffload.tiers",
]


@pytest.mark.parametrize("package", TORCH_FREE_PACKAGES)
def test_scheduler_side_packages_import_without_torch(package: str) -> None:
    """The package imports (and the manager runs) in a process where torch cannot be imported."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
        f"import {package}\n"
        "from kvoffload.cache import CPUOffloadingManager\n"
        "from kvoffload.core import ReqContext\n"
        "m = CPUOffloadingManager(4, 'arc', store_threshold=1, record_requests=True)\n"
        "out = m.prepare_store([b'k' * 12], ReqContext('r'))\n"
        "assert out is not None and out.keys_to_store == [b'k' * 12]\n"
        "assert sys.modules['torch'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_worker_names_load_on_first_use() -> None:
    code = (
        "import sys, kvoffload\n"
        "assert 'torch' not in sys.modules\n"
        "assert kvoffload.TransferWorker.__module__ == 'kvoffload.transfer.worker'\n"
        "assert 'torch' in sys.modules and 'KVCacheTable' in dir(kvoffload)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_package_root_loads_its_names_on_first_use() -> None:
    """``import kvoffload`` loads only the errors (no numpy), so importing one subpackage does not
    import the others: the cache and the tiers come without the scheduler, the scheduler's names
    on first use."""
    code = (
        "import sys, kvoffload\n"
        "assert sorted(m for m in sys.modules if m.startswith('kvoffload')) == ['kvoffload', 'kvoffload.errors']\n"
        "assert 'numpy' not in sys.modules\n"
        "import kvoffload.cache, kvoffload.tiers\n"
        "assert 'kvoffload.engine.scheduler' not in sys.modules\n"
        "assert kvoffload.OffloadingScheduler.__module__ == 'kvoffload.engine.scheduler.scheduler'\n"
        "assert 'kvoffload.engine.scheduler' in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
