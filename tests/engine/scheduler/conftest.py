"""Fixtures of the scheduler unit tests: duck-typed requests and a call-recording manager."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext, make_offload_key
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import ScheduledRequest
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler


@dataclass
class Req:
    """The minimum a request must have (docs/contract.md §6)."""

    request_id: str
    block_hashes: list[bytes]
    num_tokens: int
    num_prompt_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None


def hashes(n: int, tag: str = "") -> list[bytes]:
    """``n`` distinct 16-byte hashes; the same ``tag`` gives the same prefix."""
    return [f"{tag}h{i:013d}".encode()[:16].ljust(16, b".") for i in range(n)]


def make_req(rid: str, num_tokens: int, hash_block_size: int, tag: str = "", **kw: Any) -> Req:
    return Req(rid, hashes(num_tokens // hash_block_size, tag), num_tokens, num_tokens, **kw)


def key(h: bytes, g: int = 0) -> bytes:
    return make_offload_key(h, g)


def put(manager: Any, keys: Sequence[bytes], pending: bool = False) -> None:
    """Store ``keys`` in the manager (ready, or left pending)."""
    out = manager.prepare_store(list(keys), ReqContext("setup"))
    assert out is not None
    if not pending:
        manager.complete_store(out.keys_to_store, ReqContext("setup"))


class RecordingManager:
    """Delegates to a real manager and records (method, req_context, keys) of every call."""

    def __init__(self, inner: Any, batch: bool = True) -> None:
        self.inner = inner
        self.calls: list[tuple[str, ReqContext, list[bytes]]] = []
        if batch:
            self.lookup_batch = self._lookup_batch  # type: ignore[method-assign]

    def _rec(self, name: str, keys: Any, ctx: ReqContext) -> None:
        self.calls.append((name, ctx, list(keys) if not isinstance(keys, bytes) else [keys]))

    def lookup(self, key: bytes, ctx: ReqContext) -> bool | None:
        self._rec("lookup", key, ctx)
        return self.inner.lookup(key, ctx)

    def _lookup_batch(self, keys: Sequence[bytes], ctx: ReqContext):
        self._rec("lookup_batch", keys, ctx)
        return self.inner.lookup_batch(keys, ctx)

    def prepare_load(self, keys: Sequence[bytes], ctx: ReqContext):
        self._rec("prepare_load", keys, ctx)
        return self.inner.prepare_load(keys, ctx)

    def touch(self, keys: Sequence[bytes], ctx: ReqContext) -> None:
        self._rec("touch", keys, ctx)
        self.inner.touch(keys, ctx)

    def complete_load(self, keys: Sequence[bytes], ctx: ReqContext) -> None:
        self._rec("complete_load", keys, ctx)
        self.inner.complete_load(keys, ctx)

    def prepare_store(self, keys: Sequence[bytes], ctx: ReqContext):
        self._rec("prepare_store", keys, ctx)
        return self.inner.prepare_store(keys, ctx)

    def complete_store(self, keys: Sequence[bytes], ctx: ReqContext, success: bool = True) -> None:
        self._rec("complete_store" if success else "complete_store_failed", keys, ctx)
        self.inner.complete_store(keys, ctx, success)

    def take_events(self):
        return self.inner.take_events()

    def reset_cache(self) -> None:
        self.inner.reset_cache()

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def keys_of(self, name: str) -> list[list[bytes]]:
        return [c[2] for c in self.calls if c[0] == name]


@pytest.fixture
def manager() -> RecordingManager:
    return RecordingManager(CPUOffloadingManager(256, enable_events=True))


def sched_state(sched: OffloadingScheduler) -> object:
    """Everything observable about the scheduler's bookkeeping."""
    states = {
        rid: (
            [(list(g.keys), list(g.block_ids), g.next_store_block) for g in st.groups],
            sorted(st.in_flight),
            st.load_job_id,
            st.offer,
            st.next_store_tokens,
        )
        for rid, st in sched._states.items()
    }
    return (
        states,
        sorted(sched._jobs),
        [j.job_id for j in sched._pending_loads],
        dict(sched._loading_keys),
        sched._next_job_id,
        sorted(sched._flush._jobs),
    )


def manager_state(manager: RecordingManager) -> object:
    s = manager.inner.get_stats()
    return (dict(manager.inner.table.index), s.num_pending, s.num_pinned, len(manager.calls))


@pytest.fixture
def busy(manager: RecordingManager) -> tuple[OffloadingScheduler, RecordingManager]:
    """Request "A" running with a store in flight, "B" waiting for its load job (in flight)."""
    sched = OffloadingScheduler(OffloadingSchedulerConfig((GroupOffloadConfig(0, 4, 4),)), manager)
    a = make_req("A", 16, 4, tag="a")
    sched.update_state_after_alloc(a, [[1, 2, 3, 4]], 0)
    (store,) = sched.build_step([ScheduledRequest(a, 0, 8, [[1, 2, 3, 4]])]).store_jobs
    b = make_req("B", 12, 4, tag="b")
    put(manager, [key(h) for h in b.block_hashes[:2]])
    n, _ = sched.get_num_new_matched_tokens(b, 0)
    assert n == 8
    sched.update_state_after_alloc(b, [[5, 6, 7]], n)
    (load,) = sched.build_step().load_jobs
    manager.calls.clear()
    sched.a, sched.b, sched.store, sched.load = a, b, store, load  # type: ignore[attr-defined]
    return sched, manager
