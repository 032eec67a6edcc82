"""KV-cache registration: per-layer tensors canonicalised into byte views.

An engine registers its paged KV cache as, per KV-cache group, a list of per-layer tensors plus
a layout saying which dimension indexes blocks:

* ``"flash_attn"``  ``[2, num_blocks, block_size, heads, head_dim]`` -- K and V are two canonical
  tensors (``t[0]`` and ``t[1]``), each one page per block.
* ``"flashinfer"``  ``[num_blocks, 2, block_size, heads, head_dim]`` -- one page per block holding
  K and V together.
* ``"mla"``         ``[num_blocks, block_size, dim]``.
* :class:`GenericLayout` ``(block_dim)`` -- any tensor: the dimensions *before* ``block_dim`` split
  it into several canonical tensors (one per index combination), the dimensions *after* it must be
  one dense page per block. The block stride may be padded (``block_stride >= page_bytes``).

Each canonical tensor becomes a :class:`PageView` (base address, block stride, page bytes, all in
bytes, dtype-agnostic: fp8/bf16/fp16/fp32 are all just bytes). Views aliased by several layers
of a group (same address, stride and page size) are kept once, so they are moved once. Inside a
group the views are laid out back to back in the group's *record* (the packed bytes of one GPU
block): ``record_offset`` of view ``k`` is the sum of the page sizes of views ``0..k-1``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "GenericLayout",
    "LayoutSpec",
    "LAYOUT_NAMES",
    "PageView",
    "GroupTable",
    "KVCacheTable",
    "canonical_views",
]

LAYOUT_NAMES: tuple[str, ...] = ("flash_attn", "flashinfer", "mla")


@dataclass(frozen=True)
class GenericLayout:
    """A tensor whose dimension ``block_dim`` indexes blocks.

    Dimensions before ``block_dim`` enumerate separate canonical tensors (like the K/V ``2`` of
    flash-attn); dimensions after it form one dense page per block.
    """

    block_dim: int

    def __post_init__(self) -> None:
        if type(self.block_dim) is not int:
            raise InvalidTypeError(f"GenericLayout.block_dim must be an int, got {type(self.block_dim).__name__}")
        if self.block_dim < 0:
            raise InvalidArgumentError(f"GenericLayout.block_dim must be >= 0, got {self.block_dim}")


LayoutSpec = Literal["flash_attn", "flashinfer", "mla"] | GenericLayout

# name -> (block_dim, required ndim, {dim: required size})
_NAMED: dict[str, tuple[int, int, dict[int, int]]] = {
    "flash_attn": (1, 5, {0: 2}),
    "flashinfer": (0, 5, {1: 2}),
    "mla": (0, 3, {}),
}


@dataclass(frozen=True)
class PageView:
    """One canonical tensor seen as bytes.

    Block ``b``'s page is the ``page_bytes`` contiguous bytes at ``ptr + b * block_stride``.
    ``pages`` is a ``[num_blocks, page_bytes]`` ``torch.uint8`` view of the same memory (strides
    ``(block_stride, 1)``), used by the torch/DMA backends and as the kernel's anchor tensor.
    """

    ptr: int
    block_stride: int
    page_bytes: int
    num_blocks: int
    record_offset: int
    pages: torch.Tensor = field(repr=False, compare=False, hash=False)

    @property
    def span(self) -> tuple[int, int]:
        """Byte interval ``[start, end)`` covered by all pages of this view."""
        return self.ptr, self.ptr + (self.num_blocks - 1) * self.block_stride + self.page_bytes


@dataclass(frozen=True)
class GroupTable:
    """All canonical tensors of one KV-cache group.

    ``record_bytes`` = sum of the views' ``page_bytes`` = bytes of one GPU block's packed record.
    An empty group (no tensors, e.g. none of its layers live on this rank) has no views,
    ``record_bytes == 0`` and ``num_blocks == 0``; its blocks move no bytes.
    ``tokens_per_block``: the GPU block size in tokens where the layout says it (the dimension
    after the block dimension of flash-attn, flashinfer and MLA tensors), else None.
    """

    views: tuple[PageView, ...]
    record_bytes: int
    num_blocks: int
    tokens_per_block: int | None = None


def _resolve_layout(layout: Any, where: str) -> tuple[int, int | None, dict[int, int], str]:
    if isinstance(layout, GenericLayout):
        return layout.block_dim, None, {}, f"GenericLayout(block_dim={layout.block_dim})"
    if isinstance(layout, str):
        if layout not in _NAMED:
            raise InvalidArgumentError(
                f"{where}: unknown layout {layout!r}; expected one of {list(LAYOUT_NAMES)} or a GenericLayout"
            )
        block_dim, ndim, fixed = _NAMED[layout]
        return block_dim, ndim, fixed, repr(layout)
    raise InvalidTypeError(f"{where}: layout must be a str or GenericLayout, got {type(layout).__name__}")


def canonical_views(tensor: torch.Tensor, layout: LayoutSpec, where: str = "tensor") -> list[PageView]:
    """Split one registered tensor into canonical page views (``record_offset`` left at 0)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidTypeError(f"{where} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{where} must be a strided (dense) tensor, got layout {tensor.layout}")
    if tensor.device.type == "meta":
        raise InvalidArgumentError(f"{where} is on the meta device and has no memory")
    block_dim, ndim, fixed, lname = _resolve_layout(layout, where)
    shape = tuple(tensor.shape)
    if ndim is not None and tensor.dim() != ndim:
        raise InvalidArgumentError(f"{where}: layout {lname} needs a {ndim}-d tensor, got shape {list(shape)}")
    if block_dim >= tensor.dim():
        raise InvalidArgumentError(
            f"{where}: layout {lname} has block_dim {block_dim} but the tensor is "
            f"{tensor.dim()}-d (shape {list(shape)})"
        )
    for d, size in fixed.items():
        if shape[d] != size:
            raise InvalidArgumentError(f"{where}: layout {lname} needs size {size} at dim {d}, got shape {list(shape)}")
    num_blocks = shape[block_dim]
    if num_blocks < 1:
        raise InvalidArgumentError(f"{where}: has no blocks (shape {list(shape)}, block_dim {block_dim})")
    esize = tensor.element_size()
    page_dims = range(block_dim + 1, tensor.dim())
    page_elems = math.prod(shape[d] for d in page_dims)
    if page_elems == 0:
        raise InvalidArgumentError(f"{where}: pages are empty (shape {list(shape)})")
    # dense page: every dim after block_dim of size > 1 has the stride of a contiguous layout
    expected = 1
    for d in reversed(page_dims):
        if shape[d] != 1 and tensor.stride(d) != expected:
            raise InvalidArgumentError(
                f"{where}: the page (dims after block_dim {block_dim}) must be contiguous; "
                f"shape {list(shape)} has strides {list(tensor.stride())}"
            )
        expected *= shape[d]
    page_bytes = page_elems * esize
    block_stride = tensor.stride(block_dim) * esize
    if num_blocks > 1 and block_stride < page_bytes:
        raise InvalidArgumentError(
            f"{where}: block stride {block_stride} bytes is smaller than the page ({page_bytes} bytes): pages overlap"
        )
    if num_blocks == 1:
        block_stride = max(block_stride, page_bytes)
    storage = tensor.untyped_storage()
    base = storage.data_ptr()
    views: list[PageView] = []
    for idx in itertools.product(*(range(shape[d]) for d in range(block_dim))):
        ptr = tensor.data_ptr() + sum(i * tensor.stride(d) * esize for d, i in enumerate(idx))
        pages = torch.empty(0, dtype=torch.uint8, device=tensor.device)
        pages.set_(storage, ptr - base, (num_blocks, page_bytes), (block_stride, 1))
        views.append(PageView(ptr, block_stride, page_bytes, num_blocks, 0, pages))
    return views


