"""Conformance tests any kvoffload kernel backend must pass (see :mod:`kvoffload.testing`).

Parametrized by ``backend_name`` and ``device``: from ``--kvoffload-backend``/``--kvoffload-device``
when :mod:`kvoffload.testing.plugin` is loaded, else from ``KVOFFLOAD_BACKEND`` /
``KVOFFLOAD_TEST_DEVICE`` (comma-separated), else every built-in backend on ``cpu`` and ``cuda``.
A backend that cannot run on a device is skipped there; ``cuda`` is skipped without a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kvoffload.errors import BackendUnavailableError
from kvoffload.kernels.registry import KernelBackend, get_backend
from kvoffload.testing.bad_inputs import bad_input_cases, check_bad_input
from kvoffload.testing.cases import DTYPES, build_case, case_names
from kvoffload.testing.checks import check_pack, check_roundtrip, check_unpack, make_host, make_job
from kvoffload.testing.plugin import check_backend_names

BAD = bad_input_cases()
BUILTIN_BACKENDS = ("torch", "triton", "page_loop")


def _choice(config: pytest.Config, option: str, env: str, default: tuple[str, ...]) -> list[str]:
    try:
        values = config.getoption(option)
    except ValueError:  # plugin not loaded
        values = None
    if values:
        return [v for v in values if v]
    raw = os.environ.get(env, "").strip()
    if raw:
        return [v.strip() for v in raw.split(",") if v.strip()]
    return list(default)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" in metafunc.fixturenames:
        names = _choice(metafunc.config, "--kvoffload-backend", "KVOFFLOAD_BACKEND", BUILTIN_BACKENDS)
        check_backend_names(names, "--kvoffload-backend / KVOFFLOAD_BACKEND")  # one error, not one per test
        metafunc.parametrize("backend_name", names, scope="module")
    if "device" in metafunc.fixturenames:
        no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
        devices = _choice(metafunc.config, "--kvoffload-device", "KVOFFLOAD_TEST_DEVICE", ("cpu", "cuda"))
        params = [pytest.param(d, marks=no_cuda) if d.startswith("cuda") else d for d in devices]
        metafunc.parametrize("device", params, scope="module")


@pytest.fixture(scope="module")
def backend(backend_name: str, device: str) -> KernelBackend:
    try:
        return get_backend(backend_name, device)
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend_name} unavailable on {device}: {exc}")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", case_names())
def test_pack_byte_exact(backend: KernelBackend, device: str, kind: str, dtype: str) -> None:
    case = build_case(kind, dtype, device, seed=21)
    check_pack(backend, case, make_job(case, case.table(), seed=1))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kind", case_names())
def test_unpack_byte_exact(backend: KernelBackend, device: str, kind: str, dtype: str) -> None:
    case = build_case(kind, dtype, device, seed=22)
    check_unpack(backend, case, make_job(case, case.table(), seed=2))


@pytest.mark.parametrize(("base", "slot_pad"), [(16, 16), (2, 6)])
@pytest.mark.parametrize("kind", case_names())
def test_bound_kernel_byte_exact(backend: KernelBackend, device: str, kind: str, base: int, slot_pad: int) -> None:
    """The backend's bound kernel (if it binds one) on job tables as the transfer worker writes
    them, at 16- and 2-byte aligned records: the same bytes as pack/unpack."""
    case = build_case(kind, "bf16", device, seed=29)
    job = make_job(case, case.table(), seed=7, base=base, slot_pad=slot_pad)
    check_pack(backend, case, job, bound=True)
    check_unpack(backend, case, job, bound=True)


@pytest.mark.parametrize("kind", case_names())
def test_roundtrip(backend: KernelBackend, device: str, kind: str) -> None:
    src = build_case(kind, "bf16", device, seed=23)
    dst = build_case(kind, "bf16", device, seed=24)
    check_roundtrip(backend, src, dst, make_job(src, src.table(), seed=3))


@pytest.mark.parametrize(("base", "slot_pad"), [(0, 0), (1, 0), (2, 6), (4, 4), (8, 8), (3, 5)])
def test_unaligned_host_offsets(backend: KernelBackend, device: str, base: int, slot_pad: int) -> None:
    """Records at offsets aligned to 1..16 bytes (exercises every word width)."""
    case = build_case("flash_attn", "fp16", device, seed=25)
    job = make_job(case, case.table(), seed=4, base=base, slot_pad=slot_pad)
    check_pack(backend, case, job)
    check_unpack(backend, case, job)


def test_many_blocks_more_than_programs(backend: KernelBackend, device: str) -> None:
    """Every block of every group in one job (more pages than any program cap)."""
    case = build_case("mixed", "fp32", device, seed=26, num_blocks=12)
    job = make_job(case, case.table(), seed=5, per_group=12)
    check_pack(backend, case, job)
    check_unpack(backend, case, job)


def test_empty_job(backend: KernelBackend, device: str) -> None:
    case = build_case("mla", "fp16", device, seed=27)
    table = case.table()
    host = make_host(256, table.device)
    before = host.clone()
    empty = np.zeros(0, dtype=np.int64)
    backend.pack(table, host, empty, empty.astype(np.int32), empty)
    backend.unpack(table, host, empty, empty.astype(np.int32), empty)
    if table.device.type == "cuda":
        torch.cuda.synchronize(table.device)
    assert torch.equal(host, before)


@pytest.mark.parametrize("direction", ["pack", "unpack"])
@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
def test_bad_input_rejected_before_writing(backend: KernelBackend, device: str, bad, direction: str) -> None:  # type: ignore[no-untyped-def]
    if direction not in bad.directions:
        pytest.skip(f"{bad.name} applies to {bad.directions} only")
    if bad.cuda_only and not device.startswith("cuda"):
        pytest.skip(f"{bad.name} needs the cache on CUDA")
    case = build_case("flash_attn", "fp16", device, seed=28)
    check_bad_input(backend, case, make_job(case, case.table(), seed=6), bad, direction)
