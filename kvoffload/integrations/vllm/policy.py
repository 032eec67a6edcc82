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

The adapter makes the calls vLLM's manager makes, when it makes them, with vLLM's ``ChunkStatus``
objects (``chunk_id`` = kvoffload's slot, ``ref_cnt`` -1 while pending, 0 evictable, the pin count
while pinned) and the request's own context (vLLM's ``ReqContext``, with its state and key
positions): ``insert`` for new pending chunks, ``remove`` for failed stores, ``mark_non_evictable``
when a load pins a chunk, ``mark_evictable`` when its ref count is back to 0,
``on_store_miss``, ``on_request_access`` (vLLM 0.33: the keys a request uses for the first time),
``on_request_finished`` (the request's keys grouped by KV-cache group, each group head first),
``touch``, ``evict`` with the offered keys protected, and ``clear``. Never ``get``: kvoffload's
manager keeps the key index.

Inside vLLM 0.33 (whose policies have ``on_request_access``) kvoffload's ``lru`` is
``request_lru``, which ranks a running request's blocks as vLLM 0.33's LRU does; under 0.32 it is
kvoffload's ``lru``, vLLM 0.32's order (:func:`resolve_cache_policy`).
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

__all__ = ["VLLM_RANKS_REQUESTS", "VLLMPolicyAdapter", "resolve_cache_policy"]

#: vLLM 0.33's policies see each request's first accesses, and its LRU ranks a running request's
#: blocks by them: kvoffload's ``lru`` is then ``request_lru`` (vLLM 0.32's LRU is kvoffload's ``lru``)
VLLM_RANKS_REQUESTS: bool = "on_request_access" in vars(VLLMCachePolicy)
#: adapter subclass per vLLM policy class (registered once with kvoffload's registry)
_ADAPTERS: dict[type, str] = {}


class VLLMPolicyAdapter(CachePolicy):
    """A vLLM ``CachePolicy`` (``vllm_policy_cls``, set by :func:`resolve_cache_policy` on a
    subclass) driven by kvoffload's manager; see the module docstring."""

    vllm_policy_cls: ClassVar[type[VLLMCachePolicy]]
    uses_requests = True

    def __init__(self, capacity: int, table: SlotTable) -> None:
        super().__init__(capacity, table)
        self.policy: VLLMCachePolicy = self.vllm_policy_cls(cache_capacity=capacity)
        self._key: list[bytes | None] = [None] * capacity
        self._chunk: list[ChunkStatus | None] = [None] * capacity
        # vLLM 0.33's insert also takes the storing request's context (0.32's does not)
        self._insert_takes_context = "req_context" in inspect.signature(self.policy.insert).parameters
        self._observes_access = callable(getattr(self.policy, "on_request_access", None))

    def _context(self) -> VLLMReqContext:
        """The current call's request context (an anonymous one where the caller gave none)."""
        ctx = self.request
        return ctx if ctx is not None else VLLMReqContext(req_id="")

    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        ctx = self._context()
        for s, key in zip(slots.tolist(), keys, strict=True):
            chunk = ChunkStatus(s)  # ref_cnt -1: pending
            self._key[s], self._chunk[s] = key, chunk
            if self._insert_takes_context:
                self.policy.insert(key, chunk, ctx)  # type: ignore[call-arg]
            else:
                self.policy.insert(key, chunk)

    def remove(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            key = self._key[s]
            self._key[s] = self._chunk[s] = None
            self.policy.remove(key)

    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        self.policy.touch(list(keys), self._context())

    def on_pinned(self, slots: np.ndarray) -> None:
        ref = self.table.ref_buf
        for s in slots.tolist():
            chunk = self._chunk[s]
            if chunk is not None:
                chunk.ref_cnt = ref[s]
                self.policy.mark_non_evictable(self._key[s])

    def on_evictable(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            key, chunk = self._key[s], self._chunk[s]
            if key is None or chunk is None:
                continue
            chunk.ref_cnt = 0
            self.policy.mark_evictable(key)

    def on_store_miss(self, keys: Sequence[bytes]) -> None:
        self.policy.on_store_miss(list(keys), self._context())

    def on_request_access(self, keys: Sequence[bytes], slots: np.ndarray) -> None:
        if self._observes_access:
            self.policy.on_request_access(list(keys), self._context())  # type: ignore[attr-defined]

    def on_request_finished(
        self, keys: Sequence[bytes], slots: np.ndarray, inserted_only: np.ndarray, reused: np.ndarray
    ) -> None:
        groups: dict[int, list[bytes]] = {}
        for key in keys:  # head first (by the request's key positions where it has them)
            groups.setdefault(get_offload_group_idx(key), []).append(key)
        ins = {k for k, f in zip(keys, inserted_only.tolist(), strict=True) if f}
        reu = {k for k, f in zip(keys, reused.tolist(), strict=True) if f}
        key_groups = tuple(tuple(groups[g]) for g in sorted(groups))
        self.policy.on_request_finished(key_groups, ins, reu, self._context())

    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        keys = self._key
        got = self.policy.evict(n, {keys[s] for s in protected.tolist() if keys[s] is not None})
        if got is None:
            return None
        victims = np.array([chunk.chunk_id for _, chunk in got], dtype=np.int64)
        for s in victims.tolist():
            self._key[s] = self._chunk[s] = None
        return victims

    def clear(self) -> None:
        self.policy.clear()
        self._key = [None] * self.capacity
        self._chunk = [None] * self.capacity


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

    * ``lru``: kvoffload's ``lru`` (vLLM 0.32's order), or inside vLLM 0.33 ``request_lru``
      (:data:`VLLM_RANKS_REQUESTS`);
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
    if name == "lru" and VLLM_RANKS_REQUESTS:
        return "request_lru"
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
