"""Shared helpers of the engine-loop tests: engines, records, worker/manager doubles."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvoffload.core.base import make_offload_key
from kvoffload.core.lookup_code import LOOKUP_MISS
from kvoffload.engine.reference.config import EngineConfig, GroupConfig
from kvoffload.engine.reference.engine import Engine
from kvoffload.engine.reference.request import SimRequest
from kvoffload.engine.reference.stats import TransferRecord


def tokens(n: int, seed: int = 0) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(50_000) for _ in range(n)]


def make_engine(groups: Sequence[GroupConfig] = (GroupConfig(4, 3),), **kw: Any) -> Engine:
    defaults: dict[str, Any] = dict(
        num_gpu_blocks=128,
        num_cpu_blocks=128,
        max_num_batched_tokens=16,
        record_transfers=True,
        device="cpu",
        num_heads=2,
        head_dim=8,
        worker_backend="torch",
    )
    defaults.update(kw)
    manager = defaults.pop("manager", None)
    worker = defaults.pop("worker", None)
    return Engine(EngineConfig(groups=tuple(groups), **defaults), manager=manager, worker=worker)


def records(engine: Engine, req_id: str | None = None, kind: str | None = None) -> list[TransferRecord]:
    return [
        r for r in engine.transfer_log if (req_id is None or r.req_id == req_id) and (kind is None or r.kind == kind)
    ]


def offsets(engine: Engine, req_id: str, kind: str) -> list[tuple[tuple[int, ...], ...]]:
    """Per job (in submission order), the per-group GPU block offsets."""
    return [r.block_offsets for r in records(engine, req_id, kind)]


def expected_key(req: SimRequest, group: int, block: int, offloaded_block_size: int, hash_block_size: int) -> bytes:
    j = (block + 1) * offloaded_block_size // hash_block_size - 1
    return make_offload_key(req.block_hashes[j], group)


def run(engine: Engine, *reqs: SimRequest, max_steps: int = 10_000) -> None:
    for r in reqs:
        engine.add_request(r)
    engine.run_until_done(max_steps=max_steps)


class FailingWorker:
    """Wraps a worker; jobs selected by ``fail(job_id, spec)`` move nothing and report failure."""

    def __init__(self, inner: Any, fail: Callable[[int, Any], bool]) -> None:
        self.inner = inner
        self.fail = fail
        self.failed: list[int] = []
        self._pending: list[Any] = []

    def transfer_async(self, job_id: int, spec: Any) -> bool:
        if self.fail(job_id, spec):
            self.failed.append(job_id)
            self._pending.append((job_id, False))
            return True
        return bool(self.inner.transfer_async(job_id, spec))

    def get_finished(self) -> list[Any]:
        out = list(self.inner.get_finished()) + self._pending
        self._pending = []
        return out

    def wait(self, job_ids: Any) -> None:
        self.inner.wait([j for j in job_ids if j not in self.failed])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HidingManager:
    """Wraps a manager; lookups report the hidden keys as absent."""

    def __init__(self, inner: Any, hidden: set[bytes]) -> None:
        self.inner = inner
        self.hidden = hidden

    def lookup(self, key: bytes, ctx: Any) -> bool | None:
        return False if key in self.hidden else self.inner.lookup(key, ctx)

    def lookup_batch(self, keys: Sequence[bytes], ctx: Any) -> np.ndarray:
        codes = self.inner.lookup_batch(keys, ctx)
        for i, k in enumerate(keys):
            if k in self.hidden:
                codes[i] = LOOKUP_MISS
        return codes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
