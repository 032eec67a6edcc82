"""pytest plugin: run vLLM's own offloading tests with kvoffload's classes in place of vLLM's.

Load it with ``-p swap`` (this folder on ``PYTHONPATH``; ``run.py`` does that). pytest imports a
``-p`` plugin before any conftest and before any test module, so by the time a test module runs
``from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager`` the name already resolves to
kvoffload's class. The test files themselves are never changed.

What "swap" means, class by class (the contract of this plugin):

``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` -> :class:`SwappedCPUOffloadingManager`
    A thin subclass of kvoffload's :class:`~kvoffload.integrations.vllm.KVOffloadManager` with
    vLLM's constructor: ``CPUOffloadingManager(num_chunks, cache_policy="lru",
    cache_policy_module_path=None, enable_events=False, store_threshold=1,
    max_tracker_size=64000, info=None)`` (``info``, a ``CPUOffloadingInfo``, exists on vLLM 0.33;
    it becomes the manager's ``config_info`` labels, as vLLM's manager reports them). Every other
    method is kvoffload's, unchanged. ``cache_policy`` goes through kvoffload's resolution, which
    takes vLLM's names and registered / module-path ``CachePolicy`` classes as vLLM does.
    Only the module attribute the tests import is replaced: vLLM modules that bind the name at
    import time keep vLLM's class (they are imported first, below), because they *subclass* it
    and reach into its internals -- vLLM 0.33's ``CPUPrimaryTierOffloadingManager`` (the primary
    tier of vLLM's ``TieringOffloadingManager``) and ``vllm.v1.kv_offload.cpu.spec``. A test that
    builds ``CPUOffloadingManager(...)`` itself (also as the primary of vLLM's tiering manager)
    gets kvoffload's.

``vllm.v1.kv_offload.cpu.spec.CPUOffloadingSpec`` -> :class:`~kvoffload.integrations.vllm.KVOffloadSpec`
    The class itself (no adapter: both take vLLM's ``OffloadingConfig``). vLLM's spec factory
    resolves ``spec_name="CPUOffloadingSpec"`` (and the default, no ``spec_name``) lazily through
    that module attribute, so tests that build the spec through ``OffloadingSpecFactory`` or by
    name in a ``kv_transfer_config`` get ``KVOffloadSpec`` as well as tests that call the class.
    ``KVOffloadSpec`` is registered by kvoffload as a virtual subclass of vLLM's real
    ``CPUOffloadingSpec`` (``ABC.register``); that registration is kept (it is kvoffload's own).
    vLLM's ``TieringOffloadingSpec`` stays vLLM's (it subclasses vLLM's CPU spec; kvoffload's
    counterpart, ``KVOffloadSpec`` with ``secondary_tiers``, is a different configuration that
    these tests do not build), so ``isinstance(tiering_spec, CPUOffloadingSpec)`` is False under
    the swap.

``vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector.OffloadingConnector`` -> ``KVOffloadConnector``
    The class itself; it *is* a subclass of vLLM's connector (failed-transfer handling added),
    so this is meaningful everywhere the connector is built: ``KVConnectorFactory`` resolves
    ``"OffloadingConnector"`` lazily through this module attribute, and the tests that import
    the class get kvoffload's. vLLM's connector tests mostly run it over a mock spec and a mock
    manager, which exercises exactly what kvoffload adds on top of vLLM's connector.

Not swapped: vLLM's CPU worker (``CPUOffloadingWorker``; it needs CUDA, its tests are skipped
here in both runs), vLLM's cache policies (``LRUCachePolicy``, ``ARCCachePolicy``: a test that
uses them directly tests vLLM's policy in both runs; named by string they go through kvoffload's
resolution), vLLM's tiering classes, the connector's scheduler / worker halves.

``KVOFFLOAD_SWAP`` (environment) restricts the swap to a comma-separated subset of
``manager,spec,connector`` (default: all three). The plugin adds a header line to pytest's
report naming what it replaced.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["SwappedCPUOffloadingManager", "SWAPPED", "install"]

#: what was replaced: short name -> (module, attribute, replacement's qualified name)
SWAPPED: dict[str, tuple[str, str, str]] = {}

_MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"
_SPEC_MODULE = "vllm.v1.kv_offload.cpu.spec"
_CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector"
#: vLLM modules that bind (and subclass) the swapped names at import time: imported before the swap
_BIND_FIRST = (
    _MANAGER_MODULE,
    _SPEC_MODULE,
    "vllm.v1.kv_offload.tiering.manager",
    "vllm.v1.kv_offload.tiering.spec",
    "vllm.v1.kv_offload.factory",
    _CONNECTOR_MODULE,
    "vllm.distributed.kv_transfer.kv_connector.factory",
)

from kvoffload.integrations.vllm import KVOffloadManager  # noqa: E402  (imports vLLM)


class SwappedCPUOffloadingManager(KVOffloadManager):
    """kvoffload's manager behind vLLM's ``CPUOffloadingManager`` constructor (0.32 and 0.33).

    vLLM's ``store_threshold`` default is 1 and kvoffload's 0: both mean "no reuse filter" (any
    value below 2), so the mapping is direct.
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        info: Any = None,
    ) -> None:
        config_info = dict(info.as_config_info()) if info is not None else {}
        super().__init__(
            num_chunks,
            cache_policy=cache_policy,
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
            enable_events=enable_events,
            config_info=config_info,
            cache_policy_module_path=cache_policy_module_path,
        )


def _wanted() -> set[str]:
    raw = os.environ.get("KVOFFLOAD_SWAP", "manager,spec,connector")
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = wanted - {"manager", "spec", "connector"}
    if unknown:
        raise ValueError(f"KVOFFLOAD_SWAP: unknown part(s) {sorted(unknown)}; known: manager, spec, connector")
    return wanted


def install() -> dict[str, tuple[str, str, str]]:
    """Import the binding vLLM modules, then replace the module attributes (idempotent)."""
    import importlib

    if SWAPPED:
        return SWAPPED
    modules = {name: importlib.import_module(name) for name in _BIND_FIRST}
    from kvoffload.integrations.vllm import KVOffloadConnector, KVOffloadSpec

    wanted = _wanted()
    plan = {
        "manager": (_MANAGER_MODULE, "CPUOffloadingManager", SwappedCPUOffloadingManager),
        "spec": (_SPEC_MODULE, "CPUOffloadingSpec", KVOffloadSpec),
        "connector": (_CONNECTOR_MODULE, "OffloadingConnector", KVOffloadConnector),
    }
    for part, (module_name, attr, replacement) in plan.items():
        if part not in wanted:
            continue
        setattr(modules[module_name], attr, replacement)
        SWAPPED[part] = (module_name, attr, f"{replacement.__module__}.{replacement.__qualname__}")
        logger.info("swapped %s.%s -> %s", module_name, attr, SWAPPED[part][2])
    return SWAPPED


install()  # at plugin import: before conftests and test modules


def pytest_report_header(config: Any) -> list[str]:
    return [f"kvoffload swap: {module}.{attr} -> {target}" for module, attr, target in SWAPPED.values()]
