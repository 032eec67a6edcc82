"""One tensor backing layers of several KV-cache groups: refused unless declared, then reported."""

from __future__ import annotations

import pytest
import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.kernels.layout import KVCacheTable


def test_tensor_shared_by_two_groups_needs_to_be_declared() -> None:
    shared = torch.zeros(2, 4, 2, 1, 4)
    with pytest.raises(InvalidArgumentError, match=r"groups\[1\]\[0\].*group 0.*shared_tensors=True"):
        KVCacheTable.from_tensors([[shared], [shared]])
    # a view into the middle of another group's tensor overlaps it too
    with pytest.raises(InvalidArgumentError, match=r"groups\[2\]\[0\]"):
        KVCacheTable.from_tensors([[shared], [torch.zeros(2, 4, 2, 1, 4)], [shared[:, 1:3]]])


def test_declared_sharing_reports_the_pools() -> None:
    shared = torch.zeros(2, 4, 2, 1, 4)
    other = torch.zeros(4, 3, 2)
    table = KVCacheTable.from_tensors(
        [[shared], [other], [shared[:, 1:3]], []], ["flash_attn", "mla"] * 2, shared_tensors=True
    )
    assert table.block_pools == (0, 1, 0, 3)
    # without sharing every group is its own pool
    assert KVCacheTable.from_tensors([[shared], [other]], ["flash_attn", "mla"]).block_pools == (0, 1)
