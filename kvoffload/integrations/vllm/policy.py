"""vLLM ``CachePolicy`` classes behind kvoffload's manager: an adapter from vLLM's key-based policy
interface to kvoffload's slot-based one.

vLLM's ``CPUOffloadingManager`` resolves ``eviction_policy`` through its ``CachePolicyFactory``: a
name registered there (``register_cache_policy``), or a class name looked up in
``cache_policy_module_path``. :func:`resolve_cache_policy` accepts the same, so that a vLLM user
with a custom policy can switch to kvoffload: a vLLM policy class runs inside
:class:`VLLMPolicyAdapter`, registered with kvoffload's policy registry under
``vllm/<module>.<class>``. kvoffload's own names (``lru``, ``arc``, ``s3fifo``, names registered
with :func:`kvoffload.register_policy`) and kvoffload ``module:Class`` policies come first: its
``lru`` and ``arc`` are vLLM's semantics on slot arrays.

The adapter makes the calls vLLM's manager makes, with vLLM's ``ChunkStatus`` objects (``chunk_id``
= kvoffload's slot, ``ref_cnt`` -1 while pending): ``insert`` for new pending chunks, ``remove``
for failed stores, ``mark_evictable`` when a chunk's ref count reaches 0, ``mark_non_evictable``
when it leaves 0, ``on_store_miss``, ``on_request_finished`` (the request's keys in kvoffload's
head-first order, grouped by KV-cache group), ``evict`` with the offered keys protected, and
``clear``. kvoffload's manager reports pins (ref count 0 -> 1) to no policy: the adapter finds
them before each eviction (one numpy pass over the slots it believes evictable) and replays
``mark_non_evictable`` -- and ``mark_non_evictable`` + ``mark_evictable`` for a chunk pinned and
released in between, the calls vLLM's manager made -- so the policy never sees a stale state.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import ReqContext as VLLMReqContext
from vllm.v1.kv_offload.base import get_offload_group_idx
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as VLLMCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

from kvoffload.cache.keytable import SlotTable
from kvoffload.cache.policies.base import CachePolicy, available_policies, register_policy
from kvoffload.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["VLLMPolicyAdapter", "resolve_cache_policy"]

#: adapter subclass per vLLM policy class (registered once with kvoffload's registry)
_ADAPTERS: dict[type, str] = {}


class VLLMPolicyAdapter(CachePolicy):
    """A vLLM ``CachePolicy`` (``vllm_policy_cls``, set by :func:`resolve_cache_policy` on a
    subclass) driven by kvoffload's manager; see the module docstring."""

    vllm_policy_cls: ClassVar[type[VLLMCachePolicy]]

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.policy: VLLMCachePolicy = self.vllm_policy_cls(cache_capacity=capacity)
        self._key: list[bytes | None] = [None] * capacity
        self._chunk: list[ChunkStatus | None] = [None] * capacity
        self._evictable = np.zeros(capacity, dtype=bool)  # what the vLLM policy was told
        self._context = VLLMReqContext(req_id="")
        # vLLM 0.33's insert also takes the storing request's context (0.32's does not)
        self._insert_takes_context = "req_context" in inspect.signature(self.policy.insert).parameters

    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        for s, key in zip(slots.tolist(), keys, strict=True):
            chunk = ChunkStatus(s)  # ref_cnt -1: pending
            self._key[s], self._chunk[s] = key, chunk
            if self._insert_takes_context:
                self.policy.insert(key, chunk, self._context)  # type: ignore[call-arg]
            else:
                self.policy.insert(key, chunk)

    def remove(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            key = self._key[s]
            self._key[s] = self._chunk[s] = None
            self.policy.remove(key)

    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        self.policy.touch(list(keys), self._context)

    def on_evictable(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            key, chunk = self._key[s], self._chunk[s]
            if key is None or chunk is None:
                continue
            if self._evictable[s]:  # pinned and released since vLLM's policy last heard of it
                self.policy.mark_non_evictable(key)
            chunk.ref_cnt = 0
            self._evictable[s] = True
            self.policy.mark_evictable(key)

    def on_store_miss(self, keys: Sequence[bytes]) -> None:
        self.policy.on_store_miss(list(keys), self._context)

    def on_request_finished(
        self, keys: Sequence[bytes], slots: np.ndarray, inserted_only: np.ndarray, reused: np.ndarray
    ) -> None:
        groups: dict[int, list[bytes]] = {}
        ctx = VLLMReqContext(req_id="")
        for i, key in enumerate(keys):
            groups.setdefault(get_offload_group_idx(key), []).append(key)
            ctx.set_offload_key_position(key, i)  # kvoffload's head-first order, as vLLM orders them
        ins = {k for k, f in zip(keys, inserted_only.tolist(), strict=True) if f}
        reu = {k for k, f in zip(keys, reused.tolist(), strict=True) if f}
        key_groups = tuple(tuple(groups[g]) for g in sorted(groups))
        self.policy.on_request_finished(key_groups, ins, reu, ctx)

    def _sync_pins(self) -> None:
        """Tell the vLLM policy about chunks pinned since it last heard of them."""
        pinned = np.flatnonzero(self._evictable & (self.table.ref != 0))
        for s in pinned.tolist():
            chunk = self._chunk[s]
            if chunk is not None:
                chunk.ref_cnt = int(self.table.ref[s])
                self.policy.mark_non_evictable(self._key[s])
            self._evictable[s] = False

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        self._sync_pins()
        keys = self._key
        got = self.policy.evict(n, {keys[s] for s in protected.tolist() if keys[s] is not None})
        if got is None:
            return None
        victims = np.array([chunk.chunk_id for _, chunk in got], dtype=np.int64)
        for s in victims.tolist():
            self._key[s] = self._chunk[s] = None
            self._evictable[s] = False
        return victims

    def clear(self) -> None:
        self.policy.clear()
        self._key = [None] * self.capacity
        self._chunk = [None] * self.capacity
        self._evictable[:] = False


def _adapter_name(vllm_cls: type) -> str:
    """The kvoffload registry name of the adapter for ``vllm_cls`` (registered on first use)."""
    if inspect.isabstract(vllm_cls):
        raise InvalidTypeError(f"vLLM cache policy {vllm_cls.__qualname__} is abstract")
    name = _ADAPTERS.get(vllm_cls)
    if name is None:
        name = f"vllm/{vllm_cls.__module__}.{vllm_cls.__qualname__}"
        cls = type(f"VLLMPolicyAdapter[{vllm_cls.__qualname__}]", (VLLMPolicyAdapter,), {"vllm_policy_cls": vllm_cls})
        register_policy(name, cls, replace=True)
        _ADAPTERS[vllm_cls] = name
    return name


def _from_module(name: str, module_path: str) -> Any:
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise InvalidArgumentError(f"cache_policy_module_path {module_path!r} cannot be imported: {exc}") from exc
    try:
        return getattr(module, name)
    except AttributeError:
        raise InvalidArgumentError(f"cache policy {name!r} is not in module {module_path!r}") from None


def resolve_cache_policy(name: str, module_path: str | None = None) -> str:
    """The kvoffload ``cache_policy`` for vLLM's ``eviction_policy`` and ``cache_policy_module_path``.

    In vLLM's order (a registered name first, then the module path):

    * a kvoffload name (built-in or registered), kept as it is;
    * a name registered with vLLM's ``CachePolicyFactory``: the adapter over that class;
    * with ``module_path``, the class ``name`` in that module; else, for ``"module:Class"``,
      that class -- a kvoffload ``CachePolicy`` (``"module:Class"``) or a vLLM one (the adapter).

    Raises:
        InvalidTypeError: ``name`` not a non-empty str, or the class found is no cache policy.
        InvalidArgumentError: nothing of that name.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTypeError(f"eviction_policy must be a non-empty str, got {name!r}")
    if name in available_policies():
        return name
    if name in CachePolicyFactory._registry:
        return _adapter_name(CachePolicyFactory.get_cache_policy_cls(name))
    if module_path is not None:
        spec = f"{module_path}:{name}"
    elif ":" in name:
        spec = name
    else:
        raise InvalidArgumentError(
            f"unknown eviction_policy {name!r}: not a kvoffload policy ({', '.join(available_policies())}) "
            "nor registered with vLLM's CachePolicyFactory; for an out-of-tree class also set "
            "cache_policy_module_path (or pass 'module:Class')"
        )
    mod, _, attr = spec.partition(":")
    obj = _from_module(attr, mod)
    if isinstance(obj, type) and issubclass(obj, VLLMCachePolicy):
        return _adapter_name(obj)
    if isinstance(obj, type) and issubclass(obj, CachePolicy):
        return spec
    raise InvalidTypeError(f"eviction_policy {spec!r} is neither a kvoffload nor a vLLM CachePolicy class: {obj!r}")
