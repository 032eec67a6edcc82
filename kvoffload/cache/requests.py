"""The manager's request log (vLLM's request hooks): the blocks each running request stored and the
ready ones it read, applied to the policy when it ends (vLLM's scheduler never calls ``touch``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, islice, repeat
from operator import itemgetter, lt
from typing import Any

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy
from kvoffload.core.base import OffloadKey

__all__ = ["Access", "RequestLog"]

#: a finished request's update on at most this many keys goes to a ``takes_lists`` policy as lists
SCALAR_LIMIT = 256
#: a key's last 4 bytes: its big-endian KV-cache group index (see core.base.make_offload_key)
_GROUP_SUFFIX = itemgetter(slice(-4, None))


class Access:
    """One request's keys stored or read (``chunks``: one list per call, first-seen order once
    joined), inserted, reused (read ready), and absent keys offered (the policy saw them once)."""

    __slots__ = ("chunks", "inserted", "reused", "store_misses", "seen")

    def __init__(self) -> None:
        self.chunks: list[list[OffloadKey]] = []
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()
        self.store_misses: set[bytes] = set()
        #: keys already announced to the policy's ``on_request_access`` (only kept for such a policy)
        self.seen: set[bytes] = set()


class RequestLog:
    """Per non-empty ``req_id``, its :class:`Access`, applied to the manager's ``policy`` when the
    request finishes (``table``: read only). For a policy that keeps the default
    ``on_request_finished`` (a touch of the keys) only the keys are recorded."""

    def __init__(self, table: SlotTable, policy: CachePolicy) -> None:
        self._table = table
        self._policy = policy
        self._learns_misses = type(policy).on_store_miss is not CachePolicy.on_store_miss
        self._touch_only = type(policy).on_request_finished is CachePolicy.on_request_finished
        self._tells_access = type(policy).on_request_access is not CachePolicy.on_request_access
        self._requests: dict[str, Access] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def start(self, req_id: str) -> None:
        """A request (re)starts: an id seen again starts afresh; its end reaches the policy even if
        it used nothing (as vLLM's manager tells its policy)."""
        self._requests[req_id] = Access()

    def read(self, req_id: str, keys: Sequence[OffloadKey]) -> None:
        """Request ``req_id`` (none if empty) read the ready ``keys``: recorded as reuses unless it
        inserted them itself."""
        if not req_id:
            return
        st = self._requests.get(req_id) or self._requests.setdefault(req_id, Access())
        if not keys:
            return
        st.chunks.append(list(keys))
        if self._tells_access:
            self._access(st, keys)
        if not self._touch_only:
            st.reused.update(set(keys).difference(st.inserted))

    def _access(self, st: Access, keys: Sequence[OffloadKey]) -> None:
        """The policy's ``on_request_access`` with the keys of ``keys`` the request had not used."""
        seen = st.seen
        new = [k for k in keys if k not in seen]
        if new:
            seen.update(new)
            slots = np.fromiter(map(self._table.index.get, new, repeat(-1)), dtype=np.int64, count=len(new))
            self._policy.on_request_access(new, slots)

    def offer(
        self, req_id: str, keys: Sequence[OffloadKey], slots: list[int], candidates: list[OffloadKey]
    ) -> set[bytes] | None:
        """Request ``req_id`` offers the distinct ``keys`` (their current ``slots``, -1 = absent) for
        storing, ``candidates`` its absent keys past the reuse filter: those not offered before go
        to the policy's ``on_store_miss``; they and the ready keys are recorded before allocating
        (as vLLM does). The set the caller adds the keys it inserts to, or None (an anonymous
        request, or a policy that only touches)."""
        if not req_id:
            return None
        st = self._requests.get(req_id) or self._requests.setdefault(req_id, Access())
        if candidates and self._learns_misses:
            seen = st.store_misses
            misses = [k for k in candidates if k not in seen] if seen else candidates
            if misses:
                self._policy.on_store_miss(misses)
                st.store_misses.update(misses)
        if len(candidates) == len(keys):  # every key absent and admitted (the common offer)
            if keys:
                st.chunks.append(list(keys))
                if self._tells_access:
                    self._access(st, keys)
            return None if self._touch_only else st.inserted
        ref = self._table.ref_buf
        ready = [k for k, s in zip(keys, slots) if s >= 0 and ref[s] >= 0]  # noqa: B905 (hot: see keytable)
        if len(candidates) + len(ready) == len(keys):
            st.chunks.append(list(keys))
        else:
            keep = set(candidates).union(ready)
            st.chunks.append([k for k in keys if k in keep])
        if self._tells_access:
            self._access(st, st.chunks[-1])
        if self._touch_only:
            return None
        if ready:
            st.reused.update(set(ready).difference(st.inserted))
        return st.inserted

    def finish(self, req_id: str, key_position: Callable[[OffloadKey], int | None] | None) -> None:
        """Apply the request's record to the policy (``on_request_finished``) and forget it; keys
        head first: by token position (``key_position``) when known for every key, else, and for
        ties, by group (the big-endian key suffix), then first-seen."""
        st = self._requests.pop(req_id, None)
        if st is None:
            return
        chunks = st.chunks  # each distinct; keys strictly head first (recorded so) are distinct too
        keys: list[OffloadKey] = chunks[0] if len(chunks) == 1 else list(chain.from_iterable(chunks))
        if not keys:
            if not self._touch_only:  # a request that used nothing ends too
                none = np.zeros(0, dtype=np.int64)
                self._policy.on_request_finished([], none, none.astype(bool), none.astype(bool))
            return
        pos = list(map(key_position, keys)) if key_position is not None else [None] * len(keys)
        try:  # recorded head first (the common case; a comparison with None raises, unlike ``None in pos``'s scan)
            ordered = all(map(lt, pos, islice(pos, 1, None)))  # type: ignore[arg-type]
        except TypeError:
            ordered = False
        if not ordered and None in pos:
            keys = list(dict.fromkeys(keys))
            keys.sort(key=_GROUP_SUFFIX)
        elif not ordered:
            where = dict(zip(keys, pos))  # noqa: B905 (hot: see keytable)  # each key once, first seen first
            keys = list(where)
            if len(set(where.values())) < len(keys):
                keys.sort(key=_GROUP_SUFFIX)
            keys.sort(key=where.__getitem__)  # type: ignore[arg-type]
        slots: Any = list(map(self._table.index.get, keys, repeat(-1)))
        lists = self._policy.takes_lists and len(keys) <= SCALAR_LIMIT
        if self._touch_only:  # the default on_request_finished, without its flags
            self._policy.touch(keys, slots if lists else np.array(slots, dtype=np.int64), unique=True)
            return
        inserted_only, reused = st.inserted - st.reused, st.reused
        ins = list(map(inserted_only.__contains__, keys)) if inserted_only else [False] * len(keys)
        reu = list(map(reused.__contains__, keys)) if reused else [False] * len(keys)
        if lists:
            self._policy.on_request_finished(keys, slots, ins, reu)  # type: ignore[arg-type]
        else:
            arrays = np.array(slots, dtype=np.int64), np.array(ins, dtype=bool), np.array(reu, dtype=bool)
            self._policy.on_request_finished(keys, *arrays)

    def clear(self) -> None:
        self._requests.clear()
