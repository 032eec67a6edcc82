"""kvoffload's manager as the primary tier of vLLM's own ``TieringOffloadingManager``.

vLLM's tiering manager (``vllm/v1/kv_offload/tiering/manager.py``) drives its primary tier through
the GPU-facing ``OffloadingManager`` calls plus five of its own: ``get_kv_memoryview`` (the pool as
``(num_chunks, row_bytes)`` rows for the secondary tiers), ``prepare_read`` / ``complete_read``
(pin chunks while a tier copies them out, without making them more recent), ``prepare_write`` /
``complete_write`` (reserve chunks for a promotion, then make them loadable or drop them).
:class:`KVOffloadPrimaryTier` provides them over :class:`KVOffloadManager` and the scheduler's
mapping of the shared region.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, PrepareStoreOutput, ReqContext
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from kvoffload.integrations.vllm.manager import KVOffloadManager

__all__ = ["KVOffloadPrimaryTier"]


class KVOffloadPrimaryTier(KVOffloadManager):
    """:class:`KVOffloadManager` over the scheduler's mapping of the shared region.

    Args:
        num_blocks: chunks of the pool (rows of the region).
        region: vLLM's ``SharedOffloadRegion`` mapped with ``rank=None``; released at
            :meth:`shutdown`.
        **kwargs: the other arguments of :class:`KVOffloadManager`.
    """

    def __init__(self, num_blocks: int, region: Any, **kwargs: Any) -> None:
        super().__init__(num_blocks, **kwargs)
        self._region = region
        self._num_chunks = num_blocks  # read by vLLM's tiering manager
        self._kv_memoryview: memoryview = region.create_kv_memoryview()

    def get_kv_memoryview(self) -> memoryview:
        """The pool as a ``(num_chunks, row_bytes)`` memoryview; row ``c`` is chunk ``c``."""
        return self._kv_memoryview

    def prepare_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """Pin ``keys`` (ready) while a secondary tier reads them; their recency is unchanged."""
        return CPULoadStoreSpec(self.core.load_slots(list(keys), req_context, record_access=False))  # type: ignore[arg-type]

    def complete_read(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin what :meth:`prepare_read` pinned."""
        self.core.complete_load(list(keys), req_context)  # type: ignore[arg-type]

    def prepare_write(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Reserve chunks for a promotion (as a store: pending until :meth:`complete_write`)."""
        return self.prepare_store(keys, req_context)

    def complete_write(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """A promotion finished: its chunks become loadable (``success``) or are dropped."""
        self.complete_store(keys, req_context, success)

    def shutdown(self) -> None:
        super().shutdown()
        self._kv_memoryview.release()
        self._region.cleanup()
