"""Capacities as the simulate command takes them (``--capacities``, ``--tier-capacity``): offloaded
blocks, a size (``2GiB``, ``512MiB``, ``1.5GB``) or tokens (``3Mtok``), and the blocks each holds."""

from __future__ import annotations

import argparse

from kvoffload.errors import InvalidArgumentError

__all__ = ["parse_capacity", "parse_tier_capacity", "to_blocks"]


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
            if value > 0:
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
    ``block_bytes`` bytes and ``block_tokens`` tokens; a size holding no block is an error naming ``flag``."""
    if unit == "blocks":
        return int(value)
    if unit in dict(_TOKEN_UNITS):
        tokens = value * dict(_TOKEN_UNITS)[unit]
        if tokens < block_tokens:
            raise InvalidArgumentError(f"{flag} {value:g}{unit} holds no offloaded block of {block_tokens} tokens")
        return int(tokens // block_tokens)
    nbytes = value * dict(_UNITS)[unit]
    blocks = int(nbytes // block_bytes)
    if blocks < 1:
        raise InvalidArgumentError(
            f"{flag} {value:g}{unit} holds no offloaded block of {block_bytes:,} bytes for this model shape"
        )
    return blocks