def _pages_may_overlap(a: PageView, b: PageView) -> bool:
    """Whether some page of ``a`` may share a byte with some page of ``b`` (conservative)."""
    (a0, a1), (b0, b1) = a.span, b.span
    if a1 <= b0 or b1 <= a0:
        return False
    if a.block_stride == b.block_stride and a.num_blocks > 1 and b.num_blocks > 1:
        # interleaved pages (e.g. K/V halves of a block-major flash-attn cache): compare phases
        s = a.block_stride
        r = (b.ptr - a.ptr) % s
        return r < a.page_bytes or r + b.page_bytes > s
    return True


def _alignment(values: Sequence[int]) -> int:
    """Largest power of two <= 16 dividing every value."""
    acc = 16
    for v in values:
        while v % acc:
            acc //= 2
    return acc


class KVCacheTable:
    """All KV-cache groups of an engine, canonicalised into byte views. Keeps the tensors alive.

    Attributes:
        groups: one :class:`GroupTable` per KV-cache group, in group-index order.
        device: the device of every registered tensor.
        tensors: the registered tensors (kept alive as long as the table).
        alignment: largest power of two <= 16 dividing every view's address, block stride and
            page size (the widest word a kernel may copy on the cache side).
        cache: scratch dict where backends keep per-table derived state (e.g. device tables).
        block_pools: per group, the index of the first group whose memory it shares (its own
            index when it shares none): groups with the same value name blocks of the same
            tensors, so block id ``b`` is the same memory in each of them. Give the scheduler the
            same pools (``GroupOffloadConfig.block_pool``).
    """

    def __init__(
        self,
        groups: Sequence[GroupTable],
        device: torch.device,
        tensors: Sequence[torch.Tensor],
        block_pools: Sequence[int] | None = None,
    ) -> None:
        self.groups: tuple[GroupTable, ...] = tuple(groups)
        self.block_pools: tuple[int, ...] = tuple(range(len(self.groups)) if block_pools is None else block_pools)
        self.device: torch.device = device
        self.tensors: tuple[torch.Tensor, ...] = tuple(tensors)
        vals: list[int] = []
        for g in self.groups:
            for v in g.views:
                vals += [v.ptr, v.block_stride, v.page_bytes]
        self.alignment: int = _alignment(vals)
        self.cache: dict[Any, Any] = {}

    @classmethod
    def from_tensors(
        cls,
        groups: Sequence[Sequence[torch.Tensor]],
        layouts: LayoutSpec | Sequence[LayoutSpec] = "flash_attn",
        *,
        shared_tensors: bool = False,
    ) -> KVCacheTable:
        """Canonicalise ``groups[g]`` (per-layer tensors of group ``g``; may be empty).

        ``layouts`` is one layout for every group or one per group.

        ``shared_tensors``: whether a tensor (any memory) may back layers of several groups, as
        in an engine whose groups allocate from one block pool (vLLM's hybrid allocator: each
        tensor is shared by one layer of every group). Then block id ``b`` of those groups is
        one physical block, and the scheduler must know it: every group left at the default
        ``GroupOffloadConfig.block_pool`` (0) shares one pool; :attr:`block_pools` says which
        groups share memory. False (the default): memory shared across groups is an error.

        Raises
        :class:`InvalidArgumentError`/:class:`InvalidTypeError` for tensors on different devices,
        mismatched ``num_blocks`` inside a group, a non-contiguous page, an unknown layout, a wrong
        ndim, pages of different tensors of one group that partially overlap, or (without
        ``shared_tensors``) memory shared by two groups.
        """
        if isinstance(groups, (torch.Tensor, str, bytes)) or not isinstance(groups, Sequence):
            raise InvalidTypeError(f"groups must be a sequence of sequences of tensors, got {type(groups).__name__}")
        if isinstance(layouts, (str, GenericLayout)):
            per_group: list[Any] = [layouts] * len(groups)
        elif isinstance(layouts, Sequence):
            per_group = list(layouts)
            if len(per_group) != len(groups):
                raise InvalidArgumentError(f"layouts has {len(per_group)} entries but there are {len(groups)} groups")
        else:
            raise InvalidTypeError(f"layouts must be a layout or a sequence of layouts, got {type(layouts).__name__}")
        device: torch.device | None = None
        tables: list[GroupTable] = []
        kept: list[torch.Tensor] = []
        pools = list(range(len(groups)))
        for g, tensors in enumerate(groups):
            if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
                raise InvalidTypeError(f"groups[{g}] must be a sequence of tensors, got {type(tensors).__name__}")
            views: list[PageView] = []
            seen: set[tuple[int, int, int, int]] = set()
            num_blocks: int | None = None
            tokens: set[int | None] = set()
            for layer, t in enumerate(tensors):
                where = f"groups[{g}][{layer}]"
                for v in canonical_views(t, per_group[g], where):
                    if device is None:
                        device = t.device
                    elif t.device != device:
                        raise InvalidArgumentError(f"{where} is on {t.device} but earlier tensors are on {device}")
                    if num_blocks is None:
                        num_blocks = v.num_blocks
                    elif v.num_blocks != num_blocks:
                        raise InvalidArgumentError(f"{where} has {v.num_blocks} blocks but group {g} has {num_blocks}")
                    key = (v.ptr, v.block_stride, v.page_bytes, v.num_blocks)
                    if key in seen:
                        continue  # aliased by another layer: moved once
                    for other in views:
                        if _pages_may_overlap(v, other):
                            raise InvalidArgumentError(
                                f"{where} partially overlaps the memory of another tensor of group {g}"
                            )
                    for h in range(g):
                        if pools[g] != pools[h] and any(_pages_may_overlap(v, w) for w in tables[h].views):
                            if not shared_tensors:
                                raise InvalidArgumentError(
                                    f"{where} shares memory with group {h}: memory backing layers of two groups is "
                                    "only accepted with shared_tensors=True (their block ids then name one pool)"
                                )
                            lo, hi = sorted((pools[g], pools[h]))
                            pools = [lo if p == hi else p for p in pools]
                    seen.add(key)
                    views.append(v)
                kept.append(t)
                lay = per_group[g]  # validated by canonical_views above
                named = isinstance(lay, str) and lay in _NAMED
                tokens.add(int(t.shape[_NAMED[lay][0] + 1 + (lay == "flashinfer")]) if named else None)
            offset = 0
            placed: list[PageView] = []
            for v in views:
                placed.append(PageView(v.ptr, v.block_stride, v.page_bytes, v.num_blocks, offset, v.pages))
                offset += v.page_bytes
            block_tokens = tokens.pop() if len(tokens) == 1 else None
            tables.append(GroupTable(tuple(placed), offset, num_blocks or 0, block_tokens))
        if device is None:
            raise InvalidArgumentError("groups holds no tensor: at least one group needs a KV-cache tensor")
        return cls(tables, device, kept, pools)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def max_views(self) -> int:
        """Largest number of views in one group."""
        return max((len(g.views) for g in self.groups), default=0)

    @property
    def record_bytes(self) -> tuple[int, ...]:
        """Per group: bytes of one GPU block's packed record."""
        return tuple(g.record_bytes for g in self.groups)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"g{i}: {len(g.views)} views x {g.num_blocks} blocks, record {g.record_bytes} B"
            for i, g in enumerate(self.groups)
        )
        return f"KVCacheTable(device={self.device}, {parts})"
