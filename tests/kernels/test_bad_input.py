"""Bad pack/unpack input: typed errors before any byte is written (torch and interpreted triton)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.job import as_index_array, validate_job
from kvoffload.kernels.registry import get_backend
from kvoffload.testing.bad_inputs import bad_input_cases, check_bad_input
from kvoffload.testing.cases import build_case
from kvoffload.testing.checks import make_host, make_job

BAD = [b for b in bad_input_cases() if not b.cuda_only]
CUDA_BAD = [b for b in bad_input_cases() if b.cuda_only]


def _runs(bads):  # type: ignore[no-untyped-def]
    return [pytest.param(b, d, id=f"{b.name}-{d}") for b in bads for d in b.directions]


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
@pytest.mark.parametrize(("bad", "direction"), _runs(BAD))
def test_bad_input_cpu(backend_name: str, bad, direction: str) -> None:  # type: ignore[no-untyped-def]
    case = build_case("generic", "fp16", seed=61)
    check_bad_input(get_backend(backend_name, "cpu"), case, make_job(case, case.table(), seed=13), bad, direction)


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["triton", "torch", "page_loop"])
@pytest.mark.parametrize(("bad", "direction"), _runs(BAD + CUDA_BAD))
def test_bad_input_cuda(backend_name: str, bad, direction: str) -> None:  # type: ignore[no-untyped-def]
    case = build_case("flash_attn", "bf16", "cuda", seed=62)
    check_bad_input(get_backend(backend_name, "cuda"), case, make_job(case, case.table(), seed=14), bad, direction)


@pytest.mark.interpreter
def test_empty_group_accepts_any_nonnegative_block_and_moves_nothing() -> None:
    case = build_case("flash_attn", "fp16", seed=63)  # group 2 is empty
    table = case.table()
    host = make_host(64, table.device)
    before = host.clone()
    ids = np.array([10**9, 0], dtype=np.int64)
    g = np.array([2, 2], dtype=np.int32)
    offs = np.array([64, 0], dtype=np.int64)  # zero-byte records: end of host is fine
    for name in ("torch", "triton"):
        get_backend(name).pack(table, host, ids, g, offs)
        get_backend(name).unpack(table, host, ids, g, offs)
    assert torch.equal(host, before)
    with pytest.raises(InvalidArgumentError):
        get_backend("torch").pack(table, host, np.array([-1]), np.array([2], dtype=np.int32), np.array([0]))


def test_index_array_conversion() -> None:
    assert as_index_array([1, 2], "x").dtype == np.int64
    assert as_index_array(np.array([1], dtype=np.uint32), "x").tolist() == [1]
    assert as_index_array(torch.tensor([3, 4]), "x").tolist() == [3, 4]
    assert as_index_array([], "x").shape == (0,)
    with pytest.raises(InvalidTypeError, match="x"):
        as_index_array([True, False], "x")
    with pytest.raises(InvalidTypeError):
        as_index_array(torch.tensor([1.0]), "x")
    with pytest.raises(InvalidTypeError):
        as_index_array(np.array([1.5]), "x")
    with pytest.raises(InvalidArgumentError):
        as_index_array(np.array([2**63], dtype=np.uint64), "x")
    with pytest.raises(InvalidTypeError):
        as_index_array(["a"], "x")


def test_validate_job_reports_totals() -> None:
    case = build_case("mla", "fp32", seed=64)
    table = case.table()
    job = make_job(case, table, seed=15)
    host = make_host(job.host_bytes, table.device)
    v = validate_job(table, host, job.block_ids, job.group_ids, job.host_offsets, to_host=True)
    rb = np.array(table.record_bytes)[job.group_ids]
    assert v.total_bytes == int(rb.sum()) and v.n == len(job.block_ids)
    assert v.group_ids.dtype == np.int64
