"""The cache-policy contract of :class:`~kvoffload.cache.manager.CPUOffloadingManager`, and its registry.

A policy decides *order* (which ready block goes first); the manager owns everything else:
the key index, slot allocation, ref counts, pending/ready states, events and statistics
(:class:`~kvoffload.cache.keytable.SlotTable`). Policies work on slot ids (``int64`` numpy
arrays), never on per-block objects.

Out-of-tree policies: subclass :class:`CachePolicy` and either :func:`register_policy` it or
pass ``"package.module:ClassName"`` as ``cache_policy``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from kvoffload.cache.keytable import SlotTable
from kvoffload.registry import Registry

logger = logging.getLogger(__name__)

__all__ = ["CachePolicy", "Slots", "POLICIES", "register_policy", "get_policy_class", "available_policies"]


#: what the methods of a policy that ``takes_lists`` accept: an ``int64`` array or a list of ints
Slots = Union[np.ndarray, list]  # noqa: UP007


class CachePolicy(ABC):
    """Ordering and victim selection over the slots of a :class:`SlotTable`.

    The contract: one method per operation. The manager calls, with ``slots`` an ``int64`` numpy
    array (see ``takes_lists`` for the one exception):

    * :meth:`insert` for blocks that just became pending (in call order),
    * :meth:`remove` for pending blocks whose store failed,
    * :meth:`touch` with the keys of a ``touch`` call and their slots (``-1`` = absent),
    * :meth:`evict` to pick victims, and :meth:`clear` on reset.

    Optional (defaults given here): :meth:`on_evictable` (ready blocks reached ref count 0: store
    completed, or last load completed), :meth:`on_pinned` (ready blocks left ref count 0: a load
    pinned them), :meth:`on_store_miss` (absent keys offered for storing),
    :meth:`on_request_access` (keys a running request uses for the first time),
    :meth:`on_request_finished` (request-scoped recency; default: :meth:`touch`),
    :meth:`metadata_nbytes`. The manager calls a hook only if the policy's class overrides it.

    A block is *evictable* iff ``table.ref[s] == 0``. ``evict`` must pick only evictable
    slots not in ``protected`` (also marked 1 in ``table.prot_mark`` during the call); it
    either returns exactly ``n`` slots (and forgets them) or returns None and leaves every
    observable decision unchanged. The manager only calls ``evict`` when at least ``n``
    evictable, unprotected blocks exist.

    Small calls: a policy whose class sets ``takes_lists = True`` is also handed plain Python
    lists (``list[int]`` slots, ``list[bool]`` flags, ``protected`` a list, and ``evict`` then
    answers a list) for calls on a few keys (the manager's ``SMALL_BATCH``), and switches on the
    argument's type inside the method (a numpy call costs about a microsecond whatever its size);
    it annotates its arguments :data:`Slots`. A new policy need not: with ``takes_lists = False``
    (the default) it only ever sees arrays.

    Workload tags: a policy whose class sets ``uses_workload = True`` reads :attr:`workload`, which
    the manager sets to the tag of the request (:func:`~kvoffload.core.base.workload_tag` of its
    context: ``ReqContext.workload`` or vLLM's ``kv_transfer_params["kv_workload"]``; None when it
    has none) before every :meth:`insert`, :meth:`touch`, :meth:`evict` and
    :meth:`on_request_finished` made on that request's behalf. Other policies are never told
    (the manager tests one flag per call) and implement nothing.

    Request contexts: a policy whose class sets ``uses_requests = True`` reads :attr:`request`, which
    the manager sets to the request context of the call before every :meth:`insert`,
    :meth:`touch`, :meth:`evict`, :meth:`on_pinned`, :meth:`on_store_miss`,
    :meth:`on_request_access` and :meth:`on_request_finished` it makes on a request's behalf (at
    other hooks it may name an earlier request). The context is the engine's own (vLLM's
    ``ReqContext`` inside vLLM): ``req_id``, and where the engine has them
    ``get_offload_key_position(key)`` and ``get_state`` / ``set_state``.

    Args:
        capacity: number of slots (``table.num_blocks``).
        table: the manager's slot table (read ``ref``/``keys`` from it; never mutate it).
    """

    #: Registry name (informational).
    name: str = ""
    #: whether the methods also take plain lists for small calls (see the class docstring)
    takes_lists: bool = False
    #: whether the manager sets :attr:`workload` before each call (see the class docstring)
    uses_workload: bool = False
    #: the current request's workload tag (only maintained when ``uses_workload``)
    workload: str | None = None
    #: whether the manager sets :attr:`request` before each call (see the class docstring)
    uses_requests: bool = False
    #: the current call's request context (only maintained when ``uses_requests``)
    request: Any = None

    def __init__(self, capacity: int, table: SlotTable) -> None:
        self.capacity = capacity
        self.table = table

    @abstractmethod
    def insert(self, slots: np.ndarray, keys: Sequence[bytes]) -> None:
        """New pending blocks ``slots`` holding ``keys`` (same order, call order)."""

    @abstractmethod
    def remove(self, slots: np.ndarray) -> None:
        """Forget ``slots`` (failed stores; still pending)."""

    @abstractmethod
    def touch(self, keys: Sequence[bytes], slots: np.ndarray, unique: bool = False) -> None:
        """Mark recently used; ``slots[i]`` is the slot of ``keys[i]`` or -1 if absent.

        The first key ends up most recent. Keys may repeat unless ``unique`` is True.
        """

    def on_evictable(self, slots: np.ndarray) -> None:  # noqa: B027 - optional hook
        """``slots`` just became evictable (ref count 0)."""

    def on_pinned(self, slots: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Ready ``slots`` just left ref count 0 (a load pinned them): not evictable until
        :meth:`on_evictable` names them again."""

    def on_request_access(self, keys: Sequence[bytes], slots: np.ndarray) -> None:  # noqa: B027 - optional hook
        """The running request (:attr:`request` with ``uses_requests``) uses ``keys`` for the first
        time: read ready copies of them (after pinning), or offered them for storing, absent past
        the reuse filter or ready (before any is inserted; ``slots[i]`` -1 = absent). Called once
        per request and key, before the request ends; for requests with a non-empty ``req_id``."""

    def on_store_miss(self, keys: Sequence[bytes]) -> None:  # noqa: B027 - optional hook
        """``keys`` (absent, past the reuse filter) are about to be stored. Request-scoped engines
        (vLLM) never call ``touch``: this is where a policy with history (ARC's ghost lists) learns."""

    def on_request_finished(
        self, keys: Sequence[bytes], slots: np.ndarray, inserted_only: np.ndarray, reused: np.ndarray
    ) -> None:
        """One finished request's accesses, applied at once (request-scoped engines).

        ``keys`` distinct, head first (the first ends up most recent), ``slots[i]`` its slot or -1;
        ``inserted_only[i]`` / ``reused[i]`` (bools): the request only stored the key /
        read a ready copy of it. The default treats every key as touched.
        """
        self.touch(keys, slots, unique=True)

    @abstractmethod
    def evict(self, n: int, protected: np.ndarray) -> np.ndarray | None:
        """Pick and forget exactly ``n`` evictable slots not in ``protected``, in eviction order."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything (blocks, history, adaptive state)."""

    def metadata_nbytes(self) -> int:
        """Bytes held by the policy's arrays (for memory reports)."""
        return 0


