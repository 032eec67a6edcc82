"""The README is a landing page whose code runs as written: its length, the two commands, the
blocks marked runnable (the sizing command runs and prints the table shown beside it; the vLLM
configurations name what kvoffload exports; ``tests/integrations/test_readme_vllm.py`` runs the
first through vLLM), and links that resolve (``tests/test_docs.py``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_blocks import README, kv_transfer_config, marked_blocks, shell_commands

VLLM_INIT = README.parent / "kvoffload" / "integrations" / "vllm" / "__init__.py"


def test_readme_fits_a_landing_page() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_marks_its_runnable_blocks() -> None:
    assert {"vllm", "vllm-tiers", "sizing"} <= set(marked_blocks("runnable"))
    assert set(marked_blocks("output of")) <= set(marked_blocks("runnable"))


def _exported_names() -> set[str]:
    tree = ast.parse(VLLM_INIT.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("kvoffload.integrations.vllm has no __all__")


@pytest.mark.parametrize("name", ["vllm", "vllm-tiers"])
def test_vllm_blocks_name_what_kvoffload_exports(name: str) -> None:
    """Without vLLM installed: the JSON parses and every class it names is exported where it says."""
    config = kv_transfer_config(marked_blocks("runnable")[name])
    extra = config["kv_connector_extra_config"]
    exported = _exported_names()
    named = [(config["kv_connector"], config.get("kv_connector_module_path"))]
    named += [(extra["spec_name"], extra["spec_module_path"])]
    named += [(t["type"], t.get("module_path")) for t in extra.get("secondary_tiers", [])]
    for cls, module in named:
        assert module == "kvoffload.integrations.vllm" and cls in exported, (cls, module)
    assert isinstance(extra["cpu_bytes_to_use"], int) and extra["cpu_bytes_to_use"] > 0


def test_sizing_command_prints_the_table_shown(tmp_path: Path) -> None:
    """Run in an empty folder (it writes ./simulate-out there), as written but for ``python``."""
    (argv,) = shell_commands(marked_blocks("runnable")["sizing"])
    assert argv[:3] == ["python", "-m", "kvoffload"]
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = [line.rstrip() for line in proc.stdout.splitlines()]
    shown = [line.rstrip() for line in marked_blocks("output of")["sizing"].splitlines()]
    start = out.index(shown[0])
    assert out[start : start + len(shown)] == shown
    assert (tmp_path / "simulate-out" / "hit_rate.png").exists()
