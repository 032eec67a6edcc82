"""``KVOffloadSpec``: vLLM's ``OffloadingSpec`` that puts kvoffload behind ``OffloadingConnector``.

Keys read from ``kv_connector_extra_config`` (the same as vLLM's own CPU spec, plus one):

* ``cpu_bytes_to_use`` (required): host memory for the pool, all workers together. The pool
  holds ``cpu_bytes_to_use // (kv bytes of one block on one worker * blocks_per_chunk *
  world_size)`` chunks per worker.
* ``block_size``: tokens per offloaded chunk, a multiple of the GPU block size (vLLM derives
  ``blocks_per_chunk`` from it; default: the GPU block size).
* ``eviction_policy``: ``lru`` (default), ``arc``, ``s3fifo``, a kvoffload ``module:Class`` cache
  policy, or a vLLM ``CachePolicy``: a name registered with vLLM's ``CachePolicyFactory``, or a
  class name in ``cache_policy_module_path`` (which may also hold a kvoffload policy class); see
  :mod:`kvoffload.integrations.vllm.policy`.
* ``store_threshold``: times a block must be offered for storing before it is stored (counted
  per offer, as vLLM counts); below 2 (default 0) every block is stored.
* ``max_tracker_size``: blocks the reuse counter remembers (default 64000).
* ``offload_prompt_only``: read by vLLM's connector itself (default True).
* ``kernel_backend``: kvoffload's data path, ``triton`` / ``torch`` / ``dma`` / ``module:Class``;
  default: ``KVOFFLOAD_BACKEND`` or the device's default (Triton on CUDA).

``KVOffloadSpec`` is registered as a virtual subclass of vLLM's ``CPUOffloadingSpec``
(``ABC.register``: nothing is inherited). vLLM 0.32's Prometheus exporter feeds its deprecated
transfer metrics (``vllm:kv_offload_total_bytes``, ``_total_time``, ``_size``, labelled by
``transfer_type``) only for specs that are ``CPUOffloadingSpec`` subclasses; this way they are
observed with kvoffload too, from the same transfer stats as the flat ``vllm:kv_offload_load_*``
/ ``_store_*`` metrics. Nothing else in vLLM asks whether a spec is a ``CPUOffloadingSpec``.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.kv_offload.base import OffloadingManager, OffloadingSpec, OffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.integrations.vllm.manager import KVOffloadManager
from kvoffload.integrations.vllm.policy import resolve_cache_policy
from kvoffload.integrations.vllm.worker import KVOffloadWorker

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadSpec"]

_INFO_KEYS = ("backend", "num_chunks", "eviction_policy", "store_threshold", "kernel_backend")


def _int(extra: Any, name: str, default: int) -> int:
    value = extra.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"kv_connector_extra_config[{name!r}] must be an integer, got {value!r}") from None


class KVOffloadSpec(OffloadingSpec):
    """vLLM offloading spec backed by kvoffload (see the module docstring for its keys)."""

    @classmethod
    def build_metric_definitions(cls, extra_config: Any) -> dict[str, Any]:
        """The Prometheus metrics the manager's stats carry: the same names and meanings as vLLM's
        own CPU spec (vLLM's exporter drops nothing it was not told about in advance)."""
        return dict(CPUOffloadingSpec.build_metric_definitions(extra_config))

    @classmethod
    def config_info_keys(cls, extra_config: Any = None) -> tuple[str, ...]:
        """Labels of vLLM 0.33's ``kv_offload_config_info`` metric that the manager fills."""
        return _INFO_KEYS

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        extra = self.extra_config
        cpu_bytes = _int(extra, "cpu_bytes_to_use", 0)
        if cpu_bytes <= 0:
            raise InvalidArgumentError("kv_connector_extra_config['cpu_bytes_to_use'] must be a positive byte count")
        self.eviction_policy: str = extra.get("eviction_policy", "lru")
        self.cache_policy_module_path: str | None = extra.get("cache_policy_module_path")
        self.store_threshold = _int(extra, "store_threshold", 0)
        self.max_tracker_size = _int(extra, "max_tracker_size", 64_000)
        self.kernel_backend: str | None = extra.get("kernel_backend") or None
        world = max(1, int(config.parallel.world_size))
        chunk_bytes = int(config.worker_kv_bytes_per_block) * self.blocks_per_chunk * world
        self.num_chunks = cpu_bytes // chunk_bytes if chunk_bytes > 0 else 0
        if chunk_bytes > 0 and self.num_chunks == 0:
            raise InvalidArgumentError(
                f"kv_connector_extra_config['cpu_bytes_to_use']={cpu_bytes} holds no chunk of {chunk_bytes} bytes"
            )
        self._manager: KVOffloadManager | None = None
        self._worker: KVOffloadWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            policy = resolve_cache_policy(self.eviction_policy, self.cache_policy_module_path)
            info = {
                "backend": "kvoffload",
                "num_chunks": self.num_chunks,
                "eviction_policy": policy,
                "store_threshold": self.store_threshold,
                "kernel_backend": self.kernel_backend or "auto",
            }
            self._manager = KVOffloadManager(
                self.num_chunks,
                cache_policy=policy,
                store_threshold=self.store_threshold,
                max_tracker_size=self.max_tracker_size,
                enable_events=bool(self.kv_events_config.enable_kv_cache_events),
                config_info=info,
            )
        return self._manager

    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        if self._worker is None:
            self._worker = KVOffloadWorker(kv_caches, self.num_chunks, self.blocks_per_chunk, self.kernel_backend)
        return self._worker


CPUOffloadingSpec.register(KVOffloadSpec)  # see the module docstring: vLLM's deprecated transfer metrics
