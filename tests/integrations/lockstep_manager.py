"""kvoffload's manager and vLLM's own ``CPUOffloadingManager`` driven as one by vLLM's connector.

:class:`LockstepManager` takes the place of the connector's manager: every call vLLM's connector
makes runs on kvoffload's :class:`~kvoffload.integrations.vllm.KVOffloadManager` and on vLLM's
manager, in the order the connector makes it (with async scheduling: the order of overlapped
steps), and every answer vLLM can see is compared at once: lookups, load and store slots, the keys
to store, evicted keys, events, stats, pending work. kvoffload's answer is the one the connector
gets, so kvoffload's slots drive the worker, whose loads the harness checks byte for byte.

Each manager keeps its own state in the request's ``ReqContext`` (``set_state``), so vLLM's
manager gets a shadow context per request, with the connector's key positions and transfer
parameters copied in before each call.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

from vllm.v1.kv_offload.base import ReqContext


class Divergence(AssertionError):
    """kvoffload's manager answered a call otherwise than vLLM's."""


def _keys(out: Any) -> Any:
    """What vLLM sees of an answer: slots, keys and evictions instead of the spec objects."""
    if out is None or isinstance(out, (bool, int, str)):
        return out
    if hasattr(out, "keys_to_store"):  # PrepareStoreOutput
        return (list(out.keys_to_store), _keys(out.store_spec), sorted(out.evicted_keys))
    if hasattr(out, "block_ids"):  # a load/store spec
        return [int(b) for b in out.block_ids]
    return out


def _stats(out: Any) -> Any:
    return None if out is None else out.data


def _events(events: Iterable[Any]) -> list[tuple[bool, list[Any]]]:
    return [(e.removed, sorted(e.keys)) for e in events]


class LockstepManager:
    """vLLM's manager contract over ``ours`` and ``theirs``; answers ``ours``', after comparing.

    Attributes:
        calls: calls made, by name.
        evicted: keys evicted (both managers evicted the same).
        offered: every key offered to ``prepare_store``.
    """

    def __init__(self, ours: Any, theirs: Any) -> None:
        self.ours = ours
        self.theirs = theirs
        self.medium = ours.medium
        self.calls: Counter[str] = Counter()
        self.evicted = 0
        self.offered: set[Any] = set()
        self._contexts: dict[int, tuple[ReqContext, ReqContext]] = {}  # keeps the connector's alive

    def _shadow(self, ctx: ReqContext) -> ReqContext:
        pair = self._contexts.get(id(ctx))
        if pair is None:
            pair = (ctx, dataclasses.replace(ctx))
            self._contexts[id(ctx)] = pair
        shadow = pair[1]
        shadow.kv_transfer_params = ctx.kv_transfer_params
        positions = getattr(ctx, "_offload_key_positions", None)
        if positions:
            shadow._offload_key_positions.update(positions)
        return shadow

    def _both(self, name: str, *args: Any, compare: Any = _keys) -> Any:
        """``name`` on both managers (a context argument translated for vLLM's); ours' answer."""
        self.calls[name] += 1
        args = tuple(list(a) if isinstance(a, (list, tuple, set, frozenset)) or _is_iter(a) else a for a in args)
        theirs_args = tuple(self._shadow(a) if isinstance(a, ReqContext) else a for a in args)
        theirs_args = tuple(list(a) if isinstance(a, list) else a for a in theirs_args)
        got = getattr(self.ours, name)(*args)
        want = getattr(self.theirs, name)(*theirs_args)
        if compare is not None and compare(got) != compare(want):
            raise Divergence(
                f"call {sum(self.calls.values())} {name}{args[:1]}: kvoffload {compare(got)!r}, vLLM {compare(want)!r}"
            )
        return got

    # ------------------------------------------------------------------ vLLM's manager contract
    def on_new_request(self, req_context: ReqContext) -> Any:
        return self._both("on_new_request", req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._both("on_request_finished", req_context)

    def lookup(self, key: Any, req_context: ReqContext) -> Any:
        return self._both("lookup", key, req_context)

    def get_load_source(self, key: Any, req_context: ReqContext) -> Any:
        return self._both("get_load_source", key, req_context)

    def prepare_load(self, keys: Any, req_context: ReqContext) -> Any:
        return self._both("prepare_load", keys, req_context)

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        self._both("touch", keys, req_context)

    def complete_load(self, keys: Any, req_context: ReqContext) -> None:
        self._both("complete_load", keys, req_context)

    def prepare_store(self, keys: Any, req_context: ReqContext) -> Any:
        keys = list(keys)
        self.offered.update(keys)
        out = self._both("prepare_store", keys, req_context)
        if out is not None:
            self.evicted += len(out.evicted_keys)
        return out

    def complete_store(self, keys: Any, req_context: ReqContext, success: bool = True) -> None:
        self._both("complete_store", keys, req_context, success)

    def take_events(self) -> list[Any]:
        got, want = list(self.ours.take_events()), list(self.theirs.take_events())
        self.calls["take_events"] += 1
        if _events(got) != _events(want):
            raise Divergence(f"take_events: kvoffload {_events(got)}, vLLM {_events(want)}")
        return got

    def get_stats(self) -> Any:
        return self._both("get_stats", compare=_stats)

    def has_pending_work(self) -> bool:
        return bool(self._both("has_pending_work"))

    def reset_cache(self) -> None:
        self._both("reset_cache")

    def on_schedule_end(self, context: Any) -> None:
        self._both("on_schedule_end", context)

    def on_reset_flushed(self) -> None:
        self._both("on_reset_flushed")

    @property
    def lock(self) -> Any:
        return self.ours.lock

    def config_info(self) -> Any:
        return self.ours.config_info()

    def shutdown(self) -> None:
        self.ours.shutdown()
        self.theirs.shutdown()


def _is_iter(a: Any) -> bool:
    """A one-shot iterable of keys (materialised once, so both managers get the same keys)."""
    return hasattr(a, "__next__")


__all__ = ["Divergence", "LockstepManager"]
