"""Fixtures of the scheduler unit tests: duck-typed requests and a call-recording manager."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import ReqContext, make_offload_key


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
