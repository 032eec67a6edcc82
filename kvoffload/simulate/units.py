"""Byte sizes and token counts as the command line prints them."""

from __future__ import annotations

__all__ = ["gib", "size_label", "tokens_label"]


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


def tokens_label(n: int) -> str:
    """``n`` tokens in three significant digits at most, never in exponent notation: ``999,936``
    is ``1M`` (not ``1e+03K``), ``1,500,000`` is ``1.5M``, ``2.5e12`` is ``2500G``."""
    units = (("", 1), ("K", 10**3), ("M", 10**6), ("G", 10**9))
    for i, (unit, div) in enumerate(units):
        value = n / div
        decimals = 2 if value < 10 else 1 if value < 100 else 0
        text = f"{value:.{decimals}f}"
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        if float(text) < 1000 or i == len(units) - 1:
            return f"{text}{unit}"
    raise AssertionError("unreachable")
