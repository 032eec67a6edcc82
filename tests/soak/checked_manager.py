"""A manager wrapper that checks every call against an independent model of the CPU tier.

The model is a plain dict ``key -> [slot, ready, pins]``. Each call is delegated to the real
manager, then its answer is compared with what the model allows:

* lookups agree with the model (hit = ready, pending = present but not ready, miss = absent);
* ``prepare_load`` returns the slots the keys were stored in, and pins them;
* ``prepare_store`` stores exactly the absent keys, in slots no other key holds, and evicts only
  ready, unpinned keys not named in the call -- never a pinned or pending one;
* ``complete_store`` / ``complete_load`` / ``reset_cache`` move the model the same way;
* the events report exactly the evictions and completed stores.

Any disagreement raises :class:`ModelViolation` at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.core.base import ReqContext
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING


class ModelViolation(AssertionError):
    """The manager did something its contract forbids."""


class CheckedManager:
    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self.inner = inner
        self.num_blocks = inner.num_blocks
        self.model: dict[bytes, list[Any]] = {}  # key -> [slot, ready, pins]
        self.counts = counts
        self._evicted: list[bytes] = []
        self._stored: list[bytes] = []

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def _code(self, key: bytes) -> int:
        m = self.model.get(key)
        return LOOKUP_MISS if m is None else (LOOKUP_HIT if m[1] else LOOKUP_PENDING)

    # ---------------------------------------------------------------- lookups
    def lookup(self, key: bytes, ctx: ReqContext) -> bool | None:
        r = self.inner.lookup(key, ctx)
        code = LOOKUP_PENDING if r is None else (LOOKUP_HIT if r else LOOKUP_MISS)
        if code != self._code(key):
            raise ModelViolation(f"lookup({key!r}) = {r}, model code {self._code(key)}")
        self._count("ops_checked")
        return r

    def lookup_batch(self, keys: Sequence[bytes], ctx: ReqContext) -> np.ndarray:
        codes = self.inner.lookup_batch(keys, ctx)
        want = [self._code(k) for k in keys]
        if codes.tolist() != want:
            raise ModelViolation(f"lookup_batch codes {codes.tolist()} != model {want}")
        self._count("ops_checked", len(keys))
        return codes

    def touch(self, keys: Sequence[bytes], ctx: ReqContext) -> None:
        self.inner.touch(keys, ctx)

    # ---------------------------------------------------------------- loads
    def prepare_load(self, keys: Sequence[bytes], ctx: ReqContext) -> Any:
        for k in keys:
            m = self.model.get(k)
            if m is None or not m[1]:
                raise ModelViolation(f"prepare_load of {k!r}, which the model has as {m}")
        spec = self.inner.prepare_load(keys, ctx)
        slots = spec.block_ids.tolist()
        for k, s in zip(keys, slots, strict=True):
            if self.model[k][0] != s:
                raise ModelViolation(f"prepare_load({k!r}) gave slot {s}, the key was stored in {self.model[k][0]}")
            self.model[k][2] += 1
        self._count("ops_checked", len(keys))
        return spec

    def complete_load(self, keys: Sequence[bytes], ctx: ReqContext) -> None:
        self.inner.complete_load(keys, ctx)
        for k in keys:
            m = self.model.get(k)
            if m is None or m[2] < 1:
                raise ModelViolation(f"complete_load of {k!r}, which the model has as {m}")
            m[2] -= 1
        self._count("ops_checked", len(keys))

    # ---------------------------------------------------------------- stores
    def prepare_store(self, keys: Sequence[bytes], ctx: ReqContext) -> Any:
        before = len(self.inner)
        out = self.inner.prepare_store(keys, ctx)
        self._count("ops_checked")
        if out is None:
            if len(self.inner) != before:
                raise ModelViolation("prepare_store returned None but changed the number of blocks")
            self._count("prepare_store_none")
            return None
        named = set(keys)
        for k in out.evicted_keys:
            m = self.model.get(k)
            if m is None or not m[1] or m[2] or k in named:
                raise ModelViolation(f"evicted {k!r}: model state {m}, named in the call: {k in named}")
            del self.model[k]
        self._evicted.extend(out.evicted_keys)
        want = [k for k in keys if k not in self.model]
        if list(out.keys_to_store) != want:
            raise ModelViolation(f"keys_to_store {list(out.keys_to_store)} != the absent keys {want}")
        slots = out.store_spec.block_ids.tolist()
        held = {m[0] for m in self.model.values()}
        if len(set(slots)) != len(slots) or held & set(slots) or any(not 0 <= s < self.num_blocks for s in slots):
            raise ModelViolation(f"prepare_store slots {slots} collide with held slots or are out of range")
        for k, s in zip(want, slots, strict=True):
            self.model[k] = [s, False, 0]
        if len(self.model) > self.num_blocks:
            raise ModelViolation("more keys than slots")
        self._count("evictions_checked", len(out.evicted_keys))
        return out

    def complete_store(self, keys: Sequence[bytes], ctx: ReqContext, success: bool = True) -> None:
        self.inner.complete_store(keys, ctx, success)
        for k in keys:
            m = self.model.get(k)
            if m is None or m[1]:
                continue  # evicted meanwhile is impossible for pending keys; ready ones are untouched
            if success:
                m[1] = True
                self._stored.append(k)
            else:
                del self.model[k]
        self._count("ops_checked", len(keys))

    # ---------------------------------------------------------------- rest
    def take_events(self) -> list[Any]:
        events = list(self.inner.take_events())
        removed = [k for e in events if e.removed for k in e.keys]
        added = [k for e in events if not e.removed for k in e.keys]
        if removed != self._evicted or added != self._stored:
            raise ModelViolation(
                f"events removed {len(removed)} / stored {len(added)} keys, the calls evicted "
                f"{len(self._evicted)} / completed {len(self._stored)}"
            )
        self._evicted, self._stored = [], []
        self._count("ops_checked", len(events))
        return events

    def reset_cache(self) -> None:
        busy = [k for k, m in self.model.items() if not m[1] or m[2]]
        if busy:
            raise ModelViolation(f"reset_cache with {len(busy)} pending or pinned keys")
        self.inner.reset_cache()
        self.model.clear()

    def get_stats(self) -> Any:
        return self.inner.get_stats()

    def check_quiescent(self) -> None:
        """No slot pending or pinned; the manager holds exactly the model's keys."""
        st = self.inner.get_stats()
        if st.num_pending or st.num_pinned:
            raise ModelViolation(f"quiescent, yet {st.num_pending} pending and {st.num_pinned} pinned slots")
        busy = [m for m in self.model.values() if not m[1] or m[2]]
        if busy:
            raise ModelViolation(f"quiescent, yet the model has {len(busy)} pending or pinned keys")
        if st.num_used != len(self.model) or len(self.inner) != len(self.model):
            raise ModelViolation(f"usage {st.num_used} / {len(self.inner)} keys != {len(self.model)} stored keys")
        for k in self.model:
            if k not in self.inner:
                raise ModelViolation(f"stored key {k!r} missing from the manager")
        self._count("ops_checked", len(self.model) + 1)
