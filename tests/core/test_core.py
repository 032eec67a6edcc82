"""Core types: key helpers, spec validation, the default batch lookup."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kvoffload import (
    CPULoadStoreSpec,
    GPULoadStoreSpec,
    InvalidArgumentError,
    InvalidTypeError,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvoffload.core.base import validate_keys


@pytest.mark.parametrize("group_idx", [0, 1, 2, 255, 256, 2**32 - 1])
@pytest.mark.parametrize("block_hash", [b"", b"\x00", b"abc" * 11])
def test_key_round_trip(block_hash: bytes, group_idx: int) -> None:
    key = make_offload_key(block_hash, group_idx)
    assert isinstance(key, bytes)
    assert len(key) == len(block_hash) + 4
    assert get_offload_block_hash(key) == block_hash
    assert get_offload_group_idx(key) == group_idx


def test_key_is_big_endian() -> None:
    assert make_offload_key(b"h", 1) == b"h\x00\x00\x00\x01"
    assert make_offload_key(b"h", 0x01020304) == b"h\x01\x02\x03\x04"
    assert make_offload_key(b"h", 2**32 - 1) == b"h\xff\xff\xff\xff"
    assert get_offload_group_idx(b"xyz\x00\x00\x01\x00") == 256


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_key_rejects_group_out_of_range(bad: int) -> None:
    with pytest.raises(InvalidArgumentError, match="group_idx"):
        make_offload_key(b"h", bad)


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_key_rejects_non_int_group(bad: object) -> None:
    with pytest.raises(InvalidTypeError, match="group_idx"):
        make_offload_key(b"h", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["abc", bytearray(b"abc"), 12, None])
def test_key_rejects_non_bytes_hash(bad: object) -> None:
    with pytest.raises(InvalidTypeError, match="block_hash"):
        make_offload_key(bad, 0)  # type: ignore[arg-type]


def test_key_accessors_reject_short_or_non_bytes() -> None:
    with pytest.raises(InvalidArgumentError):
        get_offload_group_idx(b"abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        get_offload_block_hash("abcdef")  # type: ignore[arg-type]


def test_validate_keys() -> None:
    a, b = make_offload_key(b"a", 0), make_offload_key(b"b", 0)
    assert validate_keys((a, b)) == [a, b]
    with pytest.raises(InvalidArgumentError, match="more than once"):
        validate_keys([a, b, a])
    assert validate_keys([a, a], allow_duplicates=True) == [a, a]
    with pytest.raises(InvalidTypeError, match=r"keys\[1\]"):
        validate_keys([a, "b"])  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError, match="single"):
        validate_keys(a)


def test_req_context_defaults() -> None:
    ctx = ReqContext()
    assert ctx.req_id == "" and ctx.kv_transfer_params is None
    assert ReqContext("r1", {"max_offload_tokens": 4}).kv_transfer_params == {"max_offload_tokens": 4}


def test_cpu_spec() -> None:
    spec = CPULoadStoreSpec([3, 2, 1])
    assert spec.medium() == "CPU" and CPULoadStoreSpec.medium() == "CPU"
    assert spec.block_ids.dtype == np.int64 and spec.block_ids.tolist() == [3, 2, 1]
    assert len(spec) == 3
    assert CPULoadStoreSpec(np.array([5], dtype=np.int32)).block_ids.dtype == np.int64
    assert len(CPULoadStoreSpec([])) == 0


def test_spec_copies_its_input() -> None:
    ids = np.array([1, 2], dtype=np.int64)
    spec = CPULoadStoreSpec(ids)
    ids[0] = 9
    assert spec.block_ids.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("ids", "err"),
    [
        ([True], InvalidTypeError),
        ([1.5], InvalidTypeError),
        (np.array([1.0]), InvalidTypeError),
        (np.zeros((2, 2), dtype=np.int64), InvalidArgumentError),
    ],
)
def test_spec_rejects_bad_ids(ids: object, err: type[Exception]) -> None:
    with pytest.raises(err, match="block_ids"):
        CPULoadStoreSpec(ids)  # type: ignore[arg-type]


def test_spec_keeps_negative_ids_for_the_worker_to_refuse() -> None:
    assert CPULoadStoreSpec([-1]).block_ids.tolist() == [-1]  # range checks: the worker's (map_job)


def test_gpu_spec() -> None:
    spec = GPULoadStoreSpec([10, 11, 12, 20], group_sizes=[3, 1], block_indices=[4, 2])
    assert spec.medium() == "GPU"
    assert spec.group_sizes.tolist() == [3, 1] and spec.block_indices.tolist() == [4, 2]
    assert spec.group_block_ids(0).tolist() == [10, 11, 12]
    assert spec.group_block_ids(1).tolist() == [20]
    single = GPULoadStoreSpec([1, 2])
    assert single.group_sizes.tolist() == [2] and single.block_indices.tolist() == [0]
    empty_group = GPULoadStoreSpec([7], group_sizes=[0, 1, 0], block_indices=[0, 0, 0])
    assert empty_group.group_block_ids(1).tolist() == [7] and empty_group.group_block_ids(2).size == 0


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"block_ids": [1, 2], "group_sizes": [1]}, InvalidArgumentError, "group_sizes must sum"),
        ({"block_ids": [1, 2], "group_sizes": [1, 2]}, InvalidArgumentError, "group_sizes must sum"),
        ({"block_ids": [1, 2], "group_sizes": [1, 1], "block_indices": [0]}, InvalidArgumentError, "block_indices"),
        ({"block_ids": [1], "group_sizes": [True]}, InvalidTypeError, "group_sizes"),
    ],
)
def test_gpu_spec_validation(kwargs: dict, err: type[Exception], match: str) -> None:
    with pytest.raises(err, match=match):
        GPULoadStoreSpec(**kwargs)


def test_errors_are_builtin_subclasses() -> None:
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidTypeError, TypeError)


def test_import_does_not_initialise_cuda() -> None:
    code = (
        "import kvoffload, kvoffload.core, kvoffload.cache, kvoffload.transfer, kvoffload.kernels\n"
        "import kvoffload.engine.scheduler, kvoffload.app.cli, torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_package_logger_has_only_null_handler() -> None:
    import logging

    handlers = logging.getLogger("kvoffload").handlers
    assert handlers and all(isinstance(h, logging.NullHandler) for h in handlers)
