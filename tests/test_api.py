"""``kvoffload``'s namespace is the engine-facing API: exactly the names listed here, each the
object of its home module and documented; internal helpers are importable from their modules only."""

from __future__ import annotations

import importlib
import inspect

import pytest

import kvoffload

#: name -> home module: what an engine author uses (errors, keys, specs, manager and policies,
#: data path, worker and host pool, scheduler).
ENGINE_API = {
    "KVOffloadError": "kvoffload.errors",
    "InvalidArgumentError": "kvoffload.errors",
    "InvalidTypeError": "kvoffload.errors",
    "KeyStateError": "kvoffload.errors",
    "ReadOnlyError": "kvoffload.errors",
    "StreamCaptureError": "kvoffload.errors",
    "BackendUnavailableError": "kvoffload.errors",
    "TransferError": "kvoffload.errors",
    "OffloadKey": "kvoffload.core.base",
    "make_offload_key": "kvoffload.core.base",
    "get_offload_block_hash": "kvoffload.core.base",
    "get_offload_group_idx": "kvoffload.core.base",
    "ReqContext": "kvoffload.core.base",
    "LoadStoreSpec": "kvoffload.core.base",
    "BlockIDsLoadStoreSpec": "kvoffload.core.base",
    "CPULoadStoreSpec": "kvoffload.core.base",
    "GPULoadStoreSpec": "kvoffload.core.base",
    "PrepareStoreOutput": "kvoffload.core.base",
    "OffloadingEvent": "kvoffload.core.base",
    "OffloadingManager": "kvoffload.core.base",
    "LOOKUP_MISS": "kvoffload.core.lookup_code",
    "LOOKUP_HIT": "kvoffload.core.lookup_code",
    "LOOKUP_PENDING": "kvoffload.core.lookup_code",
    "LookupCode": "kvoffload.core.lookup_code",
    "CPUOffloadingManager": "kvoffload.cache.manager",
    "OffloadingStats": "kvoffload.cache.stats",
    "CachePolicy": "kvoffload.cache.policies",
    "register_policy": "kvoffload.cache.policies",
    "get_policy_class": "kvoffload.cache.policies",
    "available_policies": "kvoffload.cache.policies",
    "KVCacheTable": "kvoffload.kernels",
    "GenericLayout": "kvoffload.kernels",
    "KernelBackend": "kvoffload.kernels",
    "get_backend": "kvoffload.kernels",
    "register_backend": "kvoffload.kernels",
    "available_backends": "kvoffload.kernels",
    "HostPool": "kvoffload.transfer.host_pool",
    "TransferWorker": "kvoffload.transfer.worker",
    "TransferResult": "kvoffload.transfer.worker",
    "OffloadingScheduler": "kvoffload.engine.scheduler",
    "OffloadingSchedulerConfig": "kvoffload.engine.scheduler",
    "GroupOffloadConfig": "kvoffload.engine.scheduler",
    "ScheduledRequest": "kvoffload.engine.scheduler",
    "SchedulerStepOutput": "kvoffload.engine.scheduler",
    "TransferJob": "kvoffload.engine.scheduler",
    "FinishedJob": "kvoffload.engine.scheduler",
}

#: internal helpers that used to be re-exported at the top: only in their modules now.
INTERNAL = {
    "validate_keys": "kvoffload.core.base",
    "kernel_mode": "kvoffload.kernels",
    "maximal_prefix_lookup": "kvoffload.engine.scheduler.lookup",
    "sliding_window_lookup": "kvoffload.engine.scheduler.lookup",
}


def test_namespace_is_the_engine_api() -> None:
    assert sorted(kvoffload.__all__) == sorted(["__version__", *ENGINE_API])
    assert len(kvoffload.__all__) == len(set(kvoffload.__all__))
    public = {n for n in vars(kvoffload) if not n.startswith("_") and not inspect.ismodule(getattr(kvoffload, n))}
    assert public - set(kvoffload.__all__) == {"annotations"}  # the ``from __future__`` feature


@pytest.mark.parametrize("name", sorted(ENGINE_API))
def test_each_name_is_its_home_modules_object_and_documented(name: str) -> None:
    obj = getattr(kvoffload, name)
    assert obj is getattr(importlib.import_module(ENGINE_API[name]), name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


@pytest.mark.parametrize("name", sorted(INTERNAL))
def test_internal_helpers_stay_in_their_modules(name: str) -> None:
    assert name not in kvoffload.__all__ and not hasattr(kvoffload, name)
    assert callable(getattr(importlib.import_module(INTERNAL[name]), name))
