"""A manager over the host pool and an ordered list of secondary tiers (docs/contract.md §8, "Wiring").

:class:`TieredManager` holds the host pool's :class:`~kvoffload.cache.manager.CPUOffloadingManager`
as a part (``primary``) and adds tiers beneath it (:class:`~kvoffload.tiers.base.Tier`: Redis,
disk...), through the primary's public interface only:

* **Lookups fall through.** A key the primary misses is asked of the tiers, in order (a tier is
  asked only about keys every tier before it missed). A tier's answer comes from its verdict cache
  or from one probe batch per engine step (:meth:`end_step`); a key whose probe is outstanding
  answers ``LOOKUP_PENDING`` (the scheduler defers the request).
* **Tier hits are promoted.** Within one ``lookup_batch`` call, the tier hits that come before the
  first key that is missing everywhere (or still being probed) are reserved at once in the host
  pool (``primary.prepare_store``: pending slots, all or nothing) and answer ``LOOKUP_PENDING``;
  at :meth:`end_step` each tier gets one load job (tier -> host records). When it finishes, the
  keys that arrived become ready (``complete_store``) and are loaded CPU -> GPU as usual; the keys
  that failed (evicted or deleted in the store, unreachable, corrupt) are released
  (``complete_store(success=False)``), so the next lookup gets the prefix that is really there.
  When the host pool cannot make room, the hits answer ``LOOKUP_MISS`` (recompute).
* **Lookups answer in the call when that is cheap.** With ``probe_in_lookup`` the keys a tier
  has no verdict for are probed within the lookup (:meth:`Tier.probe_now
  <kvoffload.tiers.base.Tier.probe_now>`: one round trip, at most the tier's ``probe_wait``)
  instead of deferring the request to the step's probe batch; promotions whose bytes fit what is
  left of ``sync_load_budget_bytes`` this step are read within the lookup too
  (:meth:`Tier.load_now <kvoffload.tiers.base.Tier.load_now>`) and answer ``LOOKUP_HIT``.
* **Stores are written through.** Keys that a successful GPU -> CPU store made ready
  (``complete_store``) are pinned (``primary.prepare_load``, once per tier) and written to every
  tier at :meth:`end_step`; each pin is released (``complete_load``) when that tier reports the
  write, whether it succeeded or not. Promoted keys are not written back.
* **Removals are events.** Keys a tier's store removed on its own or by another client (a Redis
  or disk tier with ``removal_events``, values a load rejected included) come out of
  :meth:`take_events` as ``removed=True`` events whose ``medium`` is the tier's name.
* **A slow or unreachable tier never stalls a step.** Nothing here waits on a tier beyond those
  bounded reads (none while a tier is in back-off): lookups of a tier in back-off miss, its
  writes are dropped (by the tier, or here when more than ``max_write_blocks`` blocks are pinned
  for writes; counted, logged once per tier), its loads fail.

Nothing leaks: every reserved slot is completed and every pin released when the tier reports the
job; :meth:`drain` waits for all of them (then :meth:`num_reserved` and :meth:`num_write_pinned`
are 0). Call every method from the scheduler's thread. The scheduler calls :meth:`end_step` once
per engine step (at the end of ``build_step``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.stats import OffloadingStats
from kvoffload.checks import check_int
from kvoffload.core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.core.lookup_code import LOOKUP_HIT, LOOKUP_MISS, LOOKUP_PENDING, LOOKUP_RETRY
from kvoffload.engine.tier_jobs import TierJobs, TierUsage
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, KeyStateError
from kvoffload.tiers.base import Tier

logger = logging.getLogger(__name__)

__all__ = ["TieredManager", "TierUsage"]


class TieredManager(OffloadingManager):
    """The host pool's manager plus secondary tiers beneath it (see the module docstring).

    Args:
        primary: the host pool's :class:`~kvoffload.cache.manager.CPUOffloadingManager`; its slot
            ids are rows of the records the tiers were built over.
        tiers: the tiers, fastest / first asked first; built over the host pool's records.
        max_write_blocks: most blocks pinned for tier writes at once (each write job pins its
            blocks until the tier reports it); ``None``: half of ``primary.num_blocks``. A write
            that would pin more is dropped, unless no write is pinned at all.
        max_promoted_blocks: most host-pool slots held by promoted blocks no load has read yet
            (reserved, in flight or arrived); ``None``: half of ``primary.num_blocks``.
            Tier hits beyond it are not promoted (they answer ``LOOKUP_MISS``; counted in
            ``promotions_capped``), so promotions cannot crowd out the blocks the pool holds for
            other requests.
        probe_in_lookup: probe a tier's keys without a verdict within the lookup that asks for
            them (one round trip each such call, waiting at most the tier's ``probe_wait``; a
            tier with ``probe_wait=0`` or a backend that cannot probe on this thread is not
            asked), rather than deferring the request to the step's probe batch.
        sync_load_budget_bytes: record bytes the lookups of one engine step may read from the
            tiers on the calling thread (a lookup's promotions that fit what is left are loaded
            within it and answer ``LOOKUP_HIT``; larger ones are promoted asynchronously); 0:
            every promotion is asynchronous. Default 1 MiB.
        on_promotion: called with a request id and a number of blocks each time host slots are
            reserved for blocks promoted for that request (an observer, e.g. a benchmark's
            per-request transfer time); None: nothing is called.

    Raises:
        InvalidTypeError: ``primary`` is not a ``CPUOffloadingManager``, a tier is not a ``Tier``.
        InvalidArgumentError: no tier, or the same tier twice.
    """

    def __init__(
        self,
        primary: CPUOffloadingManager,
        tiers: Sequence[Tier],
        *,
        max_write_blocks: int | None = None,
        max_promoted_blocks: int | None = None,
        probe_in_lookup: bool = True,
        sync_load_budget_bytes: int = 1 << 20,
        on_promotion: Callable[[str, int], None] | None = None,
    ) -> None:
        if not isinstance(primary, CPUOffloadingManager):
            raise InvalidTypeError(f"primary must be a CPUOffloadingManager, got {type(primary).__name__}")
        tiers = list(tiers)
        if not tiers:
            raise InvalidArgumentError("tiers must name at least one tier")
        for i, t in enumerate(tiers):
            if not isinstance(t, Tier):
                raise InvalidTypeError(f"tiers[{i}] must be a kvoffload.tiers.Tier, got {type(t).__name__}")
        if len({id(t) for t in tiers}) != len(tiers):
            raise InvalidArgumentError("tiers must not name the same tier twice")
        if max_write_blocks is None:
            max_write_blocks = max(1, primary.num_blocks // 2)
        self.max_write_blocks = check_int(max_write_blocks, "max_write_blocks", 1)
        if max_promoted_blocks is None:
            max_promoted_blocks = max(1, primary.num_blocks // 2)
        self.max_promoted_blocks = check_int(max_promoted_blocks, "max_promoted_blocks", 1)
        if not isinstance(probe_in_lookup, bool):
            raise InvalidTypeError(f"probe_in_lookup must be a bool, got {type(probe_in_lookup).__name__}")
        self.probe_in_lookup = probe_in_lookup
        self.sync_load_budget_bytes = check_int(sync_load_budget_bytes, "sync_load_budget_bytes", 0)
        if on_promotion is not None and not callable(on_promotion):
            raise InvalidTypeError(f"on_promotion must be callable or None, got {type(on_promotion).__name__}")
        self._on_promotion = on_promotion
        self._sync_used = 0  # bytes read within lookups this step
        self._unread: set[bytes] = set()  # promoted (queued or arrived), not read by a load yet
        self.primary = primary
        self.tiers = tiers
        self._jobs = TierJobs(primary, tiers)
        self._polled = False
        self._logged: set[str] = set()
        self._closed = False

    # ------------------------------------------------------------------ properties
    @property
    def promoted(self) -> set[bytes]:
        """Keys whose host-pool bytes came from a tier (until a GPU store rewrites them)."""
        return self._jobs.promoted

    @property
    def num_blocks(self) -> int:
        """The host pool's slots."""
        return self.primary.num_blocks

    def num_reserved(self) -> int:
        """Host-pool slots reserved for promotions not yet completed."""
        return self._jobs.reserved

    def num_write_pinned(self) -> int:
        """Pins held for tier writes not yet reported."""
        return self._jobs.write_pinned

    @property
    def busy(self) -> bool:
        """Whether a promotion or a write is reserved, queued or in flight."""
        return bool(self._jobs.reserved or self._jobs.write_pinned)

    def usage(self) -> list[TierUsage]:
        """Per tier, what it did for the engine (copies)."""
        return [TierUsage(**u.__dict__) for u in self._jobs.usage]

    # ------------------------------------------------------------------ lookups
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Like :meth:`lookup_batch` on one key: True ready in the host pool, None pending or being
        promoted / probed, False absent everywhere (or no room to promote)."""
        code = int(self.lookup_batch([key], req_context)[0])
        return None if code == LOOKUP_PENDING else code == LOOKUP_HIT

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Per key ``LOOKUP_HIT`` / ``LOOKUP_MISS`` / ``LOOKUP_PENDING``: the primary's answer, with
        its misses looked up in the tiers (tier hits before the first miss are promoted and answer
        ``LOOKUP_PENDING``, see the module docstring)."""
        if not self._polled:
            self._poll()
        codes = self.primary.lookup_batch(keys, req_context)
        cl: list[int] = codes.tolist()
        try:
            first = cl.index(LOOKUP_MISS)
        except ValueError:
            return codes  # everything is in the host pool (or on its way there)
        keys_l = keys if isinstance(keys, list) else list(keys)
        n = len(cl)
        todo = [i for i in range(first, n) if cl[i] == LOOKUP_MISS]
        source: dict[int, int] = {}  # position -> tier holding it
        probing: list[int] = []  # positions whose probe is outstanding
        for t, tier in enumerate(self.tiers):
            rest = []
            asked = [keys_l[i] for i in todo]
            answers = tier.probe_now(asked) if self.probe_in_lookup else tier.lookup(asked)
            for i, c in zip(todo, answers.tolist(), strict=True):
                if c == LOOKUP_HIT:
                    source[i] = t
                elif c == LOOKUP_RETRY:
                    cl[i] = LOOKUP_PENDING
                    probing.append(i)
                else:
                    rest.append(i)
            todo = rest
            if not todo:
                break
        if not source:
            return np.array(cl, dtype=np.int8) if probing else codes
        # promote the tier hits before the first key missing everywhere or still being probed
        stop = min(todo[0] if todo else n, min(probing, default=n))
        after = LOOKUP_PENDING if stop < n and stop in probing else LOOKUP_MISS
        promote = []
        for i in source:
            if i < stop:
                promote.append(i)
            else:  # behind a probe in flight the request is deferred anyway; behind a miss, useless
                cl[i] = after
        if promote:
            self._reserve(keys_l, promote, source, cl, req_context)
        return np.array(cl, dtype=np.int8)

    def _reserve(
        self, keys: list[bytes], positions: list[int], source: dict[int, int], codes: list[int], ctx: ReqContext
    ) -> None:
        """Reserve host slots for the tier hits at ``positions`` (all or none) and queue their promotion."""
        room = self._promotion_room()
        if len(dict.fromkeys(keys[i] for i in positions)) > room:  # the cap: promote a prefix only
            capped = positions[room:] if room > 0 else positions
            positions = positions[:room] if room > 0 else []
            for i in capped:
                self._jobs.usage[source[i]].promotions_capped += 1
                codes[i] = LOOKUP_MISS
            if not positions:
                return
        tier_of: dict[bytes, int] = {}
        for i in positions:
            tier_of.setdefault(keys[i], source[i])
        # the keys this batch found in the host pool are named too: prepare_store never evicts them
        protect = [k for k, c in zip(keys, codes, strict=True) if c == LOOKUP_HIT and k not in tier_of]
        named: list[Any] = [*tier_of, *dict.fromkeys(protect)]
        out = self.primary.prepare_store(named, ctx)
        got: dict[bytes, int] = {}
        if out is not None:
            got = dict(zip(out.keys_to_store, out.store_spec.block_ids.tolist(), strict=True))  # type: ignore[attr-defined]
        now: dict[int, list[bytes]] = {}  # tier -> keys loaded within this call
        n_got = sum(k in got for k in tier_of)
        nbytes = n_got * self.tiers[0].record_bytes
        sync = 0 < nbytes <= self.sync_load_budget_bytes - self._sync_used
        if n_got and self._on_promotion is not None:
            self._on_promotion(ctx.req_id, n_got)
        for k, t in tier_of.items():
            slot = got.get(k)
            if slot is None:
                self._jobs.usage[t].promotions_refused += 1
                continue
            if sync:
                now.setdefault(t, []).append(k)
            else:
                self._jobs.queue_promotion(t, k, slot, ctx)
            self._unread.add(k)
        arrived: dict[bytes, bool] = {}
        if sync:
            self._sync_used += nbytes
            for t, ks in now.items():
                arrived.update(zip(ks, self._jobs.promote_now(t, ks, [got[k] for k in ks], ctx), strict=True))
        for i in positions:
            k = keys[i]
            if k in arrived:
                codes[i] = LOOKUP_HIT if arrived[k] else LOOKUP_MISS
            else:
                codes[i] = LOOKUP_PENDING if k in got else LOOKUP_MISS

    def _promotion_room(self) -> int:
        """Promotions the cap allows now (keys the pool no longer holds are forgotten first)."""
        if len(self._unread) >= self.max_promoted_blocks:
            unread: list[Any] = list(self._unread)
            held = self.primary.peek(unread).tolist()
            self._unread = {k for k, c in zip(unread, held, strict=True) if c != LOOKUP_MISS}
        return self.max_promoted_blocks - len(self._unread)

    def num_promoted_unread(self) -> int:
        """Host-pool slots held by promoted blocks no load has read yet (an upper bound)."""
        return len(self._unread)

    def take_resolved(self) -> list[bytes]:
        """Keys whose ``LOOKUP_PENDING`` from this manager (not the primary's own pending stores)
        may have ended since the last call: promotions that finished, ok or not, and keys whose
        tier probe returned. Finished tier jobs are applied first. Keys are recorded from the
        first call on (the scheduler calls it to know when a deferred request may look up again)."""
        if not self._polled:
            self._poll()
        out = self._jobs.take_resolved()
        for tier in self.tiers:
            out.extend(tier.take_answered())
        return out

    # ------------------------------------------------------------------ pass-through
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = self.primary.prepare_load(keys, req_context)
        if self._unread:
            self._unread.difference_update(keys)  # read: no longer held by a promotion
        return spec

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        self.primary.touch(keys, req_context)

    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        self.primary.complete_load(keys, req_context)

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        return self.primary.prepare_store(keys, req_context)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """The primary's ``complete_store``; on success the keys are pinned and queued for every tier."""
        self.primary.complete_store(keys, req_context, success)
        if not success or not keys or self._closed:
            return
        keys_l = list(dict.fromkeys(keys))
        jobs = self._jobs
        jobs.promoted.difference_update(keys_l)
        for t in range(len(self.tiers)):
            if jobs.write_pinned and jobs.write_pinned + len(keys_l) > self.max_write_blocks:
                jobs.usage[t].writes_dropped += len(keys_l)
                self._log_once(
                    f"drop-{t}",
                    "tier %s: writes dropped, %d blocks already pinned for writes (max_write_blocks)",
                    self.tiers[t].name,
                    jobs.write_pinned,
                )
                continue
            try:
                spec = self.primary.prepare_load(keys_l, req_context)
            except KeyStateError:  # a key that was not pending (not made ready by this call)
                ready = self.primary.lookup_batch(keys_l, req_context)
                keys_l = [k for k, c in zip(keys_l, ready.tolist(), strict=True) if c == LOOKUP_HIT]
                if not keys_l:
                    return
                spec = self.primary.prepare_load(keys_l, req_context)
            jobs.queue_writes(t, keys_l, spec.block_ids.tolist(), req_context)  # type: ignore[attr-defined]

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The host pool's events, then per tier the keys its store removed (``removed=True``,
        ``medium`` the tier's name; a Redis or disk tier opened with ``removal_events``)."""
        yield from self.primary.take_events()
        for tier in self.tiers:
            removed = tier.take_removed()
            if removed:
                yield OffloadingEvent(keys=[OffloadKey(k) for k in removed], medium=tier.name, removed=True)

    # ------------------------------------------------------------------ per step
    def end_step(self) -> None:
        """Once per engine step, after its lookups: collect finished tier jobs, send the step's
        promotions and writes (one job per tier and kind), and each tier's probe batch."""
        self._poll()
        self._jobs.send()
        self._polled = False
        self._sync_used = 0

    def _poll(self) -> None:
        """Apply every finished tier job to the primary."""
        self._polled = True
        self._jobs.apply_finished()

    # ------------------------------------------------------------------ lifecycle
    def drain(self, timeout: float | None = None) -> bool:
        """Send what is queued, wait for every tier job, and apply the results (blocking: for
        shutdown, resets and tests, not the step loop). False if a tier did not finish in time."""
        self.end_step()
        done = all(t.drain(timeout) for t in self.tiers)
        self._poll()
        self._polled = False
        return done

    def get_stats(self) -> OffloadingStats:
        return self.primary.get_stats()

    def reset_cache(self) -> None:
        """Drain the tiers' jobs, then reset the primary (the tiers keep their values)."""
        self.drain()
        self._jobs.promoted.clear()
        self._unread.clear()
        self.primary.reset_cache()

    def close(self) -> None:
        """Drain, then close every tier (idempotent). The host records must outlive this call."""
        if self._closed:
            return
        self.drain()
        self._closed = True
        for t in self.tiers:
            t.close()

    def shutdown(self) -> None:
        """:meth:`close`, then the primary's ``shutdown``."""
        self.close()
        self.primary.shutdown()

    def _log_once(self, tag: str, fmt: str, *args: object) -> None:
        if tag not in self._logged:
            self._logged.add(tag)
            logger.warning(fmt, *args)

    def __repr__(self) -> str:
        return f"TieredManager({self.primary!r}, tiers=[{', '.join(t.name for t in self.tiers)}])"
