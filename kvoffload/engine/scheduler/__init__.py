"""Scheduler layer: lookups, touch, load/store jobs and their completion (vLLM semantics)."""

from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.engine.scheduler.jobs import FinishedJob, ScheduledRequest, SchedulerStepOutput, TransferJob
from kvoffload.engine.scheduler.lookup import maximal_prefix_lookup, sliding_window_lookup
from kvoffload.engine.scheduler.scheduler import OffloadingScheduler
from kvoffload.engine.scheduler.state import parse_max_offload_tokens

__all__ = [
    "OffloadingScheduler",
    "OffloadingSchedulerConfig",
    "GroupOffloadConfig",
    "ScheduledRequest",
    "SchedulerStepOutput",
    "TransferJob",
    "FinishedJob",
    "maximal_prefix_lookup",
    "sliding_window_lookup",
    "parse_max_offload_tokens",
]
