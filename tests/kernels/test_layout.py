"""KVCacheTable canonicalisation: byte views, dedup of aliases, typed errors."""

from __future__ import annotations

import pytest
import torch

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.layout import GenericLayout, KVCacheTable


def test_flash_attn_splits_k_and_v() -> None:
    t = torch.zeros(2, 5, 4, 2, 8, dtype=torch.float16)
    table = KVCacheTable.from_tensors([[t]])
    (g,) = table.groups
    assert len(g.views) == 2 and g.num_blocks == 5
    k, v = g.views
    page = 4 * 2 * 8 * 2
    assert (k.ptr, k.block_stride, k.page_bytes, k.record_offset) == (t.data_ptr(), page, page, 0)
    assert (v.ptr, v.record_offset) == (t[1].data_ptr(), page)
    assert g.record_bytes == 2 * page
    assert table.device == torch.device("cpu")
    assert table.alignment == 16


def test_flashinfer_and_mla_one_page_per_block() -> None:
    fi = torch.zeros(3, 2, 4, 1, 8, dtype=torch.bfloat16)
    mla = torch.zeros(7, 4, 10, dtype=torch.float8_e4m3fn)
    table = KVCacheTable.from_tensors([[fi], [mla]], ["flashinfer", "mla"])
    assert [len(g.views) for g in table.groups] == [1, 1]
    assert table.groups[0].record_bytes == 2 * 4 * 8 * 2
    assert table.groups[1].record_bytes == 40 and table.groups[1].num_blocks == 7
    assert table.record_bytes == (128, 40)


def test_generic_padded_stride_and_leading_dims() -> None:
    base = torch.zeros(3, 4, 7, 2, dtype=torch.float32)
    t = base[:, :, :5, :]
    table = KVCacheTable.from_tensors([[t]], GenericLayout(1))
    views = table.groups[0].views
    assert len(views) == 3
    assert all(v.page_bytes == 40 and v.block_stride == 56 for v in views)
    assert [v.record_offset for v in views] == [0, 40, 80]
    assert views[0].pages.shape == (4, 40) and views[0].pages.stride() == (56, 1)
    assert table.alignment == 8


def test_aliases_moved_once_and_block_major_kv_interleaving_accepted() -> None:
    a = torch.zeros(2, 4, 2, 1, 4, dtype=torch.float16)
    bm = torch.zeros(4, 2, 2, 1, 4, dtype=torch.float16).transpose(0, 1)
    table = KVCacheTable.from_tensors([[a, a, a.view(a.shape), bm]])
    g = table.groups[0]
    assert len(g.views) == 4
    assert g.views[2].block_stride == 2 * g.views[2].page_bytes
    assert g.views[3].ptr - g.views[2].ptr == g.views[2].page_bytes


def test_empty_group_and_cross_group_sharing() -> None:
    t = torch.zeros(2, 4, 2, 1, 4)
    table = KVCacheTable.from_tensors([[t], [], [t]], shared_tensors=True)
    assert table.groups[1].views == () and table.groups[1].record_bytes == 0
    assert table.groups[1].num_blocks == 0
    assert table.groups[2].views[0].ptr == table.groups[0].views[0].ptr
    assert table.max_views == 2


@pytest.mark.parametrize(
    ("groups", "layouts", "err", "match"),
    [
        ([[torch.zeros(2, 4, 2, 8)]], "flash_attn", InvalidArgumentError, "5-d"),
        ([[torch.zeros(3, 4, 2, 1, 8)]], "flash_attn", InvalidArgumentError, "size 2 at dim 0"),
        ([[torch.zeros(4, 2, 8)]], "paged", InvalidArgumentError, "unknown layout"),
        ([[torch.zeros(4, 2, 8)]], 3, InvalidTypeError, "layout"),
        ([[torch.zeros(4, 2, 8), torch.zeros(5, 2, 8)]], "mla", InvalidArgumentError, "5 blocks"),
        ([[torch.zeros(4, 8, 2).transpose(1, 2)]], "mla", InvalidArgumentError, "contiguous"),
        ([[torch.zeros(4, 2, 8)]], ["mla", "mla"], InvalidArgumentError, "layouts has 2"),
        ([[], []], "mla", InvalidArgumentError, "no tensor"),
        ([["x"]], "mla", InvalidTypeError, "torch.Tensor"),
        (torch.zeros(3), "mla", InvalidTypeError, "groups"),
        ([torch.zeros(4, 2, 8)], "mla", InvalidTypeError, r"groups\[0\]"),
        ([[torch.zeros(0, 2, 8)]], "mla", InvalidArgumentError, "no blocks"),
        ([[torch.zeros(1, 2, 8).expand(4, 2, 8)]], "mla", InvalidArgumentError, "pages overlap"),
        ([[torch.zeros(4, 2, 8)]], GenericLayout(3), InvalidArgumentError, "block_dim 3"),
    ],
)
def test_bad_registration(groups, layouts, err, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(err, match=match):
        KVCacheTable.from_tensors(groups, layouts)


def test_partial_overlap_inside_group_rejected() -> None:
    buf = torch.zeros(10, 8)
    with pytest.raises(InvalidArgumentError, match="overlaps"):
        KVCacheTable.from_tensors([[buf[:6].view(6, 2, 4), buf[2:8].view(6, 2, 4)]], "mla")


def test_generic_layout_rejects_bad_block_dim() -> None:
    with pytest.raises(InvalidArgumentError):
        GenericLayout(-1)
    with pytest.raises(InvalidTypeError):
        GenericLayout(True)  # type: ignore[arg-type]


def test_mismatched_devices_rejected() -> None:
    meta = torch.zeros(4, 2, 8, device="meta")
    with pytest.raises(InvalidArgumentError, match="meta"):
        KVCacheTable.from_tensors([[torch.zeros(4, 2, 8)], [meta]], "mla")
