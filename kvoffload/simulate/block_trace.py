"""A trace as offloaded-block keys: what the cache-level replay and the reference lines read.

:class:`BlockTrace` holds, for every request in arrival order, the keys of its prompt's full
offloaded blocks (head first) as dense integer ids, and the manager key (``OffloadKey`` bytes) of
every id. The keys are exactly those the kvoffload engine computes for the same request: the
chained hash of the offloaded block's last 16-token block followed by KV-cache group 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain

import numpy as np

from kvoffload.core.base import OffloadKey, make_offload_key
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.bailian import BailianRequest
from kvoffload.simulate.mooncake import PIECE_TOKENS, MooncakeRequest, piece_hash

__all__ = ["BlockTrace"]


@dataclass(frozen=True)
class BlockTrace:
    """Offloaded-block keys of every request of a trace.

    Attributes:
        block_tokens: tokens per offloaded block.
        ids: dense key ids of all requests' full prompt blocks, concatenated (``int64``).
        starts: request ``r``'s ids are ``ids[starts[r]:starts[r + 1]]`` (``int64[R + 1]``).
        prompt_tokens: prompt length of every request (``int64[R]``).
        keys: the manager key of every dense id.
        tags: every request's workload tag (``ReqContext.workload``), or None: no tags.
    """

    block_tokens: int
    ids: np.ndarray
    starts: np.ndarray
    prompt_tokens: np.ndarray
    keys: list[OffloadKey]
    tags: tuple[str | None, ...] | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    @property
    def num_blocks(self) -> int:
        """Distinct offloaded blocks in the prompts (the working set)."""
        return len(self.keys)

    @property
    def total_prompt_tokens(self) -> int:
        return int(self.prompt_tokens.sum())

    @cached_property
    def has_repeats(self) -> bool:
        """Whether a request names one block twice (computed once)."""
        if not len(self.ids):
            return False
        req = np.repeat(np.arange(self.num_requests, dtype=np.int64), np.diff(self.starts))
        pairs = req * max(self.num_blocks, 1) + self.ids
        return len(np.unique(pairs)) != len(pairs)

    def key_lists(self) -> list[list[OffloadKey]]:
        """Per request, its prompt blocks' manager keys, head first."""
        keys, ids, st = self.keys, self.ids.tolist(), self.starts.tolist()
        return [[keys[i] for i in ids[st[r] : st[r + 1]]] for r in range(self.num_requests)]

    @classmethod
    def _from_flat(
        cls, block_tokens: int, flat: np.ndarray, lens: np.ndarray, prompt_tokens: list[int], keys_of: object
    ) -> BlockTrace:
        """From every request's raw block ids concatenated (``flat``) and their counts (``lens``)."""
        starts = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        uniq, inverse = np.unique(flat, return_inverse=True)
        keys = keys_of(uniq)  # type: ignore[operator]
        return cls(block_tokens, inverse.astype(np.int64).ravel(), starts, np.asarray(prompt_tokens, np.int64), keys)

    @classmethod
    def from_mooncake(
        cls, requests: Sequence[MooncakeRequest], trace_block_tokens: int, block_tokens: int
    ) -> BlockTrace:
        """Keys of Mooncake (or Bailian) requests (see :mod:`kvoffload.simulate.mooncake` for the piece
        ids): offloaded block ``j`` is keyed by its last 16-token piece ``(j + 1) * B / 16 - 1``.
        Bailian requests carry their workload tags (:attr:`~kvoffload.simulate.bailian.BailianRequest.tag`)."""
        _check_sizes(trace_block_tokens, block_tokens)
        per = trace_block_tokens // PIECE_TOKENS
        step = block_tokens // PIECE_TOKENS
        prompt = [r.input_length for r in requests]
        n_ids = np.fromiter((len(r.hash_ids) for r in requests), dtype=np.int64, count=len(requests))
        every_id = chain.from_iterable(r.hash_ids for r in requests)
        hash_ids = np.fromiter(every_id, dtype=np.int64, count=int(n_ids.sum()))
        first_id = np.cumsum(n_ids) - n_ids  # where each request's hash ids start in hash_ids
        lens = np.asarray(prompt, dtype=np.int64) // block_tokens  # full offloaded blocks per request
        first_block = np.cumsum(lens) - lens
        req = np.repeat(np.arange(len(requests), dtype=np.int64), lens)
        t = (np.arange(int(lens.sum()), dtype=np.int64) - first_block[req] + 1) * step - 1  # last piece per block
        flat = hash_ids[first_id[req] + t // per] * per + t % per

        def keys_of(uniq: np.ndarray) -> list[OffloadKey]:
            return [make_offload_key(piece_hash(p), 0) for p in uniq.tolist()]

        bt = cls._from_flat(block_tokens, flat, lens, prompt, keys_of)
        tagged = [r for r in requests if isinstance(r, BailianRequest)]
        if requests and len(tagged) == len(requests):
            bt = replace(bt, tags=tuple(r.tag for r in tagged))
        return bt

    @classmethod
    def from_block_hashes(
        cls, hashes: Sequence[Sequence[bytes]], prompt_tokens: Sequence[int], block_tokens: int
    ) -> BlockTrace:
        """Keys from per-request chained 16-token block hashes (the engine's own traces and the
        chat workload): offloaded block ``j`` is keyed by hash ``(j + 1) * B / 16 - 1``."""
        _check_sizes(PIECE_TOKENS, block_tokens)
        step = block_tokens // PIECE_TOKENS
        index: dict[bytes, int] = {}
        raw = [
            np.fromiter((index.setdefault(h, len(index)) for h in hs[step - 1 :: step]), dtype=np.int64)
            for hs in hashes
        ]
        by_id = list(index)

        def keys_of(uniq: np.ndarray) -> list[OffloadKey]:
            return [make_offload_key(by_id[i], 0) for i in uniq.tolist()]

        lens = np.fromiter((len(a) for a in raw), dtype=np.int64, count=len(raw))
        flat = np.concatenate(raw) if raw else np.zeros(0, dtype=np.int64)
        return cls._from_flat(block_tokens, flat, lens, list(prompt_tokens), keys_of)


def _check_sizes(trace_block_tokens: int, block_tokens: int) -> None:
    if block_tokens < PIECE_TOKENS or block_tokens % PIECE_TOKENS:
        raise InvalidArgumentError(f"--block-size must be a multiple of {PIECE_TOKENS} tokens, got {block_tokens}")
    if trace_block_tokens < PIECE_TOKENS or trace_block_tokens % PIECE_TOKENS:
        raise InvalidArgumentError(
            f"--trace-block-size must be a multiple of {PIECE_TOKENS} tokens, got {trace_block_tokens}"
        )
