"""kvoffload as the offloading backend of vLLM's ``OffloadingConnector`` (vLLM 0.32 and 0.33).

Turn it on with vLLM's ``--kv-transfer-config``::

    {"kv_connector": "KVOffloadConnector",
     "kv_connector_module_path": "kvoffload.integrations.vllm",
     "kv_role": "kv_both",
     "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"spec_name": "KVOffloadSpec",
                                   "spec_module_path": "kvoffload.integrations.vllm",
                                   "cpu_bytes_to_use": 17179869184}}

``KVOffloadConnector`` is vLLM's own ``OffloadingConnector`` plus the one thing it lacks: it reports
blocks whose load failed, so that vLLM recomputes them. With ``"kv_connector": "OffloadingConnector"``
everything else works the same (see :class:`KVOffloadSpec` for the keys and docs/vllm.md).

Shared tiers: ``KVOffloadTier`` is any registered kvoffload tier as a vLLM secondary tier
(``"secondary_tiers": [{"type": "KVOffloadTier", "module_path": "kvoffload.integrations.vllm",
"url": "redis://..."}]``; ``KVOffloadRedisTier`` and ``KVOffloadDiskTier`` are its older names),
usable in vLLM's own ``TieringOffloadingSpec`` and in ``KVOffloadSpec`` (which also takes vLLM's
``fs``, ``obj``...).

Importing this module imports vLLM; ``import kvoffload`` never does.
"""

from __future__ import annotations

from kvoffload.integrations.vllm.connector import KVOffloadConnector
from kvoffload.integrations.vllm.manager import KVOffloadManager
from kvoffload.integrations.vllm.spec import KVOffloadSpec
from kvoffload.integrations.vllm.tiers import KVOffloadDiskTier, KVOffloadRedisTier, KVOffloadTier
from kvoffload.integrations.vllm.worker import KVOffloadWorker

__all__ = [
    "KVOffloadSpec",
    "KVOffloadConnector",
    "KVOffloadManager",
    "KVOffloadWorker",
    "KVOffloadTier",
    "KVOffloadRedisTier",
    "KVOffloadDiskTier",
]
