"""kvoffload without its tier extras (no redis-py, hiredis or xxhash): what a vLLM deployment that
configures no tier installs with ``pip install kvoffload``.

Run as a program: ``make test-wheel`` runs it in a clean venv holding only the built wheel and
torch; ``tests/tiers/test_tier_extras.py`` runs it here with those packages hidden. It checks that
the library, the tier interface and the vLLM plug-in (where vLLM is installed) import, that the
CPU pool's manager and transfer worker run, and that every tier whose extra is missing fails at
its start with the ``pip install`` line to run, before anything is opened.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tempfile

#: what the tier extras install (pyproject.toml's ``redis`` and ``disk``)
EXTRA_PACKAGES = ("redis", "hiredis", "xxhash")


def _fails_with(call, needle: str) -> None:  # type: ignore[no-untyped-def]
    from kvoffload.errors import BackendUnavailableError

    try:
        call()
    except BackendUnavailableError as exc:
        assert needle in str(exc), f"{needle!r} not in {exc}"
        return
    raise AssertionError(f"expected BackendUnavailableError naming {needle!r}")


def main() -> None:
    for name in EXTRA_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        raise AssertionError(f"{name} is installed: this check needs it absent")

    from types import SimpleNamespace

    import numpy as np
    import torch

    import kvoffload.tiers
    from kvoffload import (
        CPUOffloadingManager,
        GroupOffloadConfig,
        KVCacheTable,
        OffloadingScheduler,
        OffloadingSchedulerConfig,
        ScheduledRequest,
        TransferWorker,
    )
    from kvoffload.tiers import TierNamespace, check_tier_spec, open_tier

    # the CPU pool (the engine kit's own example, docs/engine-kit.md): store a prefix, load it back
    kv = [torch.randn(2, 16, 16, 2, 8) for _ in range(2)]
    worker = TransferWorker(KVCacheTable.from_tensors([kv], "flash_attn"), num_cpu_blocks=8, backend="torch")
    sched = OffloadingScheduler(
        OffloadingSchedulerConfig([GroupOffloadConfig(0, 16, 16, None)]), CPUOffloadingManager(8, cache_policy="lru")
    )

    def request(rid: str) -> SimpleNamespace:
        hashes = [bytes([i]) * 16 for i in range(1, 5)]
        return SimpleNamespace(
            request_id=rid, block_hashes=hashes, num_tokens=64, num_prompt_tokens=64, kv_transfer_params=None
        )

    def run_step(new: list[ScheduledRequest]) -> None:
        out = sched.build_step(new, [], [])
        worker.wait(out.flush_job_ids)
        for job in out.load_jobs + out.store_jobs:
            worker.transfer_async(job.job_id, job.spec)
        worker.wait([job.job_id for job in out.load_jobs + out.store_jobs])
        sched.complete_jobs(worker.get_finished())

    try:
        a = request("A")
        run_step([ScheduledRequest(a, 0, 64, [[1, 2, 3, 4]])])
        sched.request_finished(a, [[1, 2, 3, 4]])
        b = request("B")
        n, _ = sched.get_num_new_matched_tokens(b, 0)
        assert n == 64, n
        sched.update_state_after_alloc(b, [[5, 6, 7, 8]], n)
        run_step([ScheduledRequest(b, n, 64 - n, [[5, 6, 7, 8]])])
        assert torch.equal(kv[0][:, 5:9], kv[0][:, 1:5])
    finally:
        worker.shutdown()

    records = np.zeros((2, 64), dtype=np.uint8)
    namespace = TierNamespace("m", "float16", "float16", "flash_attn", (1, 16, 2, 8), 16)
    _fails_with(lambda: check_tier_spec("redis://127.0.0.1:6379"), "pip install 'kvoffload[redis]'")
    _fails_with(lambda: kvoffload.tiers.RedisTier, "pip install 'kvoffload[redis]'")
    with tempfile.TemporaryDirectory() as root:
        _fails_with(
            lambda: open_tier(f"disk:{root}", records, namespace),
            "pip install 'kvoffload[redis]' (or 'kvoffload[disk]')",
        )
    if importlib.util.find_spec("vllm") is not None:
        import kvoffload.integrations.vllm  # noqa: F401 - the plug-in imports without the extras
    print("without the tier extras: the CPU pool runs; redis and disk tiers name their extras")


if __name__ == "__main__":
    sys.exit(main())
