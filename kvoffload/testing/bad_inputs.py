"""Bad pack/unpack arguments and the typed error each must raise before anything is written.

:func:`bad_input_cases` returns named mutations of a valid job; :func:`check_bad_input` runs one
against a backend and verifies the error type and that neither the host buffer nor any cache byte
changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import KernelBackend
from kvoffload.testing.cases import Case
from kvoffload.testing.checks import Job, assert_bytes_equal, make_host, snapshot

__all__ = ["BadInput", "bad_input_cases", "check_bad_input"]

Args = dict[str, Any]


@dataclass(frozen=True)
class BadInput:
    name: str
    mutate: Callable[[Args, KVCacheTable], Args]  # valid args -> bad args
    error: type[Exception]
    directions: tuple[str, ...] = ("pack", "unpack")
    cuda_only: bool = False


def _set(**kw: Any) -> Callable[[Args, KVCacheTable], Args]:
    def f(args: Args, table: KVCacheTable) -> Args:
        out = dict(args)
        for k, v in kw.items():
            out[k] = v(args, table) if callable(v) else v
        return out

    return f


def _first_nonempty(table: KVCacheTable) -> int:
    return next(g for g, t in enumerate(table.groups) if t.views)


def _block_out_of_range(args: Args, table: KVCacheTable) -> Args:
    out = dict(args)
    g = _first_nonempty(table)
    i = int(np.flatnonzero(args["group_ids"] == g)[-1])
    bids = args["block_ids"].copy()
    bids[i] = table.groups[g].num_blocks
    out["block_ids"] = bids
    return out


def _negative_block(args: Args, table: KVCacheTable) -> Args:
    out = dict(args)
    bids = args["block_ids"].copy()
    bids[-1] = -1
    out["block_ids"] = bids
    return out


def _record_past_end(args: Args, table: KVCacheTable) -> Args:
    out = dict(args)
    g = _first_nonempty(table)
    i = int(np.flatnonzero(args["group_ids"] == g)[-1])
    offs = args["host_offsets"].copy()
    offs[i] = args["host"].numel() - table.groups[g].record_bytes + 1
    out["host_offsets"] = offs
    return out


def _host_too_small(args: Args, table: KVCacheTable) -> Args:
    out = dict(args)
    rb = np.array(table.record_bytes, dtype=np.int64)[args["group_ids"]]
    end = int((args["host_offsets"] + rb)[rb > 0].max())
    out["host"] = args["host"][: end - 1]
    return out


def _second_like_first(args: Args, table: KVCacheTable, field: str, plus: int) -> Args:
    """``args`` with ``field`` of the second block of the first non-empty group set to the first
    block's plus ``plus``."""
    out = dict(args)
    idx = np.flatnonzero(args["group_ids"] == _first_nonempty(table))
    values = args[field].copy()
    values[idx[1]] = values[idx[0]] + plus
    out[field] = values
    return out


def _overlapping_records(args: Args, table: KVCacheTable) -> Args:
    return _second_like_first(args, table, "host_offsets", 1)


def _duplicate_block(args: Args, table: KVCacheTable) -> Args:
    return _second_like_first(args, table, "block_ids", 0)


def bad_input_cases() -> list[BadInput]:
    """Every bad-input scenario of the contract (docs/contract.md §7)."""
    return [
        BadInput("block_id_out_of_range", _block_out_of_range, InvalidArgumentError),
        BadInput("negative_block_id", _negative_block, InvalidArgumentError),
        BadInput(
            "group_id_out_of_range",
            _set(group_ids=lambda a, t: np.full_like(a["group_ids"], t.num_groups)),
            InvalidArgumentError,
        ),
        BadInput("lengths_disagree", _set(block_ids=lambda a, t: a["block_ids"][:-1]), InvalidArgumentError),
        BadInput(
            "offsets_length_disagree", _set(host_offsets=lambda a, t: a["host_offsets"][1:]), InvalidArgumentError
        ),
        BadInput("record_past_end_of_host", _record_past_end, InvalidArgumentError),
        BadInput("host_too_small", _host_too_small, InvalidArgumentError),
        BadInput(
            "negative_host_offset",
            _set(host_offsets=lambda a, t: a["host_offsets"] - int(a["host_offsets"].max()) - 1),
            InvalidArgumentError,
        ),
        BadInput("host_dtype_not_uint8", _set(host=lambda a, t: a["host"].view(torch.int8)), InvalidTypeError),
        BadInput(
            "host_not_1d",
            _set(host=lambda a, t: a["host"][: a["host"].numel() // 2 * 2].view(2, -1)),
            InvalidArgumentError,
        ),
        BadInput("host_not_contiguous", _set(host=lambda a, t: a["host"][::2]), InvalidArgumentError),
        BadInput("host_not_a_tensor", _set(host=lambda a, t: a["host"].numpy()), InvalidTypeError),
        BadInput(
            "host_on_wrong_device",
            _set(host=lambda a, t: torch.empty(a["host"].numel(), dtype=torch.uint8, device="meta")),
            InvalidArgumentError,
        ),
        BadInput("host_on_cuda", _set(host=lambda a, t: a["host"].to(t.device)), InvalidArgumentError, cuda_only=True),
        BadInput("host_not_pinned", _set(host=lambda a, t: a["host"].clone()), InvalidArgumentError, cuda_only=True),
        BadInput("block_ids_float", _set(block_ids=lambda a, t: a["block_ids"].astype(np.float64)), InvalidTypeError),
        BadInput("block_ids_bool", _set(block_ids=lambda a, t: a["block_ids"] > 0), InvalidTypeError),
        BadInput("group_ids_2d", _set(group_ids=lambda a, t: a["group_ids"].reshape(1, -1)), InvalidArgumentError),
        BadInput("table_not_a_table", _set(table="table"), InvalidTypeError),
        BadInput("overlapping_host_records", _overlapping_records, InvalidArgumentError, directions=("pack",)),
        BadInput("duplicate_block_in_unpack", _duplicate_block, InvalidArgumentError, directions=("unpack",)),
    ]


def check_bad_input(backend: KernelBackend, case: Case, job: Job, bad: BadInput, direction: str) -> None:
    """Run one bad call; assert ``bad.error`` is raised and no host or cache byte changed."""
    table = case.table()
    host = make_host(job.host_bytes, table.device, seed=7)
    args: Args = {
        "table": table,
        "host": host,
        "block_ids": job.block_ids.copy(),
        "group_ids": job.group_ids.copy(),
        "host_offsets": job.host_offsets.copy(),
    }
    args = bad.mutate(args, table)
    host_before = host.clone()
    cache_before = snapshot(case)
    fn = backend.pack if direction == "pack" else backend.unpack
    try:
        fn(args["table"], args["host"], args["block_ids"], args["group_ids"], args["host_offsets"])
    except bad.error:
        pass
    except Exception as exc:  # noqa: BLE001 - report the wrong type precisely
        raise AssertionError(
            f"{bad.name}/{direction}: expected {bad.error.__name__}, got {type(exc).__name__}: {exc}"
        ) from exc
    else:
        raise AssertionError(f"{bad.name}/{direction}: expected {bad.error.__name__}, nothing was raised")
    if table.device.type == "cuda":
        torch.cuda.synchronize(table.device)
    assert_bytes_equal(host, host_before, f"{bad.name}/{direction}: host changed despite the error")
    for i, (buf, old) in enumerate(zip(case.buffers, cache_before, strict=True)):
        assert_bytes_equal(buf, old, f"{bad.name}/{direction}: cache buffer {i} changed despite the error")
