"""Statistics of the reference engine: per step, cumulative, and an optional transfer log."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["StepStats", "EngineStats", "TransferRecord"]


@dataclass
class StepStats:
    """What one :meth:`~kvoffload.engine.reference.engine.Engine.step` did."""

    step: int
    num_scheduled_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_loading: int = 0
    admitted: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    load_jobs: list[int] = field(default_factory=list)
    store_jobs: list[int] = field(default_factory=list)
    flushed_jobs: list[int] = field(default_factory=list)
    completed_jobs: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class EngineStats:
    """Cumulative counters of an engine.

    Token counters at admission: ``prompt_tokens`` (each request's prompt once, when added),
    ``admitted_tokens`` (tokens of every admission, re-admissions after preemption included),
    ``gpu_hit_tokens`` (found in the GPU prefix cache), ``loaded_tokens`` (offered by the CPU tier
    and loaded), ``computed_tokens`` (every token the engine computed: prefill, decode, and work
    lost to preemptions), ``generated_tokens`` (sampled).

    How finished requests were served, counted over each request's last admission (the one that
    ran to completion), so that they add up::

        prompt_tokens + readmitted_output_tokens
            == prefill_gpu_hit_tokens + prefill_loaded_tokens + prefill_computed_tokens
        computed_tokens == prefill_computed_tokens + decode_tokens + discarded_tokens

    (once every added request finished, none aborted; the second sum holds with aborts too).
    ``requests_aborted`` counts :meth:`~kvoffload.engine.reference.engine.Engine.abort_request` calls that
    aborted a live request. ``prefill_loaded_tokens`` counts loaded tokens that
    were not recomputed (a load that reaches the last token of the request leaves that one
    token to compute); ``readmitted_output_tokens`` are generated tokens that a request
    re-admitted after a preemption had to prefill again; ``discarded_tokens`` were computed by
    admissions that a preemption or an abort then threw away.

    Transfer counters come from the workers' results: jobs, offloaded blocks, bytes and seconds
    each way. ``cpu_evictions`` counts offloaded blocks evicted from the CPU tier,
    ``distinct_blocks_stored`` distinct offloaded blocks ever stored (only with
    ``EngineConfig.track_stored_keys``). ``verified_blocks`` counts GPU blocks checked after a
    load (per group block, every layer), ``verified_gpu_hit_blocks`` GPU prefix-cache blocks
    checked at admission (with ``verify_gpu_hits``), ``verification_failures`` the checked
    blocks whose bytes differed from the computed KV. With secondary tiers,
    ``tier_blocks_loaded`` counts the offloaded blocks loaded CPU -> GPU whose host-pool bytes
    came from a tier (promoted, not since rewritten by a GPU store); they are verified with the
    rest of their load job.
    """

    steps: int = 0
    requests_added: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    admitted_tokens: int = 0
    gpu_hit_tokens: int = 0
    loaded_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0
    prefill_gpu_hit_tokens: int = 0
    prefill_loaded_tokens: int = 0
    prefill_computed_tokens: int = 0
    decode_tokens: int = 0
    readmitted_output_tokens: int = 0
    discarded_tokens: int = 0
    preemptions: int = 0
    deferrals: int = 0
    store_jobs: int = 0
    load_jobs: int = 0
    blocks_stored: int = 0
    blocks_loaded: int = 0
    failed_stores: int = 0
    failed_loads: int = 0
    flushed_jobs: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0
    store_seconds: float = 0.0
    load_seconds: float = 0.0
    cpu_evictions: int = 0
    distinct_blocks_stored: int = 0
    gpu_evictions: int = 0
    verified_blocks: int = 0
    verified_gpu_hit_blocks: int = 0
    verification_failures: int = 0
    tier_blocks_loaded: int = 0
    wall_seconds: float = 0.0

    @property
    def cpu_hit_rate(self) -> float:
        """Loaded tokens / admitted tokens."""
        return self.loaded_tokens / self.admitted_tokens if self.admitted_tokens else 0.0

    @property
    def gpu_hit_rate(self) -> float:
        """GPU prefix-cache hit tokens / admitted tokens."""
        return self.gpu_hit_tokens / self.admitted_tokens if self.admitted_tokens else 0.0

    @property
    def hit_rate(self) -> float:
        """Tokens not recomputed at admission (GPU hits + CPU loads) / admitted tokens."""
        return (self.gpu_hit_tokens + self.loaded_tokens) / self.admitted_tokens if self.admitted_tokens else 0.0

    @property
    def served_tokens(self) -> int:
        """Tokens the finished requests' last admissions covered (prompts + re-admitted outputs)."""
        return self.prefill_gpu_hit_tokens + self.prefill_loaded_tokens + self.prefill_computed_tokens

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            cpu_hit_rate=self.cpu_hit_rate,
            gpu_hit_rate=self.gpu_hit_rate,
            hit_rate=self.hit_rate,
            served_tokens=self.served_tokens,
        )
        return d


@dataclass(frozen=True)
class TransferRecord:
    """One transfer job as the engine submitted it (kept with ``record_transfers=True``).

    ``block_offsets[g]``: indices within the request of the GPU blocks of group g moved;
    ``gpu_block_ids[g]``: those GPU block ids.
    """

    step: int
    job_id: int
    req_id: str
    kind: str  # "store" or "load"
    block_offsets: tuple[tuple[int, ...], ...]
    gpu_block_ids: tuple[tuple[int, ...], ...]
    keys: tuple[bytes, ...]
    cpu_slots: tuple[int, ...]

    @classmethod
    def from_job(cls, step: int, job: Any) -> TransferRecord:
        """Record a :class:`~kvoffload.engine.scheduler.jobs.TransferJob` submitted at ``step``."""
        gspec = job.gpu_spec
        return cls(
            step,
            job.job_id,
            job.req_id,
            "store" if job.is_store else "load",
            tuple(tuple(o.tolist()) for o in job.block_offsets),
            tuple(tuple(gspec.group_block_ids(g).tolist()) for g in range(len(gspec.group_sizes))),
            tuple(job.keys),
            tuple(job.cpu_spec.block_ids.tolist()),
        )
