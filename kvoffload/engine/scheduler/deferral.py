"""Deferred requests that wait on known keys: answer their repeat lookups without looking up again.

A request whose lookup met a ``LOOKUP_PENDING`` key (a store or a tier promotion in flight, a tier
probe outstanding) or a key another request is loading is deferred: ``get_num_new_matched_tokens``
answers ``(None, False)`` and the engine asks again at its next step, and the next, until the
answer changes. The answer can only stop being "defer" when one of the keys it waited on changes
state (a pending key becomes ready or absent, a load finishes): until then a repeat lookup would
find the same codes. :class:`DeferredLookups` remembers, per deferred request, those keys and the
request as it was asked (its computed tokens, its tokens and hashes); a repeat call for the same
request, asked the same, is still deferred until one of its keys was *resolved*:

* by the scheduler: a store job's keys when it completes (``complete_store``), a load job's keys
  when it completes or is cancelled;
* by the manager: keys its ``take_resolved()`` reports (a
  :class:`~kvoffload.engine.tiered.TieredManager`: finished promotions, answered tier probes).

A key that another change would un-defer sooner (a host-pool hit evicted before the pending key)
keeps the request deferred until one of its keys resolves -- never longer: every pending state
resolves through one of the calls above. Used only with a manager that has ``take_resolved``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["DeferredLookups", "request_signature"]

Signature = tuple[int, int, int, Any]


def request_signature(request: Any, num_computed_tokens: int, num_tokens: int) -> Signature:
    """What a lookup's answer depends on besides the cache: computed tokens, tokens, hashes (the
    hashes are chained: their count and the last one stand for all of them)."""
    hashes = request.block_hashes
    return (num_computed_tokens, num_tokens, len(hashes), hashes[-1] if len(hashes) else None)


class DeferredLookups:
    """Per deferred request, the keys it waits on (see the module docstring).

    Args:
        take_resolved: the manager's ``take_resolved()``: keys whose pending state may have ended
            since its last call.
    """

    __slots__ = ("_take", "_waits", "_watch")

    def __init__(self, take_resolved: Callable[[], Iterable[Any]]) -> None:
        self._take = take_resolved
        self._waits: dict[str, tuple[Signature, list[Any]]] = {}
        self._watch: dict[Any, set[str]] = {}
        take_resolved()  # the manager records resolved keys from its first call on: before any deferral

    def __len__(self) -> int:
        """Requests currently remembered as deferred."""
        return len(self._waits)

    def still_deferred(self, req_id: str, signature: Signature) -> bool:
        """True when ``req_id`` was deferred asked the same way and none of its keys resolved since."""
        if req_id not in self._waits:
            return False
        self.resolve(self._take())
        w = self._waits.get(req_id)
        return w is not None and w[0] == signature

    def poll(self) -> None:
        """Take the manager's resolved keys now (once per step keeps its record short)."""
        self.resolve(self._take())

    def defer(self, req_id: str, signature: Signature, keys: Sequence[Any]) -> None:
        """Remember that ``req_id``, asked as ``signature``, was deferred waiting on ``keys``."""
        self.forget(req_id)
        if not keys:
            return
        keys = list(dict.fromkeys(keys))
        self._waits[req_id] = (signature, keys)
        watch = self._watch
        for k in keys:
            rids = watch.get(k)
            if rids is None:
                watch[k] = {req_id}
            else:
                rids.add(req_id)

    def forget(self, req_id: str) -> None:
        """Drop ``req_id``'s record (its next call looks up again)."""
        w = self._waits.pop(req_id, None)
        if w is None:
            return
        watch = self._watch
        for k in w[1]:
            rids = watch.get(k)
            if rids is not None:
                rids.discard(req_id)
                if not rids:
                    del watch[k]

    def resolve(self, keys: Iterable[Any]) -> None:
        """Keys whose state changed: every request waiting on one of them looks up again."""
        watch = self._watch
        if not watch:
            return
        for k in keys:
            rids = watch.pop(k, None)
            if rids:
                for rid in rids:
                    self.forget(rid)

    def clear(self) -> None:
        """Forget every request (after a cache reset)."""
        self._waits.clear()
        self._watch.clear()
