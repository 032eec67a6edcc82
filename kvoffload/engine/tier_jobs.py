"""The tier jobs of a :class:`~kvoffload.engine.tiered.TieredManager`, and what each tier did.

:class:`TierJobs` is a part that the tiered manager holds. Per tier it keeps the promotions (keys
with a host-pool slot reserved) and the writes (keys with a host-pool slot pinned) queued for the
next :meth:`TierJobs.send`, which hands each tier one load job and one store job; the jobs in
flight until the tier reports them; and the tier's :class:`TierUsage`. A reported promotion
completes its keys' stores in the primary manager (ready if they arrived, released if not); a
reported write releases its pins (``complete_load``), whether it succeeded or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvoffload.core.base import OffloadingManager, ReqContext
from kvoffload.tiers.base import Tier
from kvoffload.tiers.types import TierJobResult

__all__ = ["TierJobs", "TierUsage"]


@dataclass
class TierUsage:
    """What one tier did for the engine (cumulative; a snapshot from
    :meth:`~kvoffload.engine.tiered.TieredManager.usage`).

    Attributes:
        name: the tier's name.
        blocks_promoted: blocks loaded from the tier into the host pool (then loadable to the GPU).
        promotions_failed: reserved keys the tier could not deliver (absent, unreachable, corrupt).
        promotions_refused: tier hits not promoted because the host pool had no room.
        promotions_capped: tier hits not promoted because ``max_promoted_blocks`` slots already
            held promoted blocks no load had read.
        blocks_written: blocks written to the tier (a value already there counts too: ``SET NX``).
        writes_failed: blocks whose write failed or was dropped by the tier (back-off, full queue).
        writes_dropped: blocks not even submitted: more than ``max_write_blocks`` pinned for writes.
    """

    name: str
    blocks_promoted: int = 0
    promotions_failed: int = 0
    promotions_refused: int = 0
    promotions_capped: int = 0
    blocks_written: int = 0
    writes_failed: int = 0
    writes_dropped: int = 0


@dataclass
class _Job:
    """A tier job in flight: its keys and, per key, the context it is completed with."""

    keys: list[bytes]
    ctxs: list[ReqContext]


class TierJobs:
    """Promotions and writes of every tier, from queued to reported (see the module docstring).

    Args:
        primary: the host pool's manager (reported jobs are completed there).
        tiers: the tiers, in the tiered manager's order.

    Attributes:
        usage: per tier, its :class:`TierUsage` (live counters).
        reserved: host-pool slots reserved for promotions not yet reported.
        write_pinned: pins held for writes not yet reported.
        promoted: keys whose host-pool bytes came from a tier (the tiered manager removes a key
            when a GPU store rewrites it).
    """

    def __init__(self, primary: OffloadingManager, tiers: Sequence[Tier]) -> None:
        self.primary = primary
        self.tiers = tiers
        self.usage = [TierUsage(t.name) for t in tiers]
        self._promote: list[list[tuple[bytes, int, ReqContext]]] = [[] for _ in tiers]  # reserved, not sent
        self._write: list[list[tuple[bytes, int, ReqContext]]] = [[] for _ in tiers]  # pinned, not sent
        self._loads: list[dict[int, _Job]] = [{} for _ in tiers]
        self._stores: list[dict[int, _Job]] = [{} for _ in tiers]
        self.reserved = 0
        self.write_pinned = 0
        self._next_job = 0
        self.promoted: set[bytes] = set()
        self._resolved: list[bytes] | None = None  # recorded once take_resolved() was called

    def queue_promotion(self, t: int, key: bytes, slot: int, ctx: ReqContext) -> None:
        """Queue the promotion of ``key`` from tier ``t`` into the host-pool ``slot`` reserved for it."""
        self._promote[t].append((key, slot, ctx))
        self.reserved += 1

    def promote_now(self, t: int, keys: list[bytes], slots: list[int], ctx: ReqContext) -> list[bool]:
        """Load ``keys`` from tier ``t`` into the host-pool ``slots`` reserved for them on this thread
        (blocking) and complete their stores at once, as a reported promotion; per key ok."""
        ok = self.tiers[t].load_now(keys, slots)
        self.reserved += len(keys)
        self._promoted(t, _Job(keys, [ctx] * len(keys)), TierJobResult.loaded_now(keys, ok))
        return ok

    def queue_writes(self, t: int, keys: Sequence[bytes], slots: Sequence[int], ctx: ReqContext) -> None:
        """Queue the write of ``keys`` (host-pool ``slots``, pinned for it) to tier ``t``."""
        self._write[t].extend((k, s, ctx) for k, s in zip(keys, slots, strict=True))
        self.write_pinned += len(keys)

    def take_resolved(self) -> list[bytes]:
        """The keys of the promotions reported since the last call (recorded from the first call on)."""
        out = self._resolved or []
        self._resolved = []
        return out

    def send(self) -> None:
        """Hand every tier its queued promotions and writes (one job per tier and kind), then its
        probe batch (``Tier.end_step``)."""
        for t, tier in enumerate(self.tiers):
            for queue, book, submit in (
                (self._promote, self._loads, tier.submit_load),
                (self._write, self._stores, tier.submit_store),
            ):
                items = queue[t]
                if not items:
                    continue
                queue[t] = []
                jid = self._next_job
                self._next_job += 1
                book[t][jid] = _Job([k for k, _, _ in items], [c for _, _, c in items])
                submit(jid, [k for k, _, _ in items], [s for _, s, _ in items])
            tier.end_step()

    def apply_finished(self) -> None:
        """Apply every finished tier job to the primary."""
        for t, tier in enumerate(self.tiers):
            for res in tier.get_finished():
                if res.kind == "load":
                    self._promoted(t, self._loads[t].pop(res.job_id), res)
                else:
                    self._written(t, self._stores[t].pop(res.job_id), res)

    def _promoted(self, t: int, job: _Job, res: TierJobResult) -> None:
        u = self.usage[t]
        for ok in (True, False):
            by_ctx: dict[int, tuple[ReqContext, list[Any]]] = {}
            for k, c, good in zip(job.keys, job.ctxs, res.ok, strict=True):
                if bool(good) is ok:
                    by_ctx.setdefault(id(c), (c, []))[1].append(k)
            for c, ks in by_ctx.values():
                self.primary.complete_store(ks, c, success=ok)
                if ok:
                    self.promoted.update(ks)
        if self._resolved is not None:
            self._resolved.extend(job.keys)
        n_ok = sum(res.ok)
        u.blocks_promoted += n_ok
        u.promotions_failed += len(job.keys) - n_ok
        self.reserved -= len(job.keys)

    def _written(self, t: int, job: _Job, res: TierJobResult) -> None:
        by_ctx: dict[int, tuple[ReqContext, list[Any]]] = {}
        for k, c in zip(job.keys, job.ctxs, strict=True):
            by_ctx.setdefault(id(c), (c, []))[1].append(k)
        for c, ks in by_ctx.values():
            self.primary.complete_load(ks, c)
        n_ok = sum(res.ok)
        self.usage[t].blocks_written += n_ok
        self.usage[t].writes_failed += len(job.keys) - n_ok
        self.write_pinned -= len(job.keys)
