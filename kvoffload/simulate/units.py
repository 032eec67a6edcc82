"""Byte sizes as the command line prints them."""

from __future__ import annotations

__all__ = ["gib", "size_label"]


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB, two decimals."""
    return f"{nbytes / 2**30:.2f} GiB"


def size_label(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit it reaches (``1.50 GiB``, ``4 KiB``)."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= div:
            value = nbytes / div
            return f"{value:g} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{nbytes} B"
