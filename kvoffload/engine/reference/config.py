"""Configuration of the reference engine."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvoffload.checks import check_int
from kvoffload.engine.scheduler.config import GroupOffloadConfig, OffloadingSchedulerConfig
from kvoffload.errors import InvalidTypeError

__all__ = ["GroupConfig", "EngineConfig", "max_request_tokens"]


def max_request_tokens(num_gpu_blocks: int, gpu_block_size: int) -> int:
    """The most tokens (prompt + decode) one request may need in a group of ``num_gpu_blocks`` GPU
    blocks of ``gpu_block_size`` tokens: all of them but the one block the engine keeps free."""
    return (num_gpu_blocks - 1) * gpu_block_size


@dataclass(frozen=True)
class GroupConfig:
    """One KV-cache group of the reference engine.

    Attributes:
        gpu_block_size: tokens per GPU block.
        block_size_factor: GPU blocks per offloaded block (CPU slot).
        sliding_window_blocks: None for full attention; else the attention window, in offloaded
            blocks (what a load of this group must bring, and what a GPU prefix hit must hold).
        num_layers: layers of this group (one KV tensor each).
        layout: ``"flash_attn"``, ``"flashinfer"`` or ``"mla"``.
    """

    gpu_block_size: int = 16
    block_size_factor: int = 1
    sliding_window_blocks: int | None = None
    num_layers: int = 2
    layout: str = "flash_attn"

    def __post_init__(self) -> None:
        check_int(self.gpu_block_size, "gpu_block_size", 1)
        check_int(self.block_size_factor, "block_size_factor", 1)
        check_int(self.num_layers, "num_layers", 1)
        if self.sliding_window_blocks is not None:
            check_int(self.sliding_window_blocks, "sliding_window_blocks", 1)

    @property
    def offloaded_block_size(self) -> int:
        return self.gpu_block_size * self.block_size_factor


@dataclass(frozen=True)
class EngineConfig:
    """Reference engine configuration.

    Attributes:
        groups: the KV-cache groups.
        num_gpu_blocks: GPU blocks per group (block 0 is the null block).
        num_cpu_blocks: CPU slots (offloaded blocks) of the host pool.
        num_heads / head_dim: KV heads and head size (``mla``: one row of ``num_heads*head_dim``).
        dtype: a 16-bit dtype for the KV tensors.
        hash_block_size: tokens per request block hash (default: gcd of the GPU block sizes).
        max_num_seqs: most requests running or loading at once.
        max_num_batched_tokens: token budget of a step (prefill is chunked to fit).
        enable_gpu_prefix_cache: reuse GPU blocks across requests by hash.
        device: ``"cpu"``, ``"cuda"``... (None: CUDA when available, else CPU).
        worker_backend: kernel backend of the transfer worker (None: its default).
        transfer_latency_steps: run each transfer job this many steps after submission
            (:class:`~kvoffload.engine.reference.delayed.DelayedWorker`; 0: at once).
        verify_loads: check every loaded block against the KV it should hold.
        verify_gpu_hits: also check the blocks of every GPU prefix-cache hit (tests).
        record_transfers: keep a :class:`~kvoffload.engine.reference.stats.TransferRecord` per job.
        track_stored_keys: keep the set of keys ever stored (``Engine.stored_keys``,
            ``EngineStats.distinct_blocks_stored``); needs a manager with events enabled (the
            default manager has them).
        cache_policy: policy of the default manager.
        seed: seeds the KV content constants.
    """

    groups: tuple[GroupConfig, ...] = (GroupConfig(),)
    num_gpu_blocks: int = 512
    num_cpu_blocks: int = 2048
    num_heads: int = 2
    head_dim: int = 32
    dtype: torch.dtype = torch.float16
    hash_block_size: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_gpu_prefix_cache: bool = True
    device: str | None = None
    worker_backend: str | None = None
    transfer_latency_steps: int = 0
    verify_loads: bool = True
    verify_gpu_hits: bool = False
    record_transfers: bool = False
    track_stored_keys: bool = False
    cache_policy: str = "lru"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.groups or not all(isinstance(g, GroupConfig) for g in self.groups):
            raise InvalidTypeError("groups must be a non-empty tuple of GroupConfig")
        object.__setattr__(self, "groups", tuple(self.groups))
        check_int(self.num_gpu_blocks, "num_gpu_blocks", 2)
        check_int(self.num_cpu_blocks, "num_cpu_blocks", 1)
        check_int(self.num_heads, "num_heads", 1)
        check_int(self.head_dim, "head_dim", 1)
        check_int(self.max_num_seqs, "max_num_seqs", 1)
        check_int(self.max_num_batched_tokens, "max_num_batched_tokens", 1)
        check_int(self.transfer_latency_steps, "transfer_latency_steps", 0)

    def scheduler_config(self) -> OffloadingSchedulerConfig:
        """The offloading scheduler's view of these groups."""
        return OffloadingSchedulerConfig(
            tuple(
                GroupOffloadConfig(i, g.gpu_block_size, g.offloaded_block_size, g.sliding_window_blocks)
                for i, g in enumerate(self.groups)
            ),
            hash_block_size=self.hash_block_size,
        )
