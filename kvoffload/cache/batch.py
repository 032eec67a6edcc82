"""Key batches: keys checked once, and keys resolved to slots of a :class:`~kvoffload.cache.keytable.SlotTable`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvoffload.cache.memo import MemoBatch
from kvoffload.core.base import OffloadKey, check_key_batch, validate_keys
from kvoffload.errors import InvalidTypeError

if TYPE_CHECKING:
    from kvoffload.cache.keytable import SlotTable

logger = logging.getLogger(__name__)

__all__ = ["KeyBatch", "Resolved", "StorePlan", "as_key_list", "is_distinct"]


def as_key_list(keys: Iterable[OffloadKey], name: str = "keys", *, allow_duplicates: bool) -> list[OffloadKey]:
    """Validate a batch of keys with C-speed checks and return it as a new list.

    The fast path (every item exactly ``bytes``) costs two C loops; anything else goes
    through :func:`kvoffload.core.base.validate_keys`, which raises the typed error naming
    the bad item (``bytes`` subclasses such as ``numpy.bytes_`` included).
    """
    if keys.__class__ is not list:
        check_key_batch(keys, name)
    try:
        lst = list(keys)
    except TypeError as exc:
        raise InvalidTypeError(f"{name} must be an iterable of bytes keys, got {type(keys).__name__}") from exc
    if lst and set(map(type, lst)) != {bytes}:
        return validate_keys(lst, name, allow_duplicates=allow_duplicates)
    if not allow_duplicates and len(set(lst)) != len(lst):
        return validate_keys(lst, name, allow_duplicates=False)
    return lst


def is_distinct(keys: Sequence[OffloadKey]) -> bool:
    """Whether ``keys`` has no repeats (a unique :class:`KeyBatch` is known to have none)."""
    if len(keys) < 2 or (keys.__class__ is KeyBatch and keys.unique):  # type: ignore[attr-defined]
        return True
    return len(set(keys)) == len(keys)


class KeyBatch(list):  # type: ignore[type-arg]
    """Keys validated and resolved to slots once, at the outer door (:meth:`SlotTable.key_batch`).

    A ``list`` of the keys (every layer accepts it as a batch of keys) carrying their slots
    (``-1`` = absent), whether they are distinct, and the table and mutation epoch they were
    resolved against. A manager handed a *current* batch (same table, no key inserted or freed
    since) uses the slots as they are instead of checking and probing the keys again; any
    other batch is just a list of keys. :meth:`select` keeps the slots of a subset.
    """

    __slots__ = ("slots", "unique", "owner", "epoch", "_presence")

    slots: list[int]
    unique: bool
    owner: SlotTable
    epoch: int
    _presence: tuple[list[OffloadKey], list[int]]

    def select(self, keep: list[bool]) -> KeyBatch:
        """The keys whose ``keep`` flag is set, in order, with their slots."""
        out = KeyBatch(k for k, f in zip(self, keep, strict=True) if f)
        out.slots = [s for s, f in zip(self.slots, keep, strict=True) if f]
        out.unique, out.owner, out.epoch = self.unique, self.owner, self.epoch
        return out

    def presence(self) -> tuple[list[OffloadKey], list[int]]:
        """``(absent keys, slots of the present keys)``, each in batch order; computed once per
        batch (presence changes only with the table's epoch, which a current batch shares)."""
        try:
            return self._presence
        except AttributeError:
            slots = self.slots
            got = ([k for k, s in zip(self, slots, strict=True) if s < 0], [s for s in slots if s >= 0])
            self._presence = got
            return got


class StorePlan(NamedTuple):
    """A ``prepare_store``'s decision, before it is wrapped in an engine's output types.

    ``keys``: the keys given new pending slots, in call order; ``slots``: their slots (a list,
    or an ``int64`` array for large calls), or None when room could not be made (nothing
    changed; ``keys`` are then the keys it would have stored); ``evicted``: the keys evicted to
    make room, in eviction order.
    """

    keys: list[OffloadKey]
    slots: list[int] | np.ndarray | None
    evicted: list[OffloadKey]


class Resolved(NamedTuple):
    """Result of :meth:`SlotTable.resolve`."""

    keys: list[OffloadKey]
    slots: np.ndarray
    unique: bool
    batch: MemoBatch | None
    offset: int
