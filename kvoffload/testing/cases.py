"""KV-cache cases for the conformance suite: tensors in every layout, with known expected bytes.

A :class:`Case` holds per-group per-layer tensors laid over random bytes (so every dtype,
fp8 included, is just bytes), their layouts, and the full byte buffers behind them (padding
included) so checks can prove that nothing outside the touched pages changed.

The expected pages of a block are computed here by plain tensor indexing of the registered
tensors (``t[0, b]``/``t[1, b]`` for flash-attn, ``t[b]`` for flashinfer/MLA, ``t[i, ..., b]`` for a
generic layout), independently of :mod:`kvoffload.kernels.layout`'s pointer arithmetic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kvoffload.kernels.layout import GenericLayout, KVCacheTable, LayoutSpec

__all__ = [
    "Case",
    "CASE_BUILDERS",
    "DTYPES",
    "PAGE_LAYOUTS",
    "build_case",
    "build_page_case",
    "expected_pages",
    "case_names",
]

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
    "fp32": torch.float32,
}


@dataclass
class Case:
    """Per-group per-layer tensors (a group may be empty; a tensor may be repeated = aliased)."""

    name: str
    groups: list[list[torch.Tensor]]
    layouts: list[LayoutSpec]
    buffers: list[torch.Tensor] = field(default_factory=list)  # flat uint8 buffers behind the tensors

    def table(self) -> KVCacheTable:
        return KVCacheTable.from_tensors(self.groups, self.layouts)

    def num_blocks(self, g: int) -> int:
        if not self.groups[g]:
            return 0
        lay = self.layouts[g]
        t = self.groups[g][0]
        return t.shape[_block_dim(lay)]


def _block_dim(layout: LayoutSpec) -> int:
    if isinstance(layout, GenericLayout):
        return layout.block_dim
    return {"flash_attn": 1, "flashinfer": 0, "mla": 0}[layout]


def expected_pages(t: torch.Tensor, layout: LayoutSpec, block: int) -> list[torch.Tensor]:
    """The canonical pages of ``block`` in ``t``, by indexing (K before V, leading dims in order)."""
    if layout == "flash_attn":
        return [t[0, block], t[1, block]]
    if layout in ("flashinfer", "mla"):
        return [t[block]]
    assert isinstance(layout, GenericLayout)
    bd = layout.block_dim
    return [t[idx + (block,)] for idx in itertools.product(*(range(t.shape[d]) for d in range(bd)))]


def _alias_key(t: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    return t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.element_size()


def unique_layers(case: Case, g: int) -> list[torch.Tensor]:
    """Layers of group ``g`` with aliased repeats (same memory, shape, strides) dropped."""
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...], int]] = set()
    out = []
    for t in case.groups[g]:
        k = _alias_key(t)
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def page_bytes(page: torch.Tensor) -> torch.Tensor:
    """A page's bytes as a flat CPU uint8 tensor."""
    return page.contiguous().view(torch.uint8).reshape(-1).cpu()


def expected_record(case: Case, g: int, block: int) -> torch.Tensor:
    """Bytes of the packed record of ``block`` of group ``g`` (empty for an empty group)."""
    parts = [page_bytes(p) for t in unique_layers(case, g) for p in expected_pages(t, case.layouts[g], block)]
    if not parts:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.cat(parts)


def page_locations(case: Case, g: int, block: int) -> list[tuple[int, int, int]]:
    """``(buffer index, byte offset in buffer, nbytes)`` of every page of ``block`` of group ``g``."""
    out = []
    for t in unique_layers(case, g):
        for p in expected_pages(t, case.layouts[g], block):
            for bi, buf in enumerate(case.buffers):
                start = buf.data_ptr()
                if start <= p.data_ptr() < start + buf.numel():
                    out.append((bi, p.data_ptr() - start, p.numel() * p.element_size()))
                    break
            else:  # pragma: no cover - cases always register their buffers
                raise AssertionError("page outside every registered buffer")
    return out


# --------------------------------------------------------------------------- builders


