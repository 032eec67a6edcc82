"""The soak engine's data: geometry, requests, per-request engine state, configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.soak.faulty import FaultRates

NULL = 0
#: (block size factor, sliding window in tokens or None) per group
GROUPS: tuple[tuple[int, int | None], ...] = ((2, None), (1, 10), (2, 13))


class SoakFailure(AssertionError):
    """An invariant of the soak broke."""


@dataclass
class SoakRequest:
    """The duck-typed request the scheduler sees."""

    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    max_tokens: int
    kv_transfer_params: dict[str, Any] | None
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class Seq:
    req: SoakRequest
    status: str = "waiting"  # waiting | loading | ready | running | failed_load | done
    num_computed: int = 0
    tables: list[list[int]] = field(default_factory=list)
    load_job: int | None = None
    load_end: int = 0
    generated: int = 0


@dataclass
class SoakConfig:
    num_gpu_blocks: int = 160
    num_cpu_blocks: int | None = None  # None: one of 20, 32, 48 per seed
    num_ranks: int = 2
    max_live: int = 12
    max_running: int = 8
    token_budget: int = 64
    p_arrive: float = 0.5
    p_abort: float = 0.03
    p_preempt: float = 0.04
    p_reset: float = 0.01
    p_change: float = 0.03
    quiesce_every: int = 250
    shared_pool: bool | None = None  # None: per seed, mostly True (one pool, shared tensors)
    rates: FaultRates = field(default_factory=FaultRates)
