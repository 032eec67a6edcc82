"""kvoffload without its tier extras: ``tests/extras_check.py`` run with redis-py, hiredis and xxhash
hidden (``None`` in ``sys.modules``: every import of them fails), in a process of its own. The
clean-venv run of the same check is ``make test-wheel``'s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[1] / "extras_check.py"
HIDE = "import sys, runpy\nfor n in {names!r}: sys.modules[n] = None\nrunpy.run_path({path!r}, run_name='__main__')\n"


def _run_without(names: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    code = HIDE.format(names=names, path=str(CHECK))
    env = {**os.environ, "PYTHONPATH": str(CHECK.parents[1])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_without_the_tier_extras_the_pool_runs_and_tiers_name_their_extra() -> None:
    done = _run_without(("redis", "hiredis", "xxhash"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tiers name their extras" in done.stdout


def test_the_check_refuses_to_pass_with_an_extra_installed() -> None:
    done = _run_without(("redis", "hiredis"))  # xxhash left importable
    assert done.returncode != 0
    assert "xxhash is installed" in done.stderr
