"""Baseline for ``bench_manager.py``: the straightforward OrderedDict LRU manager.

This is the design kvoffload's numpy manager is measured against, written the obvious way
(the way vLLM's CPU manager stores blocks): one ``OrderedDict`` key -> per-block status
object in LRU order, a ``ctypes`` struct per block (ref count, slot id; ref count -1 =
pending), a free list, per-key Python loops. It keeps a count of evictable blocks so that a
hopeless store fails in O(1), like vLLM, and counts lookup hits/misses (one counter bump per
lookup, as vLLM's manager and ours do). Same semantics as ``CPUOffloadingManager(lru)``
(docs/contract.md §2) for valid input; it does no input validation, keeps no events. Its specs are built
from ``int64`` arrays, so that the comparison does not depend on the cost of
``CPULoadStoreSpec``'s per-item checks of a Python list.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from kvoffload.core.base import CPULoadStoreSpec, PrepareStoreOutput, ReqContext


class BlockStatus(ctypes.Structure):
    """Status of one offloaded block: ``ref_cnt`` (-1 = store in flight) and its CPU slot."""

    _fields_ = [("ref_cnt", ctypes.c_int32), ("block_id", ctypes.c_int64)]

    def __init__(self, block_id: int) -> None:
        super().__init__()
        self.ref_cnt = -1
        self.block_id = block_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class OrderedDictLRUManager:
    """LRU offloading manager over an ``OrderedDict`` of per-block objects (benchmark baseline)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[bytes, BlockStatus] = OrderedDict()
        self.num_allocated = 0
        self.free_list: list[int] = []
        self.num_evictable = 0
        # lookup statistics, one counter bump per lookup (vLLM's manager keeps them too;
        # kvoffload's manager reports them in get_stats)
        self.hits = 0
        self.misses = 0
        self.pending_hits = 0

    def lookup(self, key: bytes, req_context: ReqContext) -> bool | None:
        block = self.blocks.get(key)
        if block is None:
            self.misses += 1
            return False
        if block.is_ready:
            self.hits += 1
            return True
        self.pending_hits += 1
        return None

    def prepare_load(self, keys: Iterable[bytes], req_context: ReqContext) -> CPULoadStoreSpec:
        ids = []
        for key in keys:
            block = self.blocks[key]
            assert block.is_ready
            if block.ref_cnt == 0:
                self.num_evictable -= 1
            block.ref_cnt += 1
            ids.append(block.block_id)
        return CPULoadStoreSpec(np.array(ids, dtype=np.int64))

    def touch(self, keys: Iterable[bytes], req_context: ReqContext) -> None:
        blocks = self.blocks
        for key in reversed(list(keys)):
            if key in blocks:
                blocks.move_to_end(key)

    def complete_load(self, keys: Iterable[bytes], req_context: ReqContext) -> None:
        for key in keys:
            block = self.blocks[key]
            assert block.ref_cnt > 0
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.num_evictable += 1

    def prepare_store(self, keys: Iterable[bytes], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        blocks = self.blocks
        to_store = [k for k in keys if k not in blocks]
        free = self.num_blocks - self.num_allocated + len(self.free_list)
        need = len(to_store) - free
        evicted: list[bytes] = []
        if need > 0:
            if need > self.num_evictable:
                return None
            got = self.evict(need, set(keys))
            if got is None:
                return None
            evicted = got
        ids = []
        for key in to_store:
            if self.num_allocated < self.num_blocks:
                slot = self.num_allocated
                self.num_allocated += 1
            else:
                slot = self.free_list.pop()
            blocks[key] = BlockStatus(slot)
            ids.append(slot)
        spec = CPULoadStoreSpec(np.array(ids, dtype=np.int64))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=spec, evicted_keys=evicted)

    def evict(self, need: int, protected: set[bytes]) -> list[bytes] | None:
        """Evict the ``need`` least recent ready, unpinned blocks not in ``protected``."""
        blocks = self.blocks
        evicted: list[bytes] = []
        for key, block in blocks.items():
            if block.ref_cnt == 0 and key not in protected:
                evicted.append(key)
                if len(evicted) == need:
                    break
        if len(evicted) < need:
            return None
        for key in evicted:
            self.free_list.append(blocks.pop(key).block_id)
        self.num_evictable -= need
        return evicted

    def complete_store(self, keys: Iterable[bytes], req_context: ReqContext, success: bool = True) -> None:
        blocks = self.blocks
        for key in keys:
            block = blocks.get(key)
            if block is None or block.is_ready:
                continue
            if success:
                block.ref_cnt = 0
                self.num_evictable += 1
            else:
                del blocks[key]
                self.free_list.append(block.block_id)


class SlottedBlock:
    """A leaner per-block object (``__slots__``) for the memory comparison."""

    __slots__ = ("ref_cnt", "block_id")

    def __init__(self, block_id: int) -> None:
        self.ref_cnt = -1
        self.block_id = block_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class SlottedOrderedDictLRUManager(OrderedDictLRUManager):
    """The baseline with ``__slots__`` objects instead of ctypes structs (memory comparison only)."""

    def prepare_store(self, keys: Iterable[bytes], req_context: ReqContext) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is not None:
            for key in out.keys_to_store:
                old = self.blocks[key]
                new = SlottedBlock(old.block_id)
                self.blocks[key] = new
        return out
