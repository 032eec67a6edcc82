"""What the vLLM tier tests share: kvoffload's Redis tier as a vLLM ``secondary_tiers`` entry,
and a test role run in a subprocess of its own (a second engine process). Importable without vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["REPO", "TIER_MODULE", "redis_tier", "run_role"]

REPO = Path(__file__).resolve().parents[2]
#: the ``module_path`` of kvoffload's vLLM secondary tiers
TIER_MODULE = "kvoffload.integrations.vllm"


def redis_tier(url: str, **kw: Any) -> dict[str, Any]:
    """A ``secondary_tiers`` entry for ``KVOffloadRedisTier`` at ``url`` (short back-off for tests)."""
    return {"type": "KVOffloadRedisTier", "module_path": TIER_MODULE, "url": url, "backoff_initial": 0.05, **kw}


def run_role(module: str, *args: str, timeout: float) -> list[Any]:
    """Run ``python -m module args...`` from the checkout and return the JSON objects its stdout
    printed one per line (other lines are ignored); the role must exit 0."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
