"""Capacities as the simulate command takes them (``--capacities``, ``--tier-capacity``): offloaded
blocks, a size (``2GiB``, ``512MiB``, ``1.5GB``) or tokens (``3Mtok``), and the blocks each holds.

A capacity converts to at most :data:`MAX_CAPACITY_BLOCKS` offloaded blocks (the host pool numbers its
slots in ``int32``); a larger one, and one given twice, is an error naming the flag.
"""

from __future__ import annotations

import argparse
import math

from kvoffload.errors import InvalidArgumentError

__all__ = ["MAX_CAPACITY_BLOCKS", "capacity_blocks", "parse_capacity", "parse_tier_capacity", "to_blocks"]

#: the largest capacity in offloaded blocks: the host pool's slots are ``int32``
MAX_CAPACITY_BLOCKS = 2**31 - 1


def parse_capacity(text: str) -> tuple[float, str]:
    """One ``--capacities`` item: a positive int (offloaded blocks), a size such as ``2GiB``,
    ``512MiB``, ``1.5GB``, or tokens such as ``3Mtok``, ``500Ktok``. Returns ``(value, unit)``
    with unit ``"blocks"``, a byte unit or a token unit."""
    s = text.strip()
    for unit, _ in (*_TOKEN_UNITS, *_UNITS):
        if s.lower().endswith(unit.lower()):
            try:
                value = float(s[: -len(unit)])
            except ValueError:
                break
            if value > 0 and math.isfinite(value):
                return value, unit
            break
    else:
        if s.isdigit() and int(s) > 0:
            return float(int(s)), "blocks"
    raise argparse.ArgumentTypeError(
        f"expected a positive integer (offloaded blocks), a size such as 2GiB or 512MiB, or tokens such as "
        f"3Mtok, got {text!r}"
    )


def parse_tier_capacity(text: str) -> tuple[float, str]:
    """One ``--tier-capacity`` item: ``0`` (no tier) or anything :func:`parse_capacity` takes."""
    if text.strip() == "0":
        return 0.0, "blocks"
    try:
        return parse_capacity(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected 0, a positive integer (offloaded blocks), a size such as 64GiB, or tokens such as 20Mtok, "
            f"got {text!r}"
        ) from None


_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("GB", 10**9), ("MB", 10**6))
_TOKEN_UNITS = (("Mtok", 10**6), ("Ktok", 10**3), ("tok", 1))


def to_blocks(value: float, unit: str, block_bytes: int, block_tokens: int = 1, flag: str = "--capacities") -> int:
    """Offloaded blocks that ``value`` ``unit`` (as :func:`parse_capacity` gives) holds, for blocks of
    ``block_bytes`` bytes and ``block_tokens`` tokens; a size holding no block, or more than
    :data:`MAX_CAPACITY_BLOCKS`, is an error naming ``flag``."""
    blocks = _blocks(value, unit, block_bytes, block_tokens, flag)
    if blocks > MAX_CAPACITY_BLOCKS:
        raise InvalidArgumentError(
            f"{flag} {_text(value, unit)} is more than {MAX_CAPACITY_BLOCKS:,} offloaded blocks of {block_tokens} "
            "tokens, the most a host pool holds (its slots are numbered in int32)"
        )
    return blocks


def capacity_blocks(
    items: list[tuple[float, str]], block_bytes: int, block_tokens: int, flag: str = "--capacities"
) -> list[int]:
    """The offloaded blocks of each of ``items`` (:func:`to_blocks`), ascending; no item, or two
    holding the same number of blocks, is an error naming ``flag`` (0 blocks: ``--tier-capacity 0``,
    no tier, may repeat)."""
    if not items:
        raise InvalidArgumentError(f"{flag} names no capacity: give at least one")
    seen: dict[int, str] = {}
    for value, unit in items:
        blocks = to_blocks(value, unit, block_bytes, block_tokens, flag)
        if blocks and blocks in seen:
            same = "given twice" if seen[blocks] == _text(value, unit) else f"and {seen[blocks]} are the same"
            raise InvalidArgumentError(
                f"{flag} {_text(value, unit)} {same}: {blocks:,} offloaded blocks of {block_tokens} tokens; "
                "give each capacity once"
            )
        seen[blocks] = _text(value, unit)
    return sorted(seen)


def _text(value: float, unit: str) -> str:
    """A capacity as it was given (about): ``256``, ``2GiB``, ``3Mtok``."""
    return f"{value:.15g}" if unit == "blocks" else f"{value:.15g}{unit}"


def _blocks(value: float, unit: str, block_bytes: int, block_tokens: int, flag: str) -> int:
    if unit == "blocks":
        return int(value)
    if unit in dict(_TOKEN_UNITS):
        tokens = value * dict(_TOKEN_UNITS)[unit]
        if not math.isfinite(tokens):
            return MAX_CAPACITY_BLOCKS + 1
        if tokens < block_tokens:
            raise InvalidArgumentError(f"{flag} {_text(value, unit)} holds no offloaded block of {block_tokens} tokens")
        return int(tokens // block_tokens)
    nbytes = value * dict(_UNITS)[unit]
    if not math.isfinite(nbytes):
        return MAX_CAPACITY_BLOCKS + 1
    blocks = int(nbytes // block_bytes)
    if blocks < 1:
        raise InvalidArgumentError(
            f"{flag} {_text(value, unit)} holds no offloaded block of {block_bytes:,} bytes for this model shape"
        )
    return blocks
