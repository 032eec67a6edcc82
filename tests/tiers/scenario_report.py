"""Where the shared-tier scenario tests put their counters: one JSON line per scenario appended to
the file named by ``KVOFFLOAD_SCENARIO_REPORT`` (nothing when it is unset)."""

from __future__ import annotations

import json
import os

__all__ = ["report"]


def report(scenario: str, counters: dict[str, int]) -> None:
    """Append ``{"scenario": scenario, **counters}`` to the report file, if one is named."""
    path = os.environ.get("KVOFFLOAD_SCENARIO_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": scenario, **counters}) + "\n")
