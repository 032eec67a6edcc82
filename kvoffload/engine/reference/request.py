"""Requests of the reference engine: token ids, chained block hashes, per-token content keys.

* ``block_hashes[i]`` = ``blake2b(block_hashes[i-1] + int64 token ids of block i, 16 bytes)``
  (``b""`` before block 0): chained, so a hash commits to the whole prefix.
* ``token_keys[p]`` is a 64-bit key of the token prefix ``[0, p]``: a mix of the hash of the
  previous full hash block, a running hash of the tokens of the current block up to ``p``, and
  ``p``. The KV the engine writes for token ``p`` is a function of ``token_keys[p]`` and the layer
  (:mod:`kvoffload.engine.reference.kvcache`), so two requests write the same KV for a position exactly when
  they share the prefix up to it.

A request may come as token ids or, from a trace, as precomputed prompt block hashes: then the
tokens of each full block are synthesised from its hash (so equal hashes give equal KV) and the
tail tokens from the request id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["hash_block", "hash_blocks", "mix64", "SimRequest"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROOT = 0x243F6A8885A308D3


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a ``np.uint64`` array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


_MASK = (1 << 64) - 1
_GOLDEN_INT = 0x9E3779B97F4A7C15


def _mix64_int(z: int) -> int:
    """:func:`mix64` on one Python int (same result as the numpy version)."""
    z = (z + _GOLDEN_INT) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_weights_cache: dict[int, list[int]] = {}


def _WEIGHTS_INT(hbs: int) -> list[int]:  # noqa: N802 - constant-like cache accessor
    w = _weights_cache.get(hbs)
    if w is None:
        w = _weights_cache[hbs] = [int(x) for x in mix64(np.arange(1, hbs + 1, dtype=np.uint64))]
    return w


def hash_block(parent: bytes, token_ids: Sequence[int] | np.ndarray) -> bytes:
    """The chained hash of one block: 16-byte blake2b of ``parent`` + the tokens as int64."""
    return hashlib.blake2b(parent + np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def hash_blocks(token_ids: Sequence[int] | np.ndarray, block_size: int, parent: bytes = b"") -> list[bytes]:
    """Chained hashes of every full block of ``block_size`` tokens."""
    toks = np.asarray(token_ids, dtype=np.int64)
    out: list[bytes] = []
    for i in range(len(toks) // block_size):
        parent = hash_block(parent, toks[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out


def _h64(h: bytes) -> int:
    return int.from_bytes(h[:8], "little")


class SimRequest:
    """A request of the reference engine (duck-types the request of docs/contract.md §6).

    Args:
        request_id: unique id.
        prompt_token_ids: the prompt; or None with ``prompt_block_hashes``.
        max_tokens: tokens to decode (0: prefill only).
        kv_transfer_params: passed to the offload manager (e.g. ``{"max_offload_tokens": 24}``).
        prompt_block_hashes / num_prompt_tokens: a hashed prompt from a trace (no token ids).
        vocab_size: range of synthesised and generated token ids.

    Attributes engines and tests read: ``request_id``, ``block_hashes``, ``num_tokens``,
    ``num_prompt_tokens``, ``kv_transfer_params``, ``all_token_ids``, ``output_token_ids``,
    ``token_keys`` (``np.uint64[num_tokens]``). ``hash_block_size`` is set by the engine on
    :meth:`bind` (hashes are computed then).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        max_tokens: int = 0,
        kv_transfer_params: dict[str, Any] | None = None,
        *,
        prompt_block_hashes: Sequence[bytes] | None = None,
        num_prompt_tokens: int | None = None,
        vocab_size: int = 32_000,
    ) -> None:
        if not isinstance(request_id, str):
            raise InvalidTypeError(f"request_id must be a str, got {type(request_id).__name__}")
        max_tokens = check_int(max_tokens, "max_tokens", 0)
        if (prompt_token_ids is None) == (prompt_block_hashes is None):
            raise InvalidArgumentError("give exactly one of prompt_token_ids and prompt_block_hashes")
        if prompt_token_ids is not None:
            toks = [int(t) for t in prompt_token_ids]
            if not toks:
                raise InvalidArgumentError("prompt_token_ids must not be empty")
        else:
            if num_prompt_tokens is None:
                raise InvalidArgumentError("num_prompt_tokens is required with prompt_block_hashes")
            num_prompt_tokens = check_int(num_prompt_tokens, "num_prompt_tokens", 1)
            if not all(isinstance(h, bytes) and h for h in prompt_block_hashes):  # type: ignore[union-attr]
                raise InvalidTypeError("prompt_block_hashes must be non-empty bytes")
            toks = []
        self.request_id = request_id
        self.max_tokens = max_tokens
        self.kv_transfer_params = kv_transfer_params
        self.vocab_size = vocab_size
        self._given_hashes = None if prompt_block_hashes is None else list(prompt_block_hashes)
        self.num_prompt_tokens = len(toks) if prompt_token_ids is not None else int(num_prompt_tokens)  # type: ignore[arg-type]
        self.all_token_ids: list[int] = toks
        self.output_token_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        self.hash_block_size = 0
        self.token_keys = np.zeros(0, dtype=np.uint64)
        self._num_keys = 0
        self._run = 0

    @classmethod
    def from_chat_turn(cls, turn: Any, kv_transfer_params: dict[str, Any] | None = None) -> SimRequest:
        """From anything with ``request_id``, ``prompt_token_ids`` and ``max_tokens`` (a ChatTurn)."""
        return cls(turn.request_id, turn.prompt_token_ids, turn.max_tokens, kv_transfer_params)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def bind(self, hash_block_size: int) -> None:
        """Fix the hash block size, synthesise missing prompt tokens, hash, compute token keys."""
        if self.hash_block_size:
            if self.hash_block_size != hash_block_size:
                raise InvalidArgumentError(
                    f"request {self.request_id} is bound to hash blocks of {self.hash_block_size}"
                )
            return
        self.hash_block_size = hash_block_size
        if self._given_hashes is not None:
            n_full = self.num_prompt_tokens // hash_block_size
            if len(self._given_hashes) != n_full:
                raise InvalidArgumentError(
                    f"request {self.request_id}: {len(self._given_hashes)} prompt block hashes for "
                    f"{self.num_prompt_tokens} tokens in blocks of {hash_block_size} (need {n_full})"
                )
            toks: list[int] = []
            for h in self._given_hashes:
                base = np.full(hash_block_size, _h64(h), dtype=np.uint64) + np.arange(hash_block_size, dtype=np.uint64)
                toks.extend((mix64(base) % np.uint64(self.vocab_size)).tolist())
            tail = self.num_prompt_tokens - len(toks)
            seed = _h64(hashlib.blake2b(self.request_id.encode(), digest_size=8).digest())
            base = np.full(tail, seed, dtype=np.uint64) + np.arange(tail, dtype=np.uint64)
            toks.extend((mix64(base) % np.uint64(self.vocab_size)).tolist())
            self.all_token_ids = toks
            self.block_hashes = list(self._given_hashes)
        self._extend(0)

    def append_output(self, token_id: int) -> None:
        """Append a generated token (hashes and keys follow; a scalar twin of :meth:`_extend`)."""
        t = int(token_id)
        self.all_token_ids.append(t)
        self.output_token_ids.append(t)
        hbs = self.hash_block_size
        pos = self._num_keys
        blk, r = divmod(pos, hbs)
        run = ((self._run if r else 0) + (t + 1) * _WEIGHTS_INT(hbs)[r]) & _MASK
        parent = _ROOT if blk == 0 else _h64(self.block_hashes[blk - 1])
        key = _mix64_int(parent ^ run ^ (((pos + 1) * _GOLDEN_INT) & _MASK))
        if self.token_keys.size <= pos:
            grown = np.zeros(max(pos + 1, 2 * self.token_keys.size), dtype=np.uint64)
            grown[:pos] = self.token_keys[:pos]
            self.token_keys = grown
        self.token_keys[pos] = key
        self._num_keys = pos + 1
        if r == hbs - 1:
            parent_hash = self.block_hashes[-1] if self.block_hashes else b""
            self.block_hashes.append(hash_block(parent_hash, self.all_token_ids[blk * hbs : (blk + 1) * hbs]))
            self._run = 0
        else:
            self._run = run

    def next_token(self) -> int:
        """The deterministic "sampled" token after the current tokens (a function of the prefix)."""
        return int(self.token_keys[self._num_keys - 1] % np.uint64(self.vocab_size))

    def _extend(self, n0: int) -> None:
        """Hash new full blocks and compute the keys of tokens ``[n0, num_tokens)``."""
        hbs = self.hash_block_size
        n1 = len(self.all_token_ids)
        toks = np.asarray(self.all_token_ids[n0:n1], dtype=np.uint64)
        parent = self.block_hashes[-1] if self.block_hashes else b""
        for b in range(len(self.block_hashes), n1 // hbs):
            parent = hash_block(parent, np.asarray(self.all_token_ids[b * hbs : (b + 1) * hbs], dtype=np.int64))
            self.block_hashes.append(parent)
        pos = np.arange(n0, n1, dtype=np.int64)
        blk = pos // hbs
        with np.errstate(over="ignore"):
            weights = mix64(np.arange(1, hbs + 1, dtype=np.uint64))
            contrib = (toks + np.uint64(1)) * weights[pos % hbs]
            cs = np.cumsum(contrib, dtype=np.uint64)
            first = np.maximum(blk * hbs - n0, 0)
            base = np.where(first > 0, cs[np.maximum(first - 1, 0)], np.uint64(0))
            run = cs - base
            carry = np.uint64(self._run if n0 % hbs else 0)
            run = run + np.where(blk == n0 // hbs, carry, np.uint64(0))
            if n1 > n0:
                lo, hi = n0 // hbs, int(blk[-1])
                par_of = np.array(
                    [_ROOT if b == 0 else _h64(self.block_hashes[b - 1]) for b in range(lo, hi + 1)], dtype=np.uint64
                )
                keys = mix64(par_of[blk - lo] ^ run ^ ((pos.astype(np.uint64) + np.uint64(1)) * _GOLDEN))
            else:
                keys = np.zeros(0, dtype=np.uint64)
        if self.token_keys.size < n1:
            grown = np.zeros(max(n1, 2 * self.token_keys.size), dtype=np.uint64)
            grown[:n0] = self.token_keys[:n0]
            self.token_keys = grown
        self.token_keys[n0:n1] = keys
        self._num_keys = n1
        if n1 > n0:
            self._run = int(run[-1]) if n1 % hbs else 0

    def keys_of(self, start: int, end: int) -> np.ndarray:
        """Token keys of positions ``[start, end)`` (a view)."""
        return self.token_keys[start:end]

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id!r}, num_tokens={self.num_tokens}, prompt={self.num_prompt_tokens}, "
            f"outputs={len(self.output_token_ids)}/{self.max_tokens})"
        )
