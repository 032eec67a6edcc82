"""Every key of ``kv_connector_extra_config`` that ``KVOffloadSpec`` or vLLM reads, checked at start.

:data:`KEYS` is the one source: :func:`check_keys` validates a configuration against it when the
spec starts (an unknown key is an error naming the closest known one; ``"strict_config": false``
turns that into one warning), :func:`parse_size` reads sizes with
units, and :func:`markdown_table` writes the table of docs/vllm.md (a test compares the two).

The vLLM keys are those vLLM 0.32 and 0.33 read from this dict for the ``OffloadingConnector``
(``vllm/v1/kv_offload`` and ``kv_connector/v1/offloading``), and those of vLLM's own
``TieringOffloadingSpec``, which ``KVOffloadSpec`` replaces and reads the same way.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["ConfigKey", "KEYS", "WHERE", "check_keys", "parse_size", "markdown_table"]

#: how messages name the dict
WHERE = "kv_connector_extra_config"


@dataclass(frozen=True)
class ConfigKey:
    """One key: its name, the value it takes, its default as written in the docs, what reads it
    (``kvoffload`` or ``vLLM``) and what it means."""

    name: str
    kind: str
    default: str
    read_by: str
    meaning: str


KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("spec_name", "str", "`CPUOffloadingSpec`", "vLLM", "`KVOffloadSpec`."),
    ConfigKey("spec_module_path", "str", "—", "vLLM", "`kvoffload.integrations.vllm`."),
    ConfigKey(
        "cpu_bytes_to_use",
        "size",
        "required",
        "kvoffload",
        'host memory of the pool, all workers together: bytes, or a size with a unit (`"16GiB"`, '
        '`"500MB"`; KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024). The pool holds '
        "`cpu_bytes_to_use // round_up(KV bytes of one GPU block on one worker × GPU blocks per offloaded "
        "block × copies, OS page)` offloaded blocks per worker, as vLLM's CPU spec: `copies` is the number of "
        "workers, or 1 under vLLM's replicated layout (MLA at tensor-parallel > 1: one copy, stored by rank 0).",
    ),
    ConfigKey(
        "block_size",
        "int",
        "the GPU block size",
        "vLLM",
        "tokens per offloaded block, a multiple of the GPU block size (or give `blocks_per_chunk`).",
    ),
    ConfigKey("blocks_per_chunk", "int", "1", "vLLM", "GPU blocks per offloaded block (or give `block_size`)."),
    ConfigKey(
        "eviction_policy",
        "str",
        "`lru`",
        "kvoffload",
        "`lru`, `arc`, `s3fifo`, `headstart` (LRU with a head start for blocks seen before: "
        "[Eviction policies](policies.md); it also reads a request's `kv_transfer_params="
        '{"kv_workload": "text/2"}` tag, see [workload tags](policies.md#workload-tags)), a '
        "kvoffload `package.module:Class` policy, or a vLLM `CachePolicy` as vLLM takes it: a name "
        "registered with vLLM's `CachePolicyFactory`, or a class name in `cache_policy_module_path` "
        "(a kvoffload policy class there works too). Names are resolved in vLLM's order (registered "
        "names first); kvoffload's `lru` and `arc` are vLLM's rules (`lru` those of the vLLM it runs under: "
        "0.33's request-scoped ranking is `request_lru`). A vLLM policy class runs inside "
        "an adapter from its key-based interface to kvoffload's slot-based manager "
        "(`kvoffload/integrations/vllm/policy.py`).",
    ),
    ConfigKey(
        "cache_policy_module_path", "str", "—", "kvoffload", "module of a policy class named by `eviction_policy`."
    ),
    ConfigKey(
        "store_threshold",
        "int",
        "0",
        "kvoffload",
        "store a block only once it was offered this many times (counted per offer, as vLLM counts); "
        "below 2 everything is stored. Blocks already stored pass whatever their count: they stay "
        "protected from the evictions of the call that offers them, and only absent blocks held back "
        "count as skipped stores (`vllm:kv_offload_stores_skipped`), as in vLLM. Not with "
        "`secondary_tiers`.",
    ),
    ConfigKey(
        "max_tracker_size", "int", "64000", "kvoffload", "blocks the reuse counter of `store_threshold` remembers."
    ),
    ConfigKey("offload_prompt_only", "bool", "true", "vLLM", "offload prompt blocks only."),
    ConfigKey("self_describing_kv_events", "bool", "false", "vLLM", "vLLM's self-describing KV events."),
    ConfigKey(
        "kernel_backend",
        "str",
        "`KVOFFLOAD_BACKEND`, else Triton on CUDA",
        "kvoffload",
        "kvoffload's data path: `triton`, `torch`, `page_loop` or `package.module:Class`.",
    ),
    ConfigKey(
        "numa_node",
        "str/int/bool",
        "`auto`",
        "kvoffload",
        "NUMA node of the host pool's pages: `auto` (the node of the worker's GPU, from its PCI bus id in "
        "sysfs; nothing where unknown), `false` (first touch places them), or a node number. In a shared "
        "region each worker places its own area of each row; under the replicated layout the writer (rank 0) "
        "places the one copy.",
    ),
    ConfigKey(
        "secondary_tiers",
        "list",
        "[]",
        "kvoffload",
        'tiers beneath the CPU pool, each `{"type": ..., ["module_path": ...], ...}` as in vLLM.',
    ),
    ConfigKey("backpressure", "dict", "—", "kvoffload", "default back-pressure of every tier, as in vLLM."),
    ConfigKey("enable_telemetry", "bool", "false", "vLLM", "metrics of vLLM's `kvcr` tier."),
    ConfigKey(
        "strict_config",
        "bool",
        "true",
        "kvoffload",
        "false: an unknown key is one warning at start instead of an error.",
    ),
    ConfigKey(
        "canonical_layout",
        "bool",
        "false",
        "vLLM",
        "vLLM 0.33's canonical per-layer host layout, not implemented by kvoffload: an error when true.",
    ),
    ConfigKey(
        "tier_poll_interval_s",
        "float",
        "vLLM's",
        "kvoffload",
        "with `secondary_tiers`: the pause of vLLM 0.33's tier-polling thread, passed to vLLM's tiering "
        "manager (an error on vLLM 0.32, which has no such thread).",
    ),
    ConfigKey(
        "sync_load_budget_bytes",
        "int",
        "0",
        "vLLM 0.33",
        "bytes of CPU-tier hits vLLM 0.33's connector loads within the step (expedited loads, "
        "which kvoffload runs on the transfer worker's second stream).",
    ),
)

_BY_NAME = {k.name: k for k in KEYS}
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, name: str) -> int:
    """``value`` (bytes as an int or integral float, or a string such as ``"16GiB"``) in bytes.

    Raises:
        InvalidArgumentError: missing (None), not positive, or a string that is not a size.
        InvalidTypeError: neither a number nor a string.
    """
    where = f"{WHERE}[{name!r}]"
    if value is None:
        raise InvalidArgumentError(  # (vLLM's own wording first: "... must be specified in ...")
            f'{name} must be specified in {WHERE}: {where} is missing; give the bytes, or a size such as "16GiB"'
        )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidTypeError(f'{where} must be a byte count or a size such as "16GiB", got {value!r}')
    if isinstance(value, str):
        m = _SIZE.match(value)
        unit = _UNITS.get(m.group(2).lower()) if m else None
        if m is None or unit is None:
            units = ", ".join(u for u in _UNITS if u)
            raise InvalidArgumentError(f"{where} must be bytes or a number with a unit ({units}), got {value!r}")
        nbytes = float(m.group(1)) * unit
    else:
        nbytes = float(value)
    if not math.isfinite(nbytes) or nbytes != int(nbytes) or nbytes <= 0:
        raise InvalidArgumentError(f"{where} must be a positive whole number of bytes, got {value!r}")
    return int(nbytes)


def check_keys(extra: Mapping[str, Any]) -> None:
    """Refuse a key of ``extra`` that nothing reads, naming the closest known key; with
    ``"strict_config": false``, log one warning instead.

    Raises:
        InvalidArgumentError: an unknown key (strict).
        InvalidTypeError: ``strict_config`` not a bool.
    """
    strict = extra.get("strict_config", True)
    if not isinstance(strict, bool):
        raise InvalidTypeError(f"{WHERE}['strict_config'] must be true or false, got {strict!r}")
    problems = []
    for name in extra:
        key = _BY_NAME.get(name)
        if key is None:
            close = difflib.get_close_matches(str(name), list(_BY_NAME), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown key {name!r}{hint}")
    if not problems:
        return
    text = f"{WHERE}: " + "; ".join(problems)
    if strict:
        raise InvalidArgumentError(
            f"{text}. The keys kvoffload and vLLM read: {', '.join(_BY_NAME)} (docs/vllm.md); "
            '"strict_config": false makes this a warning'
        )
    logger.warning("%s (strict_config is false: starting anyway)", text)


def markdown_table() -> str:
    """The table of docs/vllm.md: every key, its value, default, reader and meaning."""
    lines = ["| key | value | default | read by | meaning |", "|---|---|---|---|---|"]
    for k in KEYS:
        lines.append(f"| `{k.name}` | {k.kind} | {k.default} | {k.read_by} | {k.meaning} |")
    return "\n".join(lines)
