"""Options of a :class:`~kvoffload.engine.tiered.TieredManager`, as one value an engine can be given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kvoffload.errors import InvalidTypeError

__all__ = ["TieredOptions"]


@dataclass(frozen=True)
class TieredOptions:
    """The keyword options of :class:`~kvoffload.engine.tiered.TieredManager` (each documented
    there); a field left ``None`` takes the manager's default.

    Used by :class:`kvoffload.engine.reference.engine.Engine` (``tiered_options``), which builds its tiered
    manager itself.
    """

    max_write_blocks: int | None = None
    max_promoted_blocks: int | None = None
    probe_in_lookup: bool | None = None
    sync_load_budget_bytes: int | None = None
    on_promotion: Callable[[str, int], None] | None = None

    def keywords(self) -> dict[str, Any]:
        """The fields that are set, as keywords for ``TieredManager``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @staticmethod
    def check(value: object, name: str) -> TieredOptions:
        """``value`` (None: all defaults) as a ``TieredOptions``; anything else is a typed error naming ``name``."""
        if value is None:
            return TieredOptions()
        if not isinstance(value, TieredOptions):
            raise InvalidTypeError(f"{name} must be a TieredOptions, got {type(value).__name__}")
        return value
