"""Ahead-of-time compile of every kernel variant for sm_90 and sm_80, no GPU needed.

``triton.compile`` with a ``GPUTarget`` runs the whole pipeline down to a cubin, with the ptxas
shipped in the Triton wheel: a kernel variant that Triton or ptxas rejects (e.g. an illegal
cache-hint combination) fails CI here, not on the first GPU run. Also checks that 16-byte aligned
jobs get 128-bit loads and stores and that the cache hints reach the PTX.
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Any

import pytest

triton = pytest.importorskip("triton")

from kvoffload.kernels.triton_backend import word_type  # noqa: E402

TARGETS = [90, 80]
DIRECTIONS = [True, False]  # TO_BUF: pack (cache -> buffer), unpack
BUFFERS = [True, False]  # BUF_ON_HOST: host pool (direct path), GPU staging (copy-engine paths)
ALIGNMENTS = [16, 8, 4, 2, 1]


@functools.cache
def _compile(arch: int, to_buf: bool, on_host: bool, alignment: int, pages: int, chunk: int, warps: int) -> Any:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvoffload.kernels.triton_kernels import copy_pages_kernel

    wtype, vec = word_type(alignment)
    ptr = "*i" + {"int64": "64", "int32": "32", "int16": "16", "int8": "8"}[wtype]
    sig = {
        "cache_ptr": ptr,
        "buf_ptr": ptr,
        "views_ptr": "*i64",
        "groups_ptr": "*i64",
        "job_ptr": "*i64",
        "n_job": "i32",
        "max_views": "i32",
        "max_page": "i64",
        "TO_BUF": "constexpr",
        "BUF_ON_HOST": "constexpr",
        "VEC": "constexpr",
        "PAGES": "constexpr",
        "CHUNK": "constexpr",
    }
    consts = {"TO_BUF": to_buf, "BUF_ON_HOST": on_host, "VEC": vec, "PAGES": pages, "CHUNK": chunk}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    src = ASTSource(fn=copy_pages_kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


# every variant for sm_90; sm_80 at the widest and narrowest word (a compile costs ~2 s on CI)
VARIANTS = [
    (arch, to_buf, on_host, a)
    for arch in TARGETS
    for to_buf, on_host in itertools.product(DIRECTIONS, BUFFERS)
    for a in (ALIGNMENTS if arch == 90 else [16, 1])
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("arch", "to_buf", "on_host", "alignment"), VARIANTS)
def test_every_variant_compiles_to_cubin(arch: int, to_buf: bool, on_host: bool, alignment: int) -> None:
    vec = word_type(alignment)[1]
    # small pages: 8 pages x 256 words per step; warps as the backend sizes them
    k = _compile(arch, to_buf, on_host, alignment, 8, 256 * vec, 4)
    assert k.asm["cubin"], "no cubin produced"


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("arch", TARGETS)
def test_wide_accesses_and_cache_hints_reach_the_ptx(arch: int) -> None:
    pack_host = _compile(arch, True, True, 16, 8, 256, 4).asm["ptx"]
    unpack_host = _compile(arch, False, True, 16, 8, 256, 4).asm["ptx"]
    for ptx in (pack_host, unpack_host):
        ops = set(re.findall(r"(?:ld|st)\.global[.\w:]*\.v2\.b64", ptx))
        assert any(o.startswith("ld.") for o in ops) and any(o.startswith("st.") for o in ops), sorted(
            set(re.findall(r"(?:ld|st)\.global\S*", ptx))
        )
    assert "evict_first" in pack_host  # GPU side of a pack is read once
    assert re.search(r"st\.global\.cs", pack_host)  # streaming stores to the host
    assert re.search(r"ld\.global\.cg", unpack_host)  # host loads bypass L1
