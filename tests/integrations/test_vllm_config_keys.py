"""kv_connector_extra_config checked when vLLM starts: operator mistakes against the message each
gives, through vLLM's own spec factory; the keys' table of docs/vllm.md against the list the
check uses; the keys vLLM reads, against vLLM's own source."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

from kvoffload.errors import InvalidArgumentError, InvalidTypeError  # noqa: E402
from kvoffload.integrations.vllm.config_keys import KEYS, markdown_table, parse_size  # noqa: E402
from kvoffload.transfer.numa import bound_node  # noqa: E402
from tests.integrations.tier_roles import ROW, offloading_config  # noqa: E402
from tests.integrations.vllm_harness import PAGE, SPEC_MODULE, Engine  # noqa: E402
from tests.transfer.test_numa import USABLE, needs_syscalls  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = {"spec_name": "KVOffloadSpec", "spec_module_path": "kvoffload.integrations.vllm"}


def _start(**extra: Any) -> Any:
    """What vLLM does at start: its spec factory builds the spec from the extra config."""
    return OffloadingSpecFactory.create_spec(offloading_config({**BASE, **extra}))


#: (what the operator wrote, the error's type, what the message says)
MISTAKES = [
    (
        {"cpu_bytes_to_use": 4096, "evicton_policy": "arc"},
        InvalidArgumentError,
        r"unknown key 'evicton_policy' \(did you mean 'eviction_policy'\?\)",
    ),
    ({"cpu_bytes_to_use": 4096, "store_treshold": 2}, InvalidArgumentError, r"did you mean 'store_threshold'"),
    ({"cpu_bytes_to_use": 4096, "secondary_tier": []}, InvalidArgumentError, r"did you mean 'secondary_tiers'"),
    ({"cpu_bytes_to_use": 4096, "kernel_backed": "torch"}, InvalidArgumentError, r"did you mean 'kernel_backend'"),
    ({"cpu_bytes_to_use": 4096, "max_tracker": 10}, InvalidArgumentError, r"did you mean 'max_tracker_size'"),
    (
        {"cpu_byte_to_use": 4096},
        InvalidArgumentError,
        r"unknown key 'cpu_byte_to_use' \(did you mean 'cpu_bytes_to_use'\?\)",
    ),
    ({"cpu_bytes_to_use": 4096, "colour": "blue"}, InvalidArgumentError, r"unknown key 'colour'(?! \(did)"),
    ({}, InvalidArgumentError, r"\['cpu_bytes_to_use'\] is missing"),
    ({"cpu_bytes_to_use": None}, InvalidArgumentError, r"is missing"),
    ({"cpu_bytes_to_use": "16 gigs"}, InvalidArgumentError, r"must be bytes or a number with a unit"),
    ({"cpu_bytes_to_use": "16GIBS"}, InvalidArgumentError, r"must be bytes or a number with a unit"),
    ({"cpu_bytes_to_use": 0}, InvalidArgumentError, r"must be a positive whole number of bytes"),
    ({"cpu_bytes_to_use": -5}, InvalidArgumentError, r"must be a positive whole number of bytes"),
    ({"cpu_bytes_to_use": "1.5B"}, InvalidArgumentError, r"must be a positive whole number of bytes"),
    ({"cpu_bytes_to_use": True}, InvalidTypeError, r"must be a byte count or a size"),
    ({"cpu_bytes_to_use": [4096]}, InvalidTypeError, r"must be a byte count or a size"),
    ({"cpu_bytes_to_use": 100}, InvalidArgumentError, r"holds no chunk"),
    (
        {"cpu_bytes_to_use": "4KiB", "secondary_tiers": [], "tier_poll_interval_s": "often"},
        (InvalidArgumentError, InvalidTypeError),
        r"tier_poll_interval_s",
    ),
    ({"cpu_bytes_to_use": "4KiB", "backpressure": 5}, InvalidArgumentError, r"\['backpressure'\] must be a dict"),
    ({"cpu_bytes_to_use": "4KiB", "strict_config": "no"}, InvalidTypeError, r"strict_config'\] must be true or false"),
    ({"cpu_bytes_to_use": "4KiB", "canonical_layout": True}, InvalidArgumentError, r"canonical_layout"),
    (
        {"cpu_bytes_to_use": "4KiB", "store_threshold": "two"},
        InvalidTypeError,
        r"store_threshold'\] must be an integer",
    ),
    ({"cpu_bytes_to_use": "4KiB", "secondary_tiers": "redis://x"}, InvalidArgumentError, r"must be a list"),
    ({"cpu_bytes_to_use": "4KiB", "numa_node": "near"}, InvalidArgumentError, r"numa_node'\] must be 'auto'"),
    ({"cpu_bytes_to_use": "4KiB", "numa_node": -1}, InvalidArgumentError, r"numa_node'\] must be 'auto'"),
    ({"cpu_bytes_to_use": "4KiB", "numa_node": True}, InvalidArgumentError, r"numa_node'\] must be 'auto'"),
]


@pytest.mark.parametrize("extra, error, match", MISTAKES, ids=[str(i) for i in range(len(MISTAKES))])
def test_a_mistake_fails_at_start_naming_the_key(extra: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _start(**extra)


@pytest.mark.parametrize(
    "value, nbytes",
    [(4096, 4096), (4096.0, 4096), ("4096", 4096), ("4KiB", 4096), ("4 kib", 4096), ("8KB", 8000), ("1.5MiB", 1572864)],
)
def test_sizes_take_units(value: Any, nbytes: int) -> None:
    assert parse_size(value, "cpu_bytes_to_use") == nbytes
    # 256 KV bytes a block, one worker: a chunk takes one page-sized row, as in vLLM's CPU spec
    assert _start(cpu_bytes_to_use=value).num_chunks == nbytes // ROW


def test_vllms_own_size_flag_starts() -> None:
    """vLLM's --kv-offloading-size writes cpu_bytes_to_use as GiB * 2**30, a float."""
    assert _start(cpu_bytes_to_use=0.5 * (1 << 30)).num_chunks == (1 << 29) // ROW


