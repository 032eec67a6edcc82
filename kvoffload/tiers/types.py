"""Value types shared by every tier: per-job results, per-tier statistics (lookup answers are
:class:`~kvoffload.core.lookup_code.LookupCode` values)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["TierJobResult", "TierStats", "FAILED", "STORED", "PRESENT", "DROPPED"]

#: Per-key outcomes a backend's :meth:`Tier._store_batch <kvoffload.tiers.base.Tier._store_batch>` returns.
FAILED = 0
STORED = 1
PRESENT = 2
DROPPED = 3  # not tried: the key's part of the store (a cluster node) is in back-off


@dataclass(frozen=True)
class TierJobResult:
    """The outcome of one :meth:`~kvoffload.tiers.Tier.submit_store` / ``submit_load`` job.

    Attributes:
        job_id: the id given at submission.
        kind: ``"store"`` (host records -> tier) or ``"load"`` (tier -> host records).
        keys: the job's keys, in submission order.
        ok: per key, whether that key's bytes were moved (a store of a value already present
            in the tier counts as ok); parallel to ``keys``.
        transfer_bytes: record bytes actually moved (ok keys only; headers not counted).
        transfer_time: seconds from submission to completion.
    """

    job_id: int
    kind: Literal["store", "load"]
    keys: tuple[bytes, ...]
    ok: tuple[bool, ...]
    transfer_bytes: int
    transfer_time: float

    @classmethod
    def loaded_now(cls, keys: Sequence[bytes], ok: Sequence[bool]) -> TierJobResult:
        """The result of a load done on the caller's thread (:meth:`Tier.load_now
        <kvoffload.tiers.Tier.load_now>`): no job id (-1), per key ``ok``."""
        return cls(-1, "load", tuple(keys), tuple(ok), 0, 0.0)

    @property
    def success(self) -> bool:
        """True when every key succeeded (vLLM's ``JobResult.success``)."""
        return all(self.ok)

    @property
    def successful_keys(self) -> tuple[bytes, ...]:
        """The keys whose bytes were moved, in submission order."""
        return tuple(k for k, ok in zip(self.keys, self.ok, strict=True) if ok)

    @property
    def failed_keys(self) -> tuple[bytes, ...]:
        """The keys that failed (or were dropped), in submission order."""
        return tuple(k for k, ok in zip(self.keys, self.ok, strict=True) if not ok)


@dataclass
class TierStats:
    """Cumulative counters of one tier since it was created (a snapshot: a copy, not live).

    Attributes:
        lookups: keys probed against the store (cached verdicts are not re-counted).
        hits: probed keys found present.
        lookup_round_trips: probe batches sent (one per engine step with new keys; a Redis
            Cluster answers one batch with one pipeline per shard it touches).
        blocks_read / bytes_read / read_seconds: loaded records, their payload bytes, and the
            summed wall time of the load tasks that moved them.
        blocks_written / bytes_written / write_seconds: the same for stores (values already
            present are counted in ``writes_skipped``, not here).
        writes_skipped: stores of keys the tier already held (``SET NX`` refused, file present).
        read_failures / write_failures: keys whose load / store failed (for any reason below, or
            an error).
        absent: loaded keys the store did not hold (evicted, deleted, lost in a restart since
            the lookup); each is also a read failure, never a rejection.
        dropped_writes: store keys dropped without being tried, because the tier (or, in a
            Redis Cluster, the key's node) was unreachable and in back-off, or the tier's write
            queue was full (back-pressure).
        rejected_values: values read and refused, the sum of the three kinds that follow; each
            is also a miss or a failed load.
        rejected_namespace: values of another namespace or format version under this one's key.
        rejected_integrity: values that fail the MAC check with this reader's keys: unsigned
            while a key is set, signed with another (a retired) key, forged, or signed while
            this reader has no key. Never deleted: they may be good for other readers, and age
            out of the store.
        corrupt: values damaged or written by a foreign client (bad magic, key, length,
            checksum, truncated).
        deleted_values: rejected values the tier deleted (namespace and corrupt ones only, and
            only while the store still held the value that was read).
        redirected: Redis Cluster commands sent again after a ``MOVED`` or ``ASK`` reply.
        timed_out: keys whose command timed out (the tier or their node then backs off).
        evictions: values the tier itself removed to stay in its byte budget (disk).
        errors: backend errors seen (error replies, I/O errors, a backend bug).
        removals: keys the tier learned the store removed (:meth:`~kvoffload.tiers.Tier.take_removed`).
        removal_events_off: 1 when removal events were asked for and the store will not send
            them all (a Redis ``notify-keyspace-events`` without ``Egex``, a cluster), else 0.
    """

    lookups: int = 0
    hits: int = 0
    lookup_round_trips: int = 0
    blocks_read: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    blocks_written: int = 0
    bytes_written: int = 0
    write_seconds: float = 0.0
    writes_skipped: int = 0
    read_failures: int = 0
    write_failures: int = 0
    absent: int = 0
    dropped_writes: int = 0
    rejected_values: int = 0
    rejected_namespace: int = 0
    rejected_integrity: int = 0
    corrupt: int = 0
    deleted_values: int = 0
    redirected: int = 0
    timed_out: int = 0
    evictions: int = 0
    errors: int = 0
    removals: int = 0
    removal_events_off: int = 0
