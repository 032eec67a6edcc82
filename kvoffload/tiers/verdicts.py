"""The engine thread's view of a tier's lookups: probed verdicts, keys queued for the next probe
batch, keys whose probe is in flight (see :meth:`kvoffload.tiers.Tier.lookup`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_RETRY
from kvoffload.tiers.types import TierJobResult

__all__ = ["Verdicts"]


#: Weight of one probed key in :attr:`Verdicts.hit_rate` (an exponential moving average over keys).
HIT_RATE_WEIGHT = 1 / 16


class Verdicts:
    """Per-key lookup state, owned by one engine thread (no locking).

    A verdict is reused for ``ttl_steps`` engine steps; older verdicts are probed again. Keys
    answered by a probe are recorded for :meth:`take_answered` once it has been called.

    A key without a verdict answers ``LOOKUP_RETRY`` (the caller defers on its probe) while the
    share of recently probed keys the store held, :attr:`hit_rate`, is at least
    ``defer_hit_rate``; below it such a key answers ``LOOKUP_MISS`` at once and is still probed
    (for later lookups, and to see the share rise again): a tier that finds nothing does not
    make requests wait on it.
    """

    def __init__(self, ttl_steps: int, defer_hit_rate: float = 0.0) -> None:
        self._ttl = ttl_steps
        self._defer_at = defer_hit_rate
        #: share of recently probed keys the store held (starts at 1: a new tier is asked)
        self.hit_rate = 1.0
        self._awaited: set[bytes] = set()  # keys answered RETRY whose probe has not returned
        self._step = 0
        self._known: dict[bytes, tuple[int, int]] = {}  # key -> (code, step resolved)
        self._queued: dict[bytes, None] = {}
        self._in_flight: set[bytes] = set()
        self._answered: list[bytes] | None = None

    def answer(self, keys: list[bytes], down: bool) -> np.ndarray:
        """Per key HIT / MISS from a fresh verdict, else RETRY (queued for the next batch; MISS
        while :attr:`hit_rate` is below ``defer_hit_rate``), or MISS while the tier is ``down``."""
        out = np.empty(len(keys), dtype=np.int8)
        known, step, ttl = self._known, self._step, self._ttl
        unknown = LOOKUP_RETRY if self.hit_rate >= self._defer_at else LOOKUP_MISS
        for i, key in enumerate(keys):
            v = known.get(key)
            if v is not None and step - v[1] < ttl:
                out[i] = v[0]
            elif key in self._in_flight or key in self._queued:
                out[i] = unknown
            elif down:
                out[i] = LOOKUP_MISS
            else:
                self._queued[key] = None
                out[i] = unknown
        if unknown == LOOKUP_RETRY:
            retry = out == LOOKUP_RETRY
            if retry.any():
                self._awaited.update(k for k, r in zip(keys, retry.tolist(), strict=True) if r)
        return out

    @property
    def deferred(self) -> bool:
        """Whether a key answered ``LOOKUP_RETRY`` (a request waits on it) has not been probed yet."""
        return bool(self._awaited)

    def take_batch(self) -> list[bytes]:
        """The keys queued this step (now in flight), and the step ends."""
        batch = list(self._queued)
        self._queued.clear()
        self._in_flight.update(batch)
        self._step += 1
        if self._step % 64 == 0:
            self._known = {k: v for k, v in self._known.items() if self._step - v[1] < self._ttl}
        return batch

    def queued(self, keys: Iterable[bytes]) -> list[bytes]:
        """Those of ``keys`` queued for the next batch (once each)."""
        q = self._queued
        return [k for k in dict.fromkeys(keys) if k in q]

    def sending(self, batch: list[bytes]) -> None:
        """``batch`` (queued keys) is probed ahead of the step's batch: in flight now."""
        for k in batch:
            self._queued.pop(k, None)
        self._in_flight.update(batch)

    def probed(self, batch: Iterable[bytes], found: list[bool] | None) -> None:
        """Record a probe's answers (``found is None``: the tier could not be asked: misses)."""
        batch = list(batch)
        if self._answered is not None:
            self._answered.extend(batch)
        rate = self.hit_rate
        self._awaited.difference_update(batch)
        for i, key in enumerate(batch):
            self._in_flight.discard(key)
            hit = found is not None and found[i]
            self._known[key] = (LOOKUP_HIT if hit else LOOKUP_MISS, self._step)
            if found is not None:
                rate += (hit - rate) * HIT_RATE_WEIGHT
        self.hit_rate = rate

    def finished(self, res: TierJobResult) -> None:
        """A stored key is a hit, a key that failed to load a miss."""
        is_store = res.kind == "store"
        code = LOOKUP_HIT if is_store else LOOKUP_MISS
        for key, ok in zip(res.keys, res.ok, strict=True):
            if ok == is_store:
                self._known[key] = (code, self._step)

    def forget(self, keys: Iterable[bytes]) -> None:
        """Keys the store removed: answered as misses from now on (until probed again)."""
        for key in keys:
            if key in self._known:
                self._known[key] = (LOOKUP_MISS, self._step)

    def take_answered(self) -> list[bytes]:
        """Keys answered by a probe since the last call (recorded from the first call on)."""
        out = self._answered or []
        self._answered = []
        return out