def test_strict_config_false_warns_once_and_starts(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kvoffload.integrations.vllm.config_keys"):
        spec = _start(cpu_bytes_to_use="4KiB", evicton_policy="arc", colour="blue", strict_config=False)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "evicton_policy" in warned[0] and "colour" in warned[0]
    assert spec.eviction_policy == "lru"  # the typo is still not read: the warning said so


def test_every_key_of_the_table_starts() -> None:
    """The keys kvoffload applies, each with a valid value, start together."""
    spec = _start(
        cpu_bytes_to_use="8KiB",
        block_size=4,
        eviction_policy="arc",
        store_threshold=0,
        max_tracker_size=10,
        offload_prompt_only=True,
        self_describing_kv_events=False,
        kernel_backend="torch",
        strict_config=True,
        canonical_layout=False,
        enable_telemetry=False,
    )
    assert spec.num_chunks == 8192 // ROW and spec.eviction_policy == "arc"


@pytest.mark.parametrize(
    "value, numa", [("auto", None), (None, None), (False, False), ("off", False), (0, 0), ("1", 1)]
)
def test_numa_node_values(value: Any, numa: Any) -> None:
    spec = _start(cpu_bytes_to_use="4KiB", numa_node=value)
    assert spec.numa == numa and type(spec.numa) is type(numa)


@needs_syscalls
def test_numa_node_places_the_workers_pool() -> None:
    """The key reaches the worker's host pool: its pages prefer that node before they are touched."""
    node = USABLE[-1]
    engine = Engine(
        {
            "spec_name": "KVOffloadSpec",
            "spec_module_path": SPEC_MODULE,
            "cpu_bytes_to_use": 64 * PAGE,
            "numa_node": node,
        }
    )
    try:
        pool = engine.worker.transfer_worker.host_pool
        assert pool.numa_node == node and bound_node(pool.buffer.data_ptr()) == node
    finally:
        engine.close()


def test_the_docs_table_is_the_checked_list() -> None:
    text = (ROOT / "docs" / "vllm.md").read_text()
    m = re.search(r"<!-- keys: begin -->\n(.*?)\n<!-- keys: end -->", text, flags=re.S)
    assert m is not None and m.group(1) == markdown_table()


def test_the_list_holds_every_key_vllm_reads() -> None:
    """Every literal key vLLM's offloading code reads from the extra config is in the list."""
    import vllm

    root = Path(vllm.__file__).parent
    files = [*(root / "v1" / "kv_offload").rglob("*.py")]
    files += [*(root / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "offloading").rglob("*.py")]
    pattern = re.compile(r"extra_config\.get\(\s*\"([a-z_]+)\"|extra_config\[\"([a-z_]+)\"\]")
    read = {a or b for f in files for a, b in pattern.findall(f.read_text())}
    assert read and read <= {k.name for k in KEYS}, read - {k.name for k in KEYS}


def test_tier_poll_interval_reaches_vllms_tiering_manager(tmp_path: Path) -> None:
    """vLLM 0.33's tier-polling pause, read as vLLM's own tiering spec reads it; vLLM 0.32 has no
    such thread: there it is an error at start (in the mistakes above)."""
    import inspect

    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

    if "tier_poll_interval_s" not in inspect.signature(TieringOffloadingManager.__init__).parameters:
        pytest.skip("vLLM < 0.33 has no tier-polling thread")
    from tests.integrations.tier_support import TIER_MODULE

    tier = {"type": "KVOffloadDiskTier", "module_path": TIER_MODULE, "root_dir": str(tmp_path / "kv")}
    spec = _start(cpu_bytes_to_use="64KiB", secondary_tiers=[tier], tier_poll_interval_s=0.25)
    manager = spec.get_manager()
    try:
        assert manager._tier_poll_interval_s == 0.25
    finally:
        manager.shutdown()
