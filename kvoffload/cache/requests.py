"""The manager's request log (vLLM's request hooks): the blocks each running request stored and the
ready ones it read, applied to the policy when it ends (vLLM's scheduler never calls ``touch``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from kvoffload.cache.batch import KeyBatch
from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.core.base import OffloadKey

__all__ = ["Access", "RequestLog"]

#: a finished request's update on at most this many keys goes to a ``takes_lists`` policy as lists
SCALAR_LIMIT = 256
#: a key's last 4 bytes: its big-endian KV-cache group index (see core.base.make_offload_key)
_GROUP_SUFFIX = itemgetter(slice(-4, None))


class Access:
    """One request's keys stored or read (first-seen order), inserted, reused (read ready), and
    absent keys offered (the policy saw them once)."""

    __slots__ = ("keys", "inserted", "reused", "store_misses")

    def __init__(self) -> None:
        self.keys: dict[bytes, None] = {}
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()
        self.store_misses: set[bytes] = set()

    def record(self, keys: Iterable[bytes], reused: Iterable[bytes] = ()) -> None:
        """``keys`` were stored or read; ``reused`` of them were read ready (unless inserted here)."""
        self.keys.update(dict.fromkeys(keys))
        if reused:
            self.reused.update(set(reused).difference(self.inserted))


class RequestLog:
    """Per non-empty ``req_id``, its :class:`Access`, applied to the manager's ``policy`` when the
    request finishes (``table``: read only)."""

    def __init__(self, table: SlotTable, policy: CachePolicy) -> None:
        self._table = table
        self._policy = policy
        self._learns_misses = type(policy).on_store_miss is not CachePolicy.on_store_miss
        self._touch_only = type(policy).on_request_finished is CachePolicy.on_request_finished
        self._requests: dict[str, Access] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def start(self, req_id: str) -> None:
        """A request (re)starts: an id seen again starts afresh."""
        self._requests.pop(req_id, None)

    def get(self, req_id: str) -> Access | None:
        """The record of ``req_id`` (created on first use); None for an anonymous request."""
        if not req_id:
            return None
        st = self._requests.get(req_id)
        if st is None:
            st = self._requests[req_id] = Access()
        return st

    def offer(self, req_id: str, batch: KeyBatch, candidates: list[OffloadKey]) -> Access | None:
        """Request ``req_id`` offers the current ``batch`` for storing, ``candidates`` its absent
        keys past the reuse filter: those not offered before go to the policy's ``on_store_miss``;
        they and the ready keys are recorded before allocating (as vLLM does). The record (None
        for an anonymous request), for the caller to note the keys it inserts."""
        st = self.get(req_id)
        if st is None:
            return None
        if candidates and self._learns_misses:
            misses = [k for k in candidates if k not in st.store_misses]
            if misses:
                self._policy.on_store_miss(misses)
                st.store_misses.update(misses)
        ref = self._table.ref_buf
        ready = [k for k, s in zip(batch, batch.slots, strict=True) if s >= 0 and ref[s] >= 0]
        if len(candidates) + len(ready) == len(batch):
            st.record(batch, ready)
        else:
            keep = set(candidates).union(ready)
            st.record((k for k in batch if k in keep), ready)
        return st

    def finish(self, req_id: str, key_position: Callable[[OffloadKey], int | None] | None) -> None:
        """Apply the request's record to the policy (``on_request_finished``) and forget it; keys
        head first: by token position (``key_position``) when known for every key, else, and for
        ties, by group (the big-endian key suffix), then first-seen."""
        st = self._requests.pop(req_id, None)
        if st is None or not st.keys:
            return
        keys: list[OffloadKey] = list(st.keys)  # type: ignore[arg-type]
        pos = list(map(key_position, keys)) if key_position is not None else [None]
        if None in pos:
            keys.sort(key=_GROUP_SUFFIX)
        elif pos != sorted(set(pos)):  # type: ignore[type-var]  # not recorded head first already
            where = dict(zip(keys, pos, strict=True))
            if len(set(pos)) < len(pos):
                keys.sort(key=_GROUP_SUFFIX)
            keys.sort(key=where.__getitem__)  # type: ignore[arg-type]
        slots: Any = list(map(self._table.index.get, keys, repeat(-1)))
        lists = self._policy.takes_lists and len(keys) <= SCALAR_LIMIT
        if self._touch_only:  # the default on_request_finished, without its flags
            self._policy.touch(keys, slots if lists else np.array(slots, dtype=np.int64), unique=True)
            return
        inserted_only, reused = st.inserted - st.reused, st.reused
        ins = [k in inserted_only for k in keys] if inserted_only else [False] * len(keys)
        reu = [k in reused for k in keys] if reused else [False] * len(keys)
        if lists:
            self._policy.on_request_finished(keys, slots, ins, reu)  # type: ignore[arg-type]
        else:
            arrays = np.array(slots, dtype=np.int64), np.array(ins, dtype=bool), np.array(reu, dtype=bool)
            self._policy.on_request_finished(keys, *arrays)

    def clear(self) -> None:
        self._requests.clear()
