"""Value types shared by every tier: per-job results, per-tier statistics (lookup answers are
:class:`~kvoffload.core.lookup_code.LookupCode` values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["TierJobResult", "TierStats"]


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
        read_failures / write_failures: keys whose load / store failed (error, absent, rejected).
        dropped_writes: store keys dropped without being tried, because the tier was
            unreachable (in back-off) or its write queue was full (back-pressure).
        rejected_values: values found corrupt or foreign (bad magic, version, fingerprint, key,
            length, checksum or MAC) and deleted; each is also a miss or a failed load.
        evictions: values the tier itself removed to stay in its byte budget (disk).
        errors: backend errors seen (connection refused, timeouts, I/O errors).
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
    dropped_writes: int = 0
    rejected_values: int = 0
    evictions: int = 0
    errors: int = 0
