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

__all__ = ["INTERNAL_ATTRIBUTES", "PRIVATE_ATTRIBUTE", "REASONS", "reason_for"]

PRIVATE_ATTRIBUTE: dict[str, str] = {}

#: attributes without a leading underscore that are still vLLM's implementation, not its contract:
#: neither ``OffloadingManager`` nor ``OffloadingSpec`` (vLLM's base classes, which kvoffload
#: implements) has them; a test that fails with "has no attribute" for one of these is listed with
#: the private-attribute tests (``run.py``), with the attribute and ``"internal": true``
INTERNAL_ATTRIBUTES: dict[str, str] = {
    "counts": "CPUOffloadingManager: the reuse filter's counter dict",
    "stores_skipped_in_current_batch": "CPUOffloadingManager: the skipped-store counter before get_stats",
    "events": "CPUOffloadingManager: its event list (the contract is take_events())",
    "create_worker": "CPUOffloadingSpec: the helper behind its get_worker (builds vLLM's CUDA worker)",
}

#: test node id (no parameters) -> one-line reason; ``version:node`` keys apply to one version only
_FACTORY = "tests/v1/kv_offload/test_factory.py::"
_REPLICATED = (
    "replicated layout on every platform: kvoffload's workers always map one shared region under it, so "
    "KVOffloadSpec keeps replicated_layout (one copy) where vLLM's CPU spec turns it off because its worker "
    "keeps a private tensor there (ROCm, non-CUDA platforms)"
)
REASONS: dict[str, str] = {
    _FACTORY + "test_cpu_spec_missing_cpu_bytes_to_use_raises": (
        "error text: kvoffload raises InvalidArgumentError \"kv_connector_extra_config['cpu_bytes_to_use'] is "
        'missing...", the test matches vLLM\'s wording "cpu_bytes_to_use must be specified"'
    ),
    _FACTORY + "test_cpu_spec_replicated_layout_truth_matrix": _REPLICATED,
    _FACTORY + "test_cpu_spec_replicated_disabled_without_shared_region": _REPLICATED,
    _FACTORY + "test_cpu_config_info_*": (
        "vLLM 0.33 config_info labels: KVOffloadSpec's manager reports vLLM's CPUOffloadingInfo labels "
        "(cpu_num_chunks, cpu_blocks_per_chunk, cpu_kv_cache_size_bytes, cpu_kv_cache_size_tokens) and its own "
        "(backend, num_chunks, eviction_policy, store_threshold, kernel_backend); the test compares the whole dict"
    ),
}


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
