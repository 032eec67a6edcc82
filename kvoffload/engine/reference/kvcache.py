"""The reference engine's paged KV cache: real tensors holding a checkable function of the prefix.

For group ``g``, each layer has one tensor in the group's layout (``flash_attn``
``[2, num_blocks, block_size, heads, head_dim]``, ``flashinfer``
``[num_blocks, 2, block_size, heads, head_dim]`` or ``mla`` ``[num_blocks, block_size,
heads * head_dim]``), in a 16-bit dtype. The "compute" of token ``p`` writes, in every layer ``l``
and element ``e`` of its page rows, the 16-bit word ``(key_p * A[l, e] + B[l, e]) >> 48`` with
``key_p`` the token's prefix key (:class:`~kvoffload.engine.reference.request.SimRequest`) and ``A``/``B``
fixed random 64-bit constants per (group, layer, element). A block that holds another prefix,
another position, another layer or stale bytes therefore differs from what
:meth:`SimKVCache.expected` recomputes, which is how every load is verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from kvoffload.errors import InvalidArgumentError
from kvoffload.kernels.layout import LayoutSpec

__all__ = ["GroupKVSpec", "SimKVCache"]

_LAYOUTS = ("flash_attn", "flashinfer", "mla")


@dataclass(frozen=True)
class GroupKVSpec:
    """Shape of one group's KV tensors."""

    num_blocks: int
    block_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    layout: str = "flash_attn"

    def __post_init__(self) -> None:
        if self.layout not in _LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {_LAYOUTS}, got {self.layout!r}")

    @property
    def elems_per_token(self) -> int:
        """16-bit words one token occupies in one layer (K and V together)."""
        e = self.num_heads * self.head_dim
        return e if self.layout == "mla" else 2 * e


