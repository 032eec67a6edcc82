"""``KVOffloadSpec``: vLLM's ``OffloadingSpec`` that puts kvoffload behind ``OffloadingConnector``.

Keys of ``kv_connector_extra_config``: every one that kvoffload or vLLM reads is listed, with
its value, default and meaning, in :data:`kvoffload.integrations.vllm.config_keys.KEYS` (the
table of docs/vllm.md is written from it) and checked at start: an unknown key, a size that is
not one, a missing ``cpu_bytes_to_use`` is an ``InvalidArgumentError`` naming the key (a typo
names the closest known key). ``canonical_layout`` (vLLM 0.33) is not implemented: set, it is an
error at start, never accepted and ignored. With ``secondary_tiers`` (kvoffload's
``KVOffloadTier`` -- any registered kvoffload tier by ``url``; aliases ``KVOffloadRedisTier`` /
``KVOffloadDiskTier`` -- or vLLM's own ``fs``, ``obj``, ``p2p``...), the scheduler runs vLLM's own
``TieringOffloadingManager`` with kvoffload's manager as its primary tier, and the pool is vLLM's
shared offload region (``/dev/shm``), mapped by the scheduler (where the tiers read and write it)
and by every worker (where kvoffload's kernels move the bytes).

Under vLLM's replicated layout (``OffloadingConfig.replicated_layout``: MLA at tensor-parallel
> 1, where every worker holds the same KV) the pool holds one copy of each chunk, in the shared
region with or without tiers: every worker maps the same slot of each row, rank 0 alone stores
(vLLM's connector worker reads :attr:`KVOffloadSpec.replicated_layout` to elect it), every worker
loads. ``cpu_bytes_to_use`` buys as many chunks as it does with vLLM's own CPU spec on CUDA, with
or without that layout (:mod:`kvoffload.integrations.vllm.shared_region` has the sizing).

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
from kvoffload.integrations.vllm.config_keys import check_keys, parse_size
from kvoffload.integrations.vllm.manager import KVOffloadManager
from kvoffload.integrations.vllm.policy import resolve_cache_policy
from kvoffload.integrations.vllm.shared_region import RegionGeometry, WorkerRegion, region_geometry
from kvoffload.integrations.vllm.tier_config import secondary_tier_configs, tier_classes, tiering_manager_options
from kvoffload.integrations.vllm.tier_namespace import KVOFFLOAD_LAYOUT
from kvoffload.integrations.vllm.worker import KVOffloadWorker

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadSpec"]

try:  # vLLM 0.33: the CPU tier's capacity labels (cpu_num_chunks, ..., cpu_kv_cache_size_tokens)
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo as _VLLMInfo
except ImportError:  # vLLM 0.32
    _VLLMInfo = None
#: the labels of vLLM 0.33's ``kv_offload_config_info`` metric: vLLM's CPU-tier labels, then kvoffload's
_INFO_KEYS: tuple[str, ...] = (
    *(_VLLMInfo.config_info_keys() if _VLLMInfo is not None else ()),
    *("backend", "num_chunks", "eviction_policy", "store_threshold", "kernel_backend"),
)


def _int(extra: Any, name: str, default: int) -> int:
    value = extra.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"kv_connector_extra_config[{name!r}] must be an integer, got {value!r}") from None


def _numa(extra: Any) -> bool | int | None:
    """``numa_node``: ``"auto"`` -> None (the GPU's node where known), false -> False, a node -> that int."""
    value = extra.get("numa_node", "auto")
    if value == "auto" or value is None:
        return None
    if value is False or (isinstance(value, str) and value.lower() in ("false", "off", "none")):
        return False
    if isinstance(value, bool):
        raise InvalidArgumentError("kv_connector_extra_config['numa_node'] must be 'auto', false or a node, got true")
    try:
        node = int(value)
    except (TypeError, ValueError):
        node = -1
    if node < 0:
        raise InvalidArgumentError(
            f"kv_connector_extra_config['numa_node'] must be 'auto', false or a node number >= 0, got {value!r}"
        )
    return node


class KVOffloadSpec(OffloadingSpec):
    """vLLM offloading spec backed by kvoffload (see the module docstring for its keys)."""

    @classmethod
    def build_metric_definitions(cls, extra_config: Any) -> dict[str, Any]:
        """The Prometheus metrics the manager's stats carry: the same names and meanings as vLLM's
        own CPU spec (vLLM's exporter drops nothing it was not told about in advance)."""
        if secondary_tier_configs(extra_config):
            from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

            return dict(TieringOffloadingSpec.build_metric_definitions(extra_config))
        return dict(CPUOffloadingSpec.build_metric_definitions(extra_config))

    @classmethod
    def config_info_keys(cls, extra_config: Any = None) -> tuple[str, ...]:
        """Labels of vLLM 0.33's ``kv_offload_config_info`` metric that the manager fills."""
        configs = secondary_tier_configs(extra_config or {})
        if not configs:
            return _INFO_KEYS
        keys = dict.fromkeys((*_INFO_KEYS, "tier"))
        for cfg, tier_cls in zip(configs, tier_classes(configs), strict=True):
            info_keys = getattr(tier_cls, "config_info_keys", None)  # vLLM 0.33
            keys.update(dict.fromkeys(info_keys(cfg) if info_keys is not None else ()))
        return tuple(keys)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        extra = self.extra_config
        if extra.get("canonical_layout") or getattr(config, "canonical_layout", False):
            raise InvalidArgumentError(
                "kv_connector_extra_config['canonical_layout']: kvoffload does not implement vLLM's canonical "
                "per-layer host layout (KV shared across tensor-parallel sizes); its host records are laid out "
                "per worker. Remove canonical_layout, or use vLLM's own CPU offloading for it."
            )
        check_keys(extra)
        cpu_bytes = parse_size(extra.get("cpu_bytes_to_use"), "cpu_bytes_to_use")
        self.eviction_policy: str = extra.get("eviction_policy", "lru")
        self.cache_policy_module_path: str | None = extra.get("cache_policy_module_path")
        self.store_threshold = _int(extra, "store_threshold", 0)
        self.max_tracker_size = _int(extra, "max_tracker_size", 64_000)
        self.kernel_backend: str | None = extra.get("kernel_backend") or None
        #: NUMA placement of the pool's pages (``numa_node``; HostPool's ``numa``)
        self.numa = _numa(extra)
        #: the checked ``secondary_tiers`` (empty: no tiers, a private pool in each worker)
        self.secondary_tier_configs = secondary_tier_configs(extra)
        #: options of vLLM's tiering manager set in the config (with tiers)
        self.tiering_options = tiering_manager_options(extra)
        #: how a host record is laid out (part of a tier's namespace)
        self.host_layout = KVOFFLOAD_LAYOUT
        world = max(1, int(config.parallel.world_size))
        #: vLLM's replicated layout (MLA at tensor-parallel > 1, as vLLM decides it in
        #: ``OffloadingConfig.replicated_layout``): the pool holds one copy of a chunk, rank 0 stores
        #: it, every worker loads it. vLLM's connector worker reads this attribute to elect the
        #: store writer. Unlike vLLM's CPU spec, it is not narrowed to CUDA / XPU platforms:
        #: vLLM gates it there because its CPU worker keeps a private tensor elsewhere, where a
        #: non-writer would load bytes nobody stored; kvoffload's workers always map one shared
        #: region under this layout, whatever the platform.
        self.replicated_layout: bool = bool(getattr(config, "replicated_layout", False))
        #: whether this worker runs the stores (vLLM's election: every worker, or rank 0 alone
        #: under a replicated layout)
        self.store_writer: bool = not self.replicated_layout or int(config.parallel.rank) == 0
        copies = 1 if self.replicated_layout else world
        if self.secondary_tier_configs and self.store_threshold >= 2:
            raise InvalidArgumentError(
                "kv_connector_extra_config['store_threshold'] >= 2 cannot be combined with secondary_tiers"
            )
        #: the pool's shape, as vLLM's CPU spec sizes it (rows rounded up to the OS page)
        self.geometry: RegionGeometry = region_geometry(
            cpu_bytes, config.worker_kv_bytes_per_block, self.blocks_per_chunk, copies
        )
        self.num_chunks: int = self.geometry.num_chunks
        #: whether the workers keep the pool in vLLM's shared region: with tiers (the scheduler's
        #: tiers read and write it) or under a replicated layout (one copy for all workers)
        self.shared_pool: bool = self.num_chunks > 0 and (bool(self.secondary_tier_configs) or self.replicated_layout)
        #: host bytes of one chunk, every copy and the row's padding (vLLM's ``kv_bytes_per_chunk``)
        self.chunk_bytes: int = self.geometry.row_bytes
        #: vLLM's CPU spec's names of the same sizes: a row, one worker's part of it
        self.kv_bytes_per_chunk: int = self.geometry.row_bytes
        self.cpu_page_size_per_worker: int = self.geometry.worker_bytes
        self._manager: OffloadingManager | None = None
        self._worker: KVOffloadWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            policy = resolve_cache_policy(self.eviction_policy, self.cache_policy_module_path)
            info: dict[str, Any] = {}
            if _VLLMInfo is not None:  # vLLM 0.33's capacity facts of this pool, as its own CPU spec computes them
                info.update(_VLLMInfo.from_config(self.config, self.num_chunks, self.chunk_bytes).as_config_info())
            info |= {
                "backend": "kvoffload",
                "num_chunks": self.num_chunks,
                "eviction_policy": policy,
                "store_threshold": self.store_threshold,
                "kernel_backend": self.kernel_backend or "auto",
            }
            options: dict[str, Any] = {
                "cache_policy": policy,
                "store_threshold": self.store_threshold,
                "max_tracker_size": self.max_tracker_size,
                "enable_events": bool(self.kv_events_config.enable_kv_cache_events),
                "config_info": info,
            }
            if not self.secondary_tier_configs:
                self._manager = KVOffloadManager(self.num_chunks, **options)
            else:
                from kvoffload.integrations.vllm.tiered_manager import build_tiering_manager

                self._manager = build_tiering_manager(self, self.geometry, options)
        return self._manager

    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        if self._worker is None:
            region = None
            if self.shared_pool:
                slot = 0 if self.replicated_layout else int(self.config.parallel.rank)
                region = WorkerRegion(self.config.engine_id, self.geometry, slot)
            # the worker checks its chunks itself only where its own stores are all that write them
            sole_writer = region is None or (
                self.store_writer and self.replicated_layout and not self.secondary_tier_configs
            )
            try:
                self._worker = KVOffloadWorker(
                    kv_caches,
                    self.num_chunks,
                    self.blocks_per_chunk,
                    self.kernel_backend,
                    region=region,
                    sole_writer=sole_writer,
                    # one copy for every worker (replicated layout): its writer places it
                    numa=self.numa if self.store_writer or not self.replicated_layout else False,
                )
            except Exception:
                if region is not None:
                    region.close()
                raise
        return self._worker


CPUOffloadingSpec.register(KVOffloadSpec)  # see the module docstring: vLLM's deprecated transfer metrics
