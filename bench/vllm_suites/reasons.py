"""Why a vLLM offloading test that passes with vLLM's classes fails with kvoffload's.

Two tables, keyed by pytest node id relative to the sdist's root (parameters stripped for
:data:`REASONS`; a key ending in ``*`` matches every test it prefixes):

* :data:`PRIVATE_ATTRIBUTE`: tests that fail only because they read (or patch) a private
  attribute of vLLM's class that kvoffload's class does not have, where the failure message does
  not already say so (``run.py`` also recognises ``has no attribute '_x'`` by itself).
* :data:`REASONS`: one line per real difference, found by reading the test and kvoffload's code.
  A difference without an entry is reported with the reason "unexplained" and its failure line.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

__all__ = ["PRIVATE_ATTRIBUTE", "REASONS", "reason_for"]

PRIVATE_ATTRIBUTE: dict[str, str] = {}

#: test node id (no parameters) -> one-line reason; ``version:node`` keys apply to one version only
REASONS: dict[str, str] = {}


def reason_for(test: str, version: str) -> str:
    bare = test.split("[", 1)[0]
    for key in (f"{version}:{test}", f"{version}:{bare}", test, bare):
        if key in REASONS:
            return REASONS[key]
    for key, reason in REASONS.items():
        scoped = key.split(":", 1)[1] if key.startswith(("0.", "1.")) else key
        if key.startswith(("0.", "1.")) and not key.startswith(version + ":"):
            continue
        if scoped.endswith("*") and bare.startswith(scoped[:-1]):
            return reason
    return "unexplained"
