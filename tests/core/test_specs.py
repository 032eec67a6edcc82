"""Load/store specs: ids beyond int64 and non-sequences are typed errors naming the argument;
specs are immutable and never alias the caller's arrays."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.core.base import (
    CPULoadStoreSpec,
    GPULoadStoreSpec,
)
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, KVOffloadError
from tests.keys import CTX, K0


# ------------------------------------------------------------------ load/store specs
@pytest.mark.parametrize(
    "build,name",
    [
        (lambda: CPULoadStoreSpec([2**70]), r"block_ids\[0\]"),
        (lambda: CPULoadStoreSpec([1, 2**63]), r"block_ids\[1\]"),
        (lambda: GPULoadStoreSpec([0, 2**70], [2]), r"block_ids\[1\]"),
        (lambda: GPULoadStoreSpec([1], [2**70]), r"group_sizes\[0\]"),
        (lambda: GPULoadStoreSpec([1], [1], [2**70]), r"block_indices\[0\]"),
        (lambda: CPULoadStoreSpec(np.array([2**63], dtype=np.uint64)), "block_ids"),
        (lambda: CPULoadStoreSpec([np.uint64(2**63)]), r"block_ids\[0\]"),
        (lambda: GPULoadStoreSpec([1], np.array([2**64 - 1], dtype=np.uint64)), "group_sizes"),
    ],
)
def test_spec_ids_beyond_int64_are_a_typed_error(build, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name) as info:
        build()
    assert "-92233720" not in str(info.value)  # no wrapped-around value
    assert "2**63 - 1" in str(info.value) or "9223372036854775807" in str(info.value)


def test_uint64_id_is_reported_with_its_value() -> None:
    with pytest.raises(InvalidArgumentError, match=r"(?<!-)9223372036854775808"):
        CPULoadStoreSpec(np.array([5, 2**63], dtype=np.uint64))
    assert CPULoadStoreSpec(np.array([5, 2**63 - 1], dtype=np.uint64)).block_ids.tolist() == [5, 2**63 - 1]


@pytest.mark.parametrize(
    "build,name",
    [
        (lambda: CPULoadStoreSpec(None), "block_ids"),
        (lambda: CPULoadStoreSpec(5), "block_ids"),
        (lambda: CPULoadStoreSpec("12"), "block_ids"),
        (lambda: CPULoadStoreSpec(b"\x01"), "block_ids"),
        (lambda: GPULoadStoreSpec([1], 5), "group_sizes"),
        (lambda: GPULoadStoreSpec([1], [1], 0), "block_indices"),
        (lambda: GPULoadStoreSpec(None), "block_ids"),
    ],
)
def test_spec_non_sequences_are_a_typed_error(build, name: str) -> None:
    with pytest.raises(InvalidTypeError, match=name):
        build()


SPECS = [
    lambda: CPULoadStoreSpec([1, 2]),
    lambda: GPULoadStoreSpec([3, 4, 5], [1, 2], [0, 7]),
    lambda: CPUOffloadingManager(4).prepare_store(K0[:2], CTX).store_spec,  # type: ignore[union-attr]
]


@pytest.mark.parametrize("build", SPECS)
def test_specs_cannot_be_changed_after_construction(build) -> None:
    spec = build()
    names = ["block_ids"] + (["group_sizes", "block_indices"] if isinstance(spec, GPULoadStoreSpec) else [])
    before = {n: getattr(spec, n).tolist() for n in names}
    for n in names:
        for value in ([1.5, 2.7], [-1, 0], np.array([0, 1]), None):
            with pytest.raises(KVOffloadError, match=n) as info:
                setattr(spec, n, value)
            assert isinstance(info.value, TypeError) and isinstance(info.value, AttributeError)
        with pytest.raises(KVOffloadError, match=n):
            delattr(spec, n)
        arr = getattr(spec, n)
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = -1
    assert {n: getattr(spec, n).tolist() for n in names} == before


def test_spec_from_a_caller_array_does_not_alias_it() -> None:
    ids = np.array([1, 2, 3])
    spec = CPULoadStoreSpec(ids)
    ids[0] = 99  # the caller's array stays writable, the spec keeps its own copy
    assert spec.block_ids.tolist() == [1, 2, 3]
