"""vLLM's Prometheus exporter with KVOffloadSpec, against the same exporter with vLLM's own CPU spec.

vLLM 0.32 feeds its deprecated transfer metrics (``vllm:kv_offload_total_bytes``,
``_total_time``, ``_size``) only for ``CPUOffloadingSpec`` subclasses (issue 15).
"""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # noqa: E402
    OffloadingConnectorStats,
    OffloadPromMetrics,
)

SPECS = {
    "vllm-cpu": {"spec_name": "CPUOffloadingSpec"},
    "kvoffload": {"spec_name": "KVOffloadSpec", "spec_module_path": "kvoffload.integrations.vllm"},
}
DEPRECATED = ("vllm:kv_offload_total_bytes_total", "vllm:kv_offload_total_time_total", "vllm:kv_offload_size_count")
FLAT = ("vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total", "vllm:kv_offload_store_size_count")


def exported(spec: str) -> dict[tuple[str, str], float | None]:
    """Feed one step's transfer stats (a store and a load, as the connector reports them) to
    vLLM's exporter for ``spec``; the samples of the transfer metrics per transfer type."""
    registry = CollectorRegistry()

    def in_registry(cls: Any) -> Any:
        return lambda **kw: cls(registry=registry, **kw)

    extra = {"cpu_bytes_to_use": 1 << 20, **SPECS[spec]}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))
    types = {c: in_registry(c) for c in (Counter, Gauge, Histogram)}
    prom = OffloadPromMetrics(config, types, ["engine"], {0: ["0"]})  # type: ignore[arg-type]
    stats = OffloadingConnectorStats()
    stats.increase_counter("vllm:kv_offload_store_bytes", 8192)
    stats.increase_counter("vllm:kv_offload_store_time", 0.25)
    stats.observe_histogram("vllm:kv_offload_store_size", 8192)
    stats.increase_counter("vllm:kv_offload_load_bytes", 4096)
    stats.increase_counter("vllm:kv_offload_load_time", 0.125)
    stats.observe_histogram("vllm:kv_offload_load_size", 4096)
    prom.observe(stats.data)
    out: dict[tuple[str, str], float | None] = {}
    for name in DEPRECATED:
        for tt in ("GPU_to_CPU", "CPU_to_GPU"):
            out[name, tt] = registry.get_sample_value(name, {"engine": "0", "transfer_type": tt})
    for name in FLAT:
        out[name, ""] = registry.get_sample_value(name, {"engine": "0"})
    return out


@pytest.mark.parametrize("name", DEPRECATED)
def test_deprecated_transfer_metrics_are_observed_as_with_vllms_cpu_spec(name: str) -> None:
    theirs, ours = exported("vllm-cpu"), exported("kvoffload")
    assert theirs[name, "GPU_to_CPU"] and theirs[name, "CPU_to_GPU"]  # vLLM's spec: observed
    assert {k: v for k, v in ours.items() if k[0] == name} == {k: v for k, v in theirs.items() if k[0] == name}
    assert [ours[n, ""] for n in FLAT] == [theirs[n, ""] for n in FLAT] == [8192, 4096, 1]
