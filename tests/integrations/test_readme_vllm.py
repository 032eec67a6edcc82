"""The README's vLLM configurations, run as written (but for the host-memory size, scaled to the test's
tiny model, and the Redis URL) through vLLM's real scheduler and connector: a second request with
the same prompt loads its prefix from kvoffload's CPU tier, a second engine loads through the
shared tier, and every computed position holds the right KV at every step."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

from kvoffload.testing.redis_server import RedisServer  # noqa: E402
from tests.integrations.engine_roles import ROW, run_prompts  # noqa: E402
from tests.integrations.test_vllm_shared_tiers import count_promotions  # noqa: E402
from tests.integrations.vllm_harness import BLOCK_SIZE, SPEC_MODULE, Engine  # noqa: E402
from tests.readme_blocks import kv_transfer_config, marked_blocks  # noqa: E402


def test_readme_vllm_config_serves_and_reloads() -> None:
    config = kv_transfer_config(marked_blocks("runnable")["vllm"])
    # the harness builds exactly this connector configuration around the extra config
    assert config["kv_connector"] == "KVOffloadConnector"
    assert config["kv_connector_module_path"] == SPEC_MODULE
    assert (config["kv_role"], config["kv_load_failure_policy"]) == ("kv_both", "recompute")
    extra = dict(config["kv_connector_extra_config"])
    assert extra["cpu_bytes_to_use"] >= 2**30  # as written: gigabytes for a real model
    extra["cpu_bytes_to_use"] = 64 * ROW  # 64 chunks of the test model's 256-byte pages (a page-sized row each)
    e = Engine(extra)
    prompt = [(i * 17) % 997 + 1 for i in range(29)]
    e.add("a", prompt)
    e.run()
    e.reset_gpu()  # only kvoffload's CPU tier still holds the prompt's KV
    e.add("b", prompt)
    e.run()
    assert e.outputs["b"] == e.outputs["a"]
    assert e.worker.counts["loads"] == 1 and e.worker.counts["failed_loads"] == 0
    assert len(e.manager.core) == 29 // BLOCK_SIZE
    assert e.manager.core.cache_policy == extra["eviction_policy"]


def test_readme_shared_tier_config_serves_a_second_engine(own_redis: RedisServer) -> None:
    """The README's shared-tier configuration, its Redis URL pointed at a test server: a second
    engine, its CPU pool and GPU cache empty, loads through Redis what the first one computed."""
    config = kv_transfer_config(marked_blocks("runnable")["vllm-tiers"])
    assert (config["kv_connector"], config["kv_connector_module_path"]) == ("KVOffloadConnector", SPEC_MODULE)
    extra = dict(config["kv_connector_extra_config"])
    (tier,) = extra["secondary_tiers"]
    extra["secondary_tiers"] = [{**tier, "url": own_redis.url}]
    extra["cpu_bytes_to_use"] = 64 * ROW
    prompt = {"t": [(i * 31) % 997 + 1 for i in range(29)]}
    first = Engine(extra)
    try:
        run_prompts(first, prompt)
    finally:
        first.close()
    second = Engine(extra)
    try:
        assert len(second.manager.core) == 0
        promoted = count_promotions(second)
        run_prompts(second, prompt, suffix="-2")
        assert second.outputs["t-2"] == first.outputs["t"]
        assert sum(promoted) == 29 // BLOCK_SIZE  # every full block came from Redis
        assert second.worker.counts["failed_loads"] == 0
    finally:
        second.close()
