"""The x range of a sweep's plot: the swept values, not the references far beyond them.

A sweep of 1 and 2 GiB drawn out to a working set of 11,049 GiB puts both points on the left edge.
:class:`XSpan` spans the swept values (a little margin each side), logarithmic when they span a
decade or more; a reference value (a working set, all stored blocks) widens it only when it lies
near that range (:meth:`XSpan.near`): a farther one is named at the plot's edge instead of drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvoffload.errors import InvalidArgumentError

__all__ = ["LOG_RATIO", "NEAR_RATIO", "XSpan"]

#: the axis is logarithmic when the largest swept value is at least this many times the smallest
LOG_RATIO = 10.0
#: a reference is near the swept range (and drawn) within this factor of its ends (log), or within
#: this factor of the range's width beyond them (linear)
NEAR_RATIO = 1.5
_MARGIN = 0.06  # of the range's width (linear) or of its decades (log), each side


class XSpan:
    """The x range of positive swept ``values`` (any order, repeats allowed; at least one)."""

    def __init__(self, values: Sequence[float]) -> None:
        if not values or any(not (math.isfinite(v) and v > 0) for v in values):
            raise InvalidArgumentError(f"values must be positive finite numbers, at least one, got {list(values)!r}")
        self.lo, self.hi = min(values), max(values)
        self.log = self.hi >= LOG_RATIO * self.lo

    def near(self, x: float) -> bool:
        """Whether the reference ``x`` is near enough to the swept values to be drawn."""
        if not (math.isfinite(x) and x > 0):
            return False
        if self.log:
            return self.lo / NEAR_RATIO <= x <= self.hi * NEAR_RATIO
        width = self.hi - self.lo or self.hi
        return self.lo - (NEAR_RATIO - 1) * width <= x <= self.hi + (NEAR_RATIO - 1) * width

    def include(self, x: float) -> None:
        """Widen the range to ``x`` (a reference drawn beside the swept values)."""
        self.lo, self.hi = min(self.lo, x), max(self.hi, x)

    def share(self, x: float) -> float:
        """Where ``x`` lies on the axis of :meth:`limits`: 0 at its left end, 1 at its right."""
        left, right = self.limits()
        if self.log:
            return math.log(x / left) / math.log(right / left)
        return (x - left) / (right - left)

    def limits(self) -> tuple[float, float]:
        """``(left, right)`` for the axis: the range and a margin each side (never below 0)."""
        if self.log:
            decades = math.log10(self.hi / self.lo) or 1.0
            f = 10 ** (_MARGIN * decades)
            return self.lo / f, self.hi * f
        pad = _MARGIN * ((self.hi - self.lo) or self.hi)
        return max(0.0, self.lo - pad), self.hi + pad
