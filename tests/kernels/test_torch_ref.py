"""Byte-exact pack/unpack of the pure-torch reference backend, every layout and dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.testing.cases import DTYPES, build_case, case_names
from kvoffload.testing.checks import check_pack, check_roundtrip, check_unpack, make_host, make_job

KINDS = case_names()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_pack_unpack_byte_exact(kind: str, dtype: str) -> None:
    be = TorchBackend()
    case = build_case(kind, dtype, seed=11)
    job = make_job(case, case.table(), seed=5)
    check_pack(be, case, job)
    check_unpack(be, case, job)
    check_roundtrip(be, case, build_case(kind, dtype, seed=12), job)


@pytest.mark.parametrize("base", [0, 1, 3, 8])
@pytest.mark.parametrize("slot_pad", [0, 5])
def test_irregular_host_offsets(base: int, slot_pad: int) -> None:
    """Offsets that are not multiples of the record size take the per-record path; still exact."""
    be = TorchBackend()
    case = build_case("flash_attn", "fp8", seed=3)
    job = make_job(case, case.table(), seed=9, base=base, slot_pad=slot_pad)
    check_pack(be, case, job)
    check_unpack(be, case, job)


def test_dense_records_at_slot_boundaries() -> None:
    """Records back to back (gcd of offsets == record size): the single index_copy_ path."""
    be = TorchBackend()
    case = build_case("mla", "fp16", seed=4)
    table = case.table()
    rb = table.groups[1].record_bytes
    ids = np.array([5, 0, 3, 1], dtype=np.int64)
    job_g = np.full(4, 1, dtype=np.int32)
    offs = np.array([0, 3, 1, 2], dtype=np.int64) * rb
    host = make_host(4 * rb, table.device)
    be.pack(table, host, ids, job_g, offs)
    for b, o in zip(ids.tolist(), offs.tolist(), strict=True):
        exp = torch.cat([t[b].contiguous().view(torch.uint8).reshape(-1) for t in case.groups[1]])
        assert torch.equal(host[o : o + rb], exp)


def test_empty_job_is_a_no_op() -> None:
    be = TorchBackend()
    case = build_case("mla", "fp32")
    host = make_host(64, torch.device("cpu"))
    before = host.clone()
    e = np.zeros(0, dtype=np.int64)
    be.pack(case.table(), host, e, e.astype(np.int32), e)
    be.unpack(case.table(), host, e, e.astype(np.int32), e)
    assert torch.equal(host, before)
