"""Scheduler layer: lookups, touch, load/store jobs and their completion (vLLM semantics)."""

from kvoffload.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.scheduler.jobs import FinishedJob, ScheduledRequest, SchedulerStepOutput, TransferJob
from kvoffload.scheduler.lookup import maximal_prefix_lookup, sliding_window_lookup
from kvoffload.scheduler.scheduler import OffloadingScheduler
from kvoffload.scheduler.state import parse_max_offload_tokens

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
