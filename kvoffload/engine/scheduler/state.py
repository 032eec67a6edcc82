"""Per-request offload state: keys and GPU block ids per group, store progress, the load offer.

A request is duck-typed (docs/contract.md §6): anything with ``request_id``, ``block_hashes`` (chained hash
per hash block, ``bytes``), ``num_tokens``, ``num_prompt_tokens`` and ``kv_transfer_params``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.core.base import OffloadKey, ReqContext
from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

__all__ = ["FREED", "parse_max_offload_tokens", "RequestGroupState", "RequestOffloadState", "LoadOffer"]

#: The entry of a request's GPU block table where it holds no block: the engine freed it (a
#: sliding-window block that left the window) or gave the configured null block id.
FREED = -1


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
        block_ids: the request's GPU block table for this group (GPU block ids, in token order;
            :data:`FREED` where it holds no block).
        has_holes: whether ``block_ids`` holds :data:`FREED` entries.
        next_store_block: index of the first offloaded block not yet handed to ``prepare_store``.
        num_hit_blocks: offloaded blocks covered on the GPU after the last lookup's load.
    """

    __slots__ = ("keys", "block_ids", "has_holes", "next_store_block", "num_hit_blocks")

    def __init__(self) -> None:
        self.keys: list[OffloadKey] = []
        self.block_ids: list[int] = []
        self.has_holes = False
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
        "_null",
    )

    def __init__(self, request: Any, config: OffloadingSchedulerConfig, suffixes: tuple[bytes, ...]) -> None:
        self.req_id: str = request.request_id
        self.request = request
        params = getattr(request, "kv_transfer_params", None)
        tag = params.get("kv_workload") if isinstance(params, Mapping) else None
        self.req_context = ReqContext(self.req_id, params, tag if isinstance(tag, str) else None)
        self.max_offload_tokens = parse_max_offload_tokens(params, self.req_id)
        self.groups = [RequestGroupState() for _ in config.groups]
        self.in_flight: set[int] = set()
        self.load_job_id: int | None = None
        self.offer: LoadOffer | None = None
        self._config = config
        self._suffixes = suffixes
        self._block_sizes = tuple(g.gpu_block_size for g in config.groups)
        self._null = config.null_block_id
        self.next_store_tokens = 0
        self.capacity_tokens = 0
        self.reset_store_progress(0)

    def mark_null(self, tables: list[list[int]]) -> None:
        """Replace the configured null block id by :data:`FREED` in ``tables`` (in place)."""
        null = self._null
        if null is None:
            return
        for t in tables:
            if null in t:
                t[:] = [FREED if b == null else b for b in t]

    def set_block_ids(self, tables: list[list[int]]) -> None:
        """Replace the GPU block tables (one list per group, taken over, not copied; null
        block ids become :data:`FREED` in place)."""
        self.mark_null(tables)
        for gs, t in zip(self.groups, tables, strict=True):
            gs.block_ids = t
            gs.has_holes = FREED in t
        self._update_capacity()

    def extend_block_ids(self, tables: list[list[int]]) -> None:
        """Append blocks to the GPU block tables (one list per group; null block ids become
        :data:`FREED` in place)."""
        self.mark_null(tables)
        for gs, t in zip(self.groups, tables, strict=True):
            if t:
                gs.block_ids.extend(t)
                gs.has_holes = gs.has_holes or FREED in t
        self._update_capacity()

    def table_positions(self, tables: list[list[int]], name: str) -> list[list[int]]:
        """Per group, the indices in the request's block table of the blocks ``tables[g]``
        (the null block id skipped); a block the request does not hold is an error."""
        out: list[list[int]] = []
        for g, (ids, gs) in enumerate(zip(tables, self.groups, strict=True)):
            pos: list[int] = []
            if ids:
                index = {b: i for i, b in enumerate(gs.block_ids) if b != FREED}
                for b in ids:
                    if b == self._null:
                        continue
                    i = index.get(b)
                    if i is None:
                        raise InvalidArgumentError(
                            f"{name}[{g}]: block {b} is not in request {self.req_id}'s block table of group {g}"
                        )
                    pos.append(i)
            out.append(pos)
        return out

    def free_positions(self, positions: list[list[int]]) -> list[list[int]]:
        """Per group, table indices whose blocks the engine freed: they become :data:`FREED`.
        Returns the freed block ids per group."""
        freed: list[list[int]] = []
        for gs, pos in zip(self.groups, positions, strict=True):
            freed.append([gs.block_ids[i] for i in pos])
            for i in pos:
                gs.block_ids[i] = FREED
            gs.has_holes = gs.has_holes or bool(pos)
        return freed

    def _update_capacity(self) -> None:
        self.capacity_tokens = min(
            len(gs.block_ids) * bs for gs, bs in zip(self.groups, self._block_sizes, strict=True)
        )

    def sync_keys(self) -> None:
        """Drop the keys that no longer match ``request.block_hashes`` (the engine re-submitted the
        request with other hashes: a changed prompt, a reused id). The hashes are chained, so the
        last key matching means they all do: O(groups) when nothing changed. The store progress
        is not touched: it is reset when the request is (re)admitted."""
        hashes = self.request.block_hashes
        hbs = self._config.effective_hash_block_size
        for gcfg, gs, suffix in zip(self._config.groups, self.groups, self._suffixes, strict=False):
            keys = gs.keys
            n = len(keys)
            step = gcfg.offloaded_block_size // hbs
            if not n or (n * step <= len(hashes) and keys[-1] == hashes[n * step - 1] + suffix):
                continue
            m = 0
            while m < n and (m + 1) * step <= len(hashes) and keys[m] == hashes[(m + 1) * step - 1] + suffix:
                m += 1
            del keys[m:]

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
