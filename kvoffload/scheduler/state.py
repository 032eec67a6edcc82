"""Per-request offload state: keys and GPU block ids per group, store progress, the load offer.

A request is duck-typed (docs/contract.md §6): anything with ``request_id``, ``block_hashes`` (chained hash
per hash block, ``bytes``), ``num_tokens``, ``num_prompt_tokens`` and ``kv_transfer_params``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.offload.base import OffloadKey, ReqContext
from kvoffload.scheduler.config import OffloadingSchedulerConfig

logger = logging.getLogger(__name__)

__all__ = ["parse_max_offload_tokens", "RequestGroupState", "RequestOffloadState", "LoadOffer"]


def parse_max_offload_tokens(kv_transfer_params: Mapping[str, Any] | None, req_id: str = "") -> int | None:
    """The ``max_offload_tokens`` cap of a request, parsed once when its state is created.

    Accepted only when ``type(v) is int and v >= 0`` (``bool`` is rejected: ``True`` is not 1
    token). Anything else present -- ``"24"``, ``24.5``, ``-1``, ``True`` -- logs a warning and
    means no cap; an absent key or None means no cap; ``0`` offloads nothing.
    """
    if kv_transfer_params is None:
        return None
    if not isinstance(kv_transfer_params, Mapping):
        logger.warning(
            "request %s: kv_transfer_params must be a mapping, got %s; ignoring it",
            req_id,
            type(kv_transfer_params).__name__,
        )
        return None
    raw = kv_transfer_params.get("max_offload_tokens")
    if raw is None:
        return None
    if type(raw) is int and raw >= 0:
        return raw
    logger.warning(
        "request %s: max_offload_tokens must be a non-negative int, got %r (%s); offloading without a cap",
        req_id,
        raw,
        type(raw).__name__,
    )
    return None


class RequestGroupState:
    """One KV-cache group of one request.

    Attributes:
        keys: offload keys of the request's full offloaded blocks so far (prefix order).
        block_ids: the request's GPU block table for this group (GPU block ids, in token order).
        next_store_block: index of the first offloaded block not yet handed to ``prepare_store``.
        num_hit_blocks: offloaded blocks covered on the GPU after the last lookup's load.
    """

    __slots__ = ("keys", "block_ids", "next_store_block", "num_hit_blocks")

    def __init__(self) -> None:
        self.keys: list[OffloadKey] = []
        self.block_ids: list[int] = []
        self.next_store_block = 0
        self.num_hit_blocks = 0


@dataclass
class LoadOffer:
    """What the last ``get_num_new_matched_tokens`` offered, kept for ``update_state_after_alloc``.

    ``gpu_ranges[g] = (first, end)``: GPU block indices (within the request) group g would load.
    """

    num_computed_tokens: int
    num_new_tokens: int
    gpu_ranges: tuple[tuple[int, int], ...]


class RequestOffloadState:
    """Everything the scheduler remembers about one request.

    Attributes:
        req_id: the request id.
        request: the engine's request object (read for ``block_hashes`` / ``num_tokens``).
        req_context: passed to every manager call made for this request.
        max_offload_tokens: the store cap (None: no cap).
        groups: one :class:`RequestGroupState` per KV-cache group.
        in_flight: ids of this request's jobs that have not completed.
        load_job_id: the request's load job while it is in flight.
        offer: the pending load offer (see :class:`LoadOffer`).
        next_store_tokens: token count at which some group's next offloaded block fills
            (a fast pre-check in the per-step loop).
        capacity_tokens: tokens the GPU block tables cover in every group.
    """

    __slots__ = (
        "req_id",
        "request",
        "req_context",
        "max_offload_tokens",
        "groups",
        "in_flight",
        "load_job_id",
        "offer",
        "next_store_tokens",
        "capacity_tokens",
        "_config",
        "_suffixes",
        "_block_sizes",
    )

    def __init__(self, request: Any, config: OffloadingSchedulerConfig, suffixes: tuple[bytes, ...]) -> None:
        self.req_id: str = request.request_id
        self.request = request
        params = getattr(request, "kv_transfer_params", None)
        self.req_context = ReqContext(req_id=self.req_id, kv_transfer_params=params)
        self.max_offload_tokens = parse_max_offload_tokens(params, self.req_id)
        self.groups = [RequestGroupState() for _ in config.groups]
        self.in_flight: set[int] = set()
        self.load_job_id: int | None = None
        self.offer: LoadOffer | None = None
        self._config = config
        self._suffixes = suffixes
        self._block_sizes = tuple(g.gpu_block_size for g in config.groups)
        self.next_store_tokens = 0
        self.capacity_tokens = 0
        self.reset_store_progress(0)

    def set_block_ids(self, tables: list[list[int]]) -> None:
        """Replace the GPU block tables (one list per group, taken over, not copied)."""
        for gs, t in zip(self.groups, tables, strict=True):
            gs.block_ids = t
        self._update_capacity()

    def extend_block_ids(self, tables: list[list[int]]) -> None:
        """Append blocks to the GPU block tables (one list per group)."""
        for gs, t in zip(self.groups, tables, strict=True):
            if t:
                gs.block_ids.extend(t)
        self._update_capacity()

    def _update_capacity(self) -> None:
        self.capacity_tokens = min(
            len(gs.block_ids) * bs for gs, bs in zip(self.groups, self._block_sizes, strict=True)
        )

    def update_keys(self, num_tokens: int) -> None:
        """Extend each group's key list to the full offloaded blocks within ``num_tokens`` tokens
        (and within the hashed tokens)."""
        hashes = self.request.block_hashes
        hbs = self._config.effective_hash_block_size
        tokens = min(num_tokens, len(hashes) * hbs)
        for gcfg, gs, suffix in zip(self._config.groups, self.groups, self._suffixes, strict=False):
            n = tokens // gcfg.offloaded_block_size
            have = len(gs.keys)
            if n > have:
                step = gcfg.offloaded_block_size // hbs
                gs.keys.extend(OffloadKey(hashes[j] + suffix) for j in range((have + 1) * step - 1, n * step, step))

    def reset_store_progress(self, num_computed_tokens: int) -> None:
        """Start storing at the first offloaded block not fully computed before this point."""
        nxt = []
        for gcfg, gs in zip(self._config.groups, self.groups, strict=False):
            gs.next_store_block = num_computed_tokens // gcfg.offloaded_block_size
            nxt.append((gs.next_store_block + 1) * gcfg.offloaded_block_size)
        self.next_store_tokens = min(nxt)

    def advance_store_progress(self, full_blocks: list[int]) -> None:
        nxt = []
        for gcfg, gs, n in zip(self._config.groups, self.groups, full_blocks, strict=False):
            if n > gs.next_store_block:
                gs.next_store_block = n
            nxt.append((gs.next_store_block + 1) * gcfg.offloaded_block_size)
        self.next_store_tokens = min(nxt)

    def offloadable_tokens(self, num_computed_tokens: int) -> int:
        """Tokens whose KV may be offloaded: computed, hashed, and within ``max_offload_tokens``."""
        t = min(num_computed_tokens, len(self.request.block_hashes) * self._config.effective_hash_block_size)
        if self.max_offload_tokens is not None and self.max_offload_tokens < t:
            t = self.max_offload_tokens
        return t
