"""Scheduler configuration: one :class:`GroupOffloadConfig` per KV-cache group.

Token geometry. The engine hashes a request's tokens in *hash blocks* of
``hash_block_size`` tokens (``request.block_hashes[i]`` is the chained hash of tokens
``[0, (i + 1) * hash_block_size)``). Group ``g`` pages its KV cache in GPU blocks of
``gpu_block_size`` tokens and offloads ``block_size_factor = offloaded_block_size //
gpu_block_size`` consecutive GPU blocks as one *offloaded block* (one CPU slot). The key of
offloaded block ``i`` of group ``g`` is ``make_offload_key(block_hashes[j], g)`` with ``j`` the
LAST hash block inside it, ``j = (i + 1) * offloaded_block_size // hash_block_size - 1``: the
hash is chained, so the key commits to the whole prefix up to the block's end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["GroupOffloadConfig", "OffloadingSchedulerConfig"]


@dataclass(frozen=True)
class GroupOffloadConfig:
    """Offload geometry of one KV-cache group.

    Attributes:
        group_idx: the group's index (``0 <= group_idx < 2**32``), also the suffix of its keys.
        gpu_block_size: tokens per GPU block of this group.
        offloaded_block_size: tokens per offloaded block (one CPU slot); a multiple of
            ``gpu_block_size``.
        sliding_window_size_in_blocks: None for full attention; for a sliding-window group,
            the number of offloaded blocks a load must bring to cover the attention window.
        block_pool: which GPU block pool this group's block ids index. Groups with the same
            ``block_pool`` name the same physical blocks: block id ``b`` is one block of memory
            whichever of them the engine hands it to (vLLM's hybrid allocator gives every group
            blocks of one pool, each KV tensor being shared by one layer of every group -- hence
            the default, 0 for every group). Flushes follow the physical block: a transfer still
            reading or writing block ``b`` of a pool is waited for before any group writes
            block ``b`` of that pool. Give groups distinct pools only when their block ids index
            separate memory (then block ``b`` of one is not block ``b`` of the other);
            ``KVCacheTable.block_pools`` says which groups share memory.
    """

    group_idx: int
    gpu_block_size: int
    offloaded_block_size: int
    sliding_window_size_in_blocks: int | None = None
    block_pool: int = 0

    def __post_init__(self) -> None:
        g = check_int(self.group_idx, "group_idx", 0)
        if g > 2**32 - 1:
            raise InvalidArgumentError(f"group_idx must be < 2**32, got {g}")
        bs = check_int(self.gpu_block_size, "gpu_block_size", 1)
        obs = check_int(self.offloaded_block_size, "offloaded_block_size", 1)
        if obs % bs:
            raise InvalidArgumentError(f"offloaded_block_size ({obs}) must be a multiple of gpu_block_size ({bs})")
        if self.sliding_window_size_in_blocks is not None:
            check_int(self.sliding_window_size_in_blocks, "sliding_window_size_in_blocks", 1)
        check_int(self.block_pool, "block_pool", 0)

    @property
    def block_size_factor(self) -> int:
        """GPU blocks per offloaded block."""
        return self.offloaded_block_size // self.gpu_block_size

    @property
    def is_sliding_window(self) -> bool:
        return self.sliding_window_size_in_blocks is not None


@dataclass(frozen=True)
class OffloadingSchedulerConfig:
    """Configuration of an :class:`~kvoffload.engine.scheduler.scheduler.OffloadingScheduler`.

    Attributes:
        groups: one :class:`GroupOffloadConfig` per KV-cache group, ``groups[i].group_idx == i``.
        hash_block_size: tokens per entry of ``request.block_hashes``; must divide every
            group's ``gpu_block_size``. Default: the gcd of the GPU block sizes (with one group,
            its GPU block size).
        num_workers: transfer workers that each report every job (tensor-parallel ranks); a
            job completes when all of them reported it.
        medium: the manager's medium name (for logs and events only).
        null_block_id: a GPU block id that stands for "no block" in the engine's block tables
            (vLLM: 0, its null block, put where a sliding-window group's blocks fell out of the
            window or were skipped). Never stored from, loaded into, or tracked for flushes;
            an offloaded block with a null GPU block is not offloaded. None: no such id.
    """

    groups: tuple[GroupOffloadConfig, ...]
    hash_block_size: int | None = None
    num_workers: int = 1
    medium: str = "CPU"
    null_block_id: int | None = None
    _hash_block_size: int = field(init=False, repr=False, compare=False, default=0)
    _pool_of_group: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if isinstance(self.groups, GroupOffloadConfig) or not isinstance(self.groups, Sequence):
            raise InvalidTypeError("groups must be a sequence of GroupOffloadConfig")
        groups = tuple(self.groups)
        if not groups:
            raise InvalidArgumentError("groups must hold at least one GroupOffloadConfig")
        for i, g in enumerate(groups):
            if not isinstance(g, GroupOffloadConfig):
                raise InvalidTypeError(f"groups[{i}] must be a GroupOffloadConfig, got {type(g).__name__}")
            if g.group_idx != i:
                raise InvalidArgumentError(f"groups[{i}].group_idx must be {i}, got {g.group_idx}")
        object.__setattr__(self, "groups", groups)
        check_int(self.num_workers, "num_workers", 1)
        gcd = math.gcd(*(g.gpu_block_size for g in groups))
        hbs = gcd if self.hash_block_size is None else check_int(self.hash_block_size, "hash_block_size", 1)
        for g in groups:
            if g.gpu_block_size % hbs:
                raise InvalidArgumentError(
                    f"hash_block_size ({hbs}) must divide gpu_block_size ({g.gpu_block_size}) of group {g.group_idx}"
                )
        object.__setattr__(self, "_hash_block_size", hbs)
        if self.null_block_id is not None:
            check_int(self.null_block_id, "null_block_id", 0)
        pools = sorted({g.block_pool for g in groups})
        object.__setattr__(self, "_pool_of_group", tuple(pools.index(g.block_pool) for g in groups))

    @property
    def pool_of_group(self) -> tuple[int, ...]:
        """Per group, the index (``0..num_pools-1``) of its GPU block pool (see ``block_pool``)."""
        return self._pool_of_group

    @property
    def effective_hash_block_size(self) -> int:
        """``hash_block_size``, or its default when it was left None."""
        return self._hash_block_size

    @property
    def has_sliding_window(self) -> bool:
        return any(g.is_sliding_window for g in self.groups)

    @property
    def max_offloaded_block_size(self) -> int:
        return max(g.offloaded_block_size for g in self.groups)

    @classmethod
    def from_block_sizes(
        cls,
        gpu_block_sizes: Sequence[int],
        block_size_factor: int | Sequence[int] = 1,
        sliding_windows: Sequence[int | None] | None = None,
        *,
        hash_block_size: int | None = None,
        num_workers: int = 1,
    ) -> OffloadingSchedulerConfig:
        """Build a config from per-group GPU block sizes and one factor (or one per group).

        ``sliding_windows[g]`` is group g's window in offloaded blocks (None: full attention).

        Raises:
            InvalidTypeError: ``gpu_block_sizes`` (or a per-group ``block_size_factor`` /
                ``sliding_windows``) is not a sequence, or an entry is not an int.
            InvalidArgumentError: the per-group sequences differ in length, or a value is out of range.
        """
        n = len(_as_sequence(gpu_block_sizes, "gpu_block_sizes"))
        if isinstance(block_size_factor, (int, np.integer)):
            factors: list[object] = [block_size_factor] * n
        else:
            factors = list(_as_sequence(block_size_factor, "block_size_factor", "an int or "))
        windows = [None] * n if sliding_windows is None else list(_as_sequence(sliding_windows, "sliding_windows"))
        if len(factors) != n or len(windows) != n:
            raise InvalidArgumentError(
                f"block_size_factor and sliding_windows need one entry per group ({n}), "
                f"got {len(factors)} and {len(windows)}"
            )
        groups = []
        for g in range(n):
            bs = check_int(gpu_block_sizes[g], f"gpu_block_sizes[{g}]", 1)
            f = check_int(factors[g], f"block_size_factor[{g}]", 1)
            w = windows[g]
            if w is not None:
                check_int(w, f"sliding_windows[{g}]", 1)
            groups.append(GroupOffloadConfig(g, bs, bs * f, w))
        return cls(tuple(groups), hash_block_size=hash_block_size, num_workers=num_workers)


def _as_sequence(value: object, name: str, alternative: str = "") -> Sequence[object] | np.ndarray:
    """``value`` if it is a sequence of per-group values (a list, tuple or 1-D array), else a typed error."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise InvalidTypeError(
            f"{name} must be {alternative}a sequence with one entry per group, got {type(value).__name__} {value!r:.40}"
        )
    return value