class _Alloc:
    """Allocates random-filled byte buffers on a device and views them as typed tensors."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.buffers: list[torch.Tensor] = []

    def raw(self, nbytes: int) -> torch.Tensor:
        buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=self.gen).to(self.device)
        self.buffers.append(buf)
        return buf

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        esize = torch.empty(0, dtype=dtype).element_size()
        n = int(np.prod(shape))
        return self.raw(n * esize).view(dtype).view(shape)


def _flash_attn_groups(a: _Alloc, dt: torch.dtype, nb: int) -> tuple[list[list[torch.Tensor]], list[LayoutSpec]]:
    # group 0: two layers, [2, nb, block_size=2, heads=2, head_dim=4]
    g0 = [a.tensor((2, nb, 2, 2, 4), dt) for _ in range(2)]
    # group 1: one layer used by two layers (alias) + a block-major physical layout (K/V interleaved)
    shared = a.tensor((2, nb + 2, 2, 1, 4), dt)
    block_major = a.tensor((nb + 2, 2, 2, 1, 4), dt).transpose(0, 1)
    g1 = [shared, shared.view(shared.shape), block_major]
    return [g0, g1, []], ["flash_attn", "flash_attn", "flash_attn"]


def _flashinfer_groups(a: _Alloc, dt: torch.dtype, nb: int) -> tuple[list[list[torch.Tensor]], list[LayoutSpec]]:
    g0 = [a.tensor((nb, 2, 2, 2, 4), dt) for _ in range(2)]
    g2 = [a.tensor((nb + 3, 2, 1, 1, 8), dt)]
    return [g0, [], g2], ["flashinfer", "flashinfer", "flashinfer"]


def _mla_groups(a: _Alloc, dt: torch.dtype, nb: int) -> tuple[list[list[torch.Tensor]], list[LayoutSpec]]:
    g0 = [a.tensor((nb, 4, 12), dt) for _ in range(3)]
    # odd page size (3 x 5 elements): forces narrow words for fp8
    g1 = [a.tensor((nb + 1, 3, 5), dt)]
    return [[], g0, g1], ["mla", "mla", "mla"]


def _generic_groups(a: _Alloc, dt: torch.dtype, nb: int) -> tuple[list[list[torch.Tensor]], list[LayoutSpec]]:
    # block_dim 1 with 3 leading tensors and a padded block stride (page 5x2 elems, stride 7x2 elems)
    padded = a.tensor((3, nb, 7, 2), dt)[:, :, :5, :]
    # block_dim 0, page [2, 3], blocks padded to 8 elements
    padded0 = a.tensor((nb, 8), dt)[:, :6].unflatten(1, (2, 3))
    # block_dim 2: leading [2, 2] -> 4 canonical tensors of [nb, 4]
    lead = a.tensor((2, 2, nb + 1, 4), dt)
    return ([[padded], [padded0], [], [lead]], [GenericLayout(1), GenericLayout(0), GenericLayout(1), GenericLayout(2)])


def _mixed_groups(a: _Alloc, dt: torch.dtype, nb: int) -> tuple[list[list[torch.Tensor]], list[LayoutSpec]]:
    g0 = [a.tensor((2, nb, 2, 1, 8), dt), a.tensor((2, nb, 2, 1, 8), dt)]
    g1 = [a.tensor((nb, 2, 8), dt)]
    g2 = [a.tensor((nb + 2, 2, 2, 1, 4), dt)]
    return [g0, g1, g2], ["flash_attn", "mla", "flashinfer"]


CASE_BUILDERS: dict[str, Callable[[_Alloc, torch.dtype, int], tuple[list[list[torch.Tensor]], list[LayoutSpec]]]] = {
    "flash_attn": _flash_attn_groups,
    "flashinfer": _flashinfer_groups,
    "mla": _mla_groups,
    "generic": _generic_groups,
    "mixed": _mixed_groups,
}


def case_names() -> list[str]:
    return list(CASE_BUILDERS)


def build_case(
    kind: str, dtype: str | torch.dtype, device: torch.device | str = "cpu", seed: int = 0, num_blocks: int = 6
) -> Case:
    """A fresh :class:`Case` of ``kind`` (see :data:`CASE_BUILDERS`) filled with random bytes."""
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    a = _Alloc(torch.device(device), seed)
    groups, layouts = CASE_BUILDERS[kind](a, dt, num_blocks)
    dname = dtype if isinstance(dtype, str) else str(dtype).split(".")[-1]
    return Case(f"{kind}-{dname}", groups, layouts, a.buffers)


PAGE_LAYOUTS = ("flash_attn", "flashinfer", "mla", "generic")


def build_page_case(
    layout: str,
    dtype: str,
    page_bytes: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    num_blocks: int = 6,
) -> Case:
    """Two groups with pages of about ``page_bytes`` bytes (rounded up to whole elements).

    Group 0: two layers of ``layout`` (``"generic"``: block_dim 1 over ``[2, blocks, page]`` with a
    padded block stride); group 1: one MLA layer with pages of half the size plus one element, so
    that records of different sizes share a job.
    """
    dt = DTYPES[dtype]
    esize = torch.empty(0, dtype=dt).element_size()
    n = max(1, -(-page_bytes // esize))
    a = _Alloc(torch.device(device), seed)
    nb = num_blocks
    g0: list[torch.Tensor]
    if layout == "flash_attn":
        g0 = [a.tensor((2, nb, 1, 1, n), dt) for _ in range(2)]
        lay: LayoutSpec = "flash_attn"
    elif layout == "flashinfer":
        g0 = [a.tensor((nb, 2, 1, 1, max(1, n // 2)), dt) for _ in range(2)]
        lay = "flashinfer"
    elif layout == "mla":
        g0 = [a.tensor((nb, 1, n), dt) for _ in range(2)]
        lay = "mla"
    elif layout == "generic":
        g0 = [a.tensor((2, nb, n + 3), dt)[:, :, :n] for _ in range(2)]
        lay = GenericLayout(1)
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {PAGE_LAYOUTS}")
    g1 = [a.tensor((nb + 1, 1, n // 2 + 1), dt)]
    return Case(f"{layout}-{dtype}-{page_bytes}B", [g0, g1], [lay, "mla"], a.buffers)