class SimKVCache:
    """Per-group, per-layer KV tensors plus the deterministic writer/checker.

    Args:
        groups: one :class:`GroupKVSpec` per group.
        dtype: a 16-bit dtype (``torch.float16`` or ``torch.bfloat16``).
        device: where the tensors live.
        seed: seeds the per-(group, layer, element) constants.
        cpu_numpy: on CPU, write and check through numpy views of the tensors (False: torch ops,
            the path a CUDA device takes).
    """

    def __init__(
        self,
        groups: Sequence[GroupKVSpec],
        dtype: torch.dtype,
        device: torch.device,
        seed: int = 0,
        cpu_numpy: bool = True,
    ) -> None:
        if torch.empty(0, dtype=dtype).element_size() != 2:
            raise InvalidArgumentError(f"dtype must be a 16-bit dtype, got {dtype}")
        self.specs = tuple(groups)
        self.device = device
        self.tensors: list[list[torch.Tensor]] = []
        self._flat: list[list[torch.Tensor]] = []  # per layer: int16 [rows, width] views of the tensors
        self._consts: list[tuple[np.ndarray, np.ndarray]] = []
        rng = np.random.default_rng(seed)
        for spec in self.specs:
            layers, flats = [], []
            hd = spec.num_heads * spec.head_dim
            for _ in range(spec.num_layers):
                if spec.layout == "flash_attn":
                    shape: tuple[int, ...] = (2, spec.num_blocks, spec.block_size, spec.num_heads, spec.head_dim)
                elif spec.layout == "flashinfer":
                    shape = (spec.num_blocks, 2, spec.block_size, spec.num_heads, spec.head_dim)
                else:
                    shape = (spec.num_blocks, spec.block_size, hd)
                t = torch.zeros(shape, dtype=dtype, device=device)
                layers.append(t)
                flats.append(t.view(torch.int16).view(-1, hd))
            self.tensors.append(layers)
            self._flat.append(flats)
            shape2 = (spec.num_layers, spec.elems_per_token)
            a = rng.integers(0, 2**63, size=shape2, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
            b = rng.integers(0, 2**63, size=shape2, dtype=np.uint64)
            self._consts.append((a, b))
        # on CPU, numpy views of the same memory: single-threaded gathers/scatters, which are much
        # faster than torch's intra-op threads for these small batches on a busy few-core host
        self._np_flat: list[list[np.ndarray]] | None = (
            [[f.numpy() for f in flats] for flats in self._flat] if self.device.type == "cpu" and cpu_numpy else None
        )

    def _rows(self, group: int, block_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Row indices ``[T * nkv]`` (token-major, K before V) of tokens in the flat views."""
        s = self.specs[group]
        b = block_ids.astype(np.int64)
        o = offsets.astype(np.int64)
        if s.layout == "flash_attn":
            base = b * s.block_size + o
            rows = np.stack([base, base + s.num_blocks * s.block_size], axis=1)
        elif s.layout == "flashinfer":
            rows = np.stack([(b * 2) * s.block_size + o, (b * 2 + 1) * s.block_size + o], axis=1)
        else:
            rows = b * s.block_size + o
        return np.ascontiguousarray(rows).reshape(-1)

    @property
    def layouts(self) -> list[LayoutSpec]:
        """Per group, its layout name (checked against the known layouts at construction)."""
        return [cast(LayoutSpec, s.layout) for s in self.specs]

    def _values_np(self, group: int, token_keys: np.ndarray) -> np.ndarray:
        a, b = self._consts[group]
        with np.errstate(over="ignore"):
            w = np.multiply(token_keys[None, :, None], a[:, None, :])
            np.add(w, b[:, None, :], out=w)
            np.right_shift(w, np.uint64(48), out=w)
        return w.astype(np.uint16).view(np.int16)

    def values(self, group: int, token_keys: np.ndarray) -> torch.Tensor:
        """``int16 [layers, T, elems]`` KV words of tokens with these prefix keys."""
        return torch.from_numpy(self._values_np(group, token_keys))

    def write(self, group: int, block_ids: np.ndarray, offsets: np.ndarray, token_keys: np.ndarray) -> None:
        """Write the KV of tokens (``token_keys[i]`` at block ``block_ids[i]``, row ``offsets[i]``)."""
        if token_keys.size == 0:
            return
        rows = self._rows(group, block_ids, offsets)
        vals = self._values_np(group, token_keys)
        if self._np_flat is not None:
            for layer, flat in enumerate(self._np_flat[group]):
                flat[rows] = vals[layer].reshape(rows.size, flat.shape[1])
            return
        vt = torch.from_numpy(vals).to(self.device, non_blocking=True)
        rt = torch.from_numpy(rows).to(self.device)
        for layer, tensor in enumerate(self._flat[group]):
            tensor.index_copy_(0, rt, vt[layer].view(rows.size, tensor.shape[1]))

    def write_tokens(self, items: Sequence[tuple[Sequence[Sequence[int]], np.ndarray, int, int]]) -> None:
        """Write the KV of tokens ``[start, start + n)`` of several requests, one batch per group.

        ``items``: ``(block tables per group, token keys, start, n)`` per request.
        """
        for g, spec in enumerate(self.specs):
            bs = spec.block_size
            blocks, offs, keys = [], [], []
            for tables, token_keys, c, n in items:
                pos = np.arange(c, c + n)
                lo = c // bs
                table = np.asarray(tables[g][lo : (c + n - 1) // bs + 1], dtype=np.int64)
                blocks.append(table[pos // bs - lo])
                offs.append(pos % bs)
                keys.append(token_keys[c : c + n])
            self.write(g, np.concatenate(blocks), np.concatenate(offs), np.concatenate(keys))

    def check_blocks(self, group: int, block_ids: Sequence[int] | np.ndarray, token_keys: np.ndarray) -> np.ndarray:
        """Per block, whether it holds exactly the KV of ``token_keys`` (``block_size`` keys per block,
        every layer). Returns ``bool [n_blocks]``."""
        s = self.specs[group]
        ids = np.asarray(block_ids, dtype=np.int64)
        n = ids.size
        if n == 0:
            return np.zeros(0, dtype=bool)
        b = np.repeat(ids, s.block_size)
        o = np.tile(np.arange(s.block_size, dtype=np.int64), n)
        rows = self._rows(group, b, o)
        want = self._values_np(group, token_keys)
        ok = np.ones(n, dtype=bool)
        for layer in range(s.num_layers):
            if self._np_flat is not None:
                got = self._np_flat[group][layer][rows]
            else:
                got = self._flat[group][layer].index_select(0, torch.from_numpy(rows).to(self.device)).cpu().numpy()
            ok &= (got.reshape(n, -1) == want[layer].reshape(n, -1)).all(axis=1)
        return ok

    def block_bytes(self, group: int) -> int:
        """Bytes of one GPU block of ``group`` over all its layers."""
        s = self.specs[group]
        return s.num_layers * s.block_size * s.elems_per_token * 2
