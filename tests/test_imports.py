"""Every module of kvoffload imports: a broken import cannot hide behind a skipped test.

Only ``kvoffload.integrations.vllm`` (and its modules) is skipped, and only when vLLM is not
installed; ``kvoffload.__main__`` is run as a program, not imported (it exits).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest

import kvoffload

VLLM_PACKAGE = "kvoffload.integrations.vllm"
NOT_IMPORTED = {"kvoffload.__main__"}


def _modules() -> list[str]:
    """Every ``.py`` file under the package, found on disk (``pkgutil.walk_packages`` would
    silently drop the modules of a package that fails to import)."""
    root = Path(kvoffload.__file__).resolve().parent
    names = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(n for n in names if n not in NOT_IMPORTED)


MODULES = _modules()


def test_the_walk_sees_every_layer() -> None:
    tops = {n.split(".")[1] for n in MODULES if n != "kvoffload"}
    assert {"app", "cache", "core", "engine", "kernels", "simulate", "transfer", "checks", "registry"} <= tops
    assert "kvoffload.cache.manager" in MODULES and "kvoffload.transfer.worker" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    if (name == VLLM_PACKAGE or name.startswith(VLLM_PACKAGE + ".")) and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    env = dict(os.environ)
    module = importlib.import_module(name)
    assert module.__name__ == name
    assert dict(os.environ) == env, f"importing {name} changed the environment"