#: the cache policies by name (built-ins imported on first use)
POLICIES: Registry[CachePolicy] = Registry(
    "cache_policy",
    CachePolicy,
    {
        "lru": "kvoffload.cache.policies.lru:LRUPolicy",
        "arc": "kvoffload.cache.policies.arc:ARCPolicy",
        "s3fifo": "kvoffload.cache.policies.s3fifo:S3FIFOPolicy",
        "headstart": "kvoffload.cache.policies.headstart:HeadStartPolicy",
        "request_lru": "kvoffload.cache.policies.request_lru:RequestLRUPolicy",
    },
)


def register_policy(name: str, cls: type[CachePolicy], *, replace: bool = False) -> None:
    """Make ``cls`` selectable as ``cache_policy=name`` (:meth:`kvoffload.registry.Registry.register`).

    Args:
        name: the registry name.
        cls: a concrete :class:`CachePolicy` subclass (abstract classes are refused here rather
            than failing when a manager is built).
        replace: replace a name that is already taken -- a built-in (``lru``, ``request_lru``, ``arc``,
            ``s3fifo``, ``headstart``) or an earlier registration of another class. Without it, that is an
            :class:`~kvoffload.errors.InvalidArgumentError`; registering the same class again
            is a no-op.
    """
    POLICIES.register(name, cls, replace=replace)


def get_policy_class(name: str) -> type[CachePolicy]:
    """The policy class for ``name``: a registered name, a built-in, or ``'module:Class'``
    (:meth:`kvoffload.registry.Registry.get`)."""
    return POLICIES.get(name)


def available_policies() -> list[str]:
    """Names accepted by :func:`get_policy_class` (besides ``'module:Class'``)."""
    return POLICIES.names()
