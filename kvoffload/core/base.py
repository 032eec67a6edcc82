"""Core types of kvoffload: keys, request context, load/store specs, the manager contract.

These follow vLLM's KV-offload subsystem (``vllm/v1/kv_offload/base.py``, the "per-key +
ReqContext" interface) so that an engine can swap kvoffload in:

* an :data:`OffloadKey` is ``block_hash + group_idx.to_bytes(4, "big")`` -- plain ``bytes``,
  hashable and not tracked by the garbage collector (tuples would be);
* every request-facing method of :class:`OffloadingManager` takes the request's
  :class:`ReqContext`;
* a :class:`LoadStoreSpec` tells a transfer worker where blocks live on one medium.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NewType, TypeVar

import numpy as np

from kvoffload.checks import check_int, id_array
from kvoffload.core.lookup_code import lookup_code
from kvoffload.errors import InvalidArgumentError, InvalidTypeError, ReadOnlyError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

__all__ = [
    "OffloadKey",
    "make_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "validate_keys",
    "ReqContext",
    "workload_tag",
    "check_req_context",
    "LoadStoreSpec",
    "BlockIDsLoadStoreSpec",
    "CPULoadStoreSpec",
    "GPULoadStoreSpec",
    "PrepareStoreOutput",
    "OffloadingEvent",
    "OffloadingManager",
]

#: A block hash followed by the KV-cache group index as 4 big-endian unsigned bytes.
OffloadKey = NewType("OffloadKey", bytes)

_GROUP_IDX_BYTES = 4
_MAX_GROUP_IDX = 2**32 - 1


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack a block hash and a KV-cache group index into an :data:`OffloadKey`.

    Args:
        block_hash: the (chained) hash of the block, any length, ``bytes``.
        group_idx: KV-cache group index, ``0 <= group_idx <= 2**32 - 1``.

    Returns:
        ``block_hash + group_idx.to_bytes(4, "big")``.
    """
    if block_hash.__class__ is not bytes:
        raise InvalidTypeError(_not_bytes("block_hash", block_hash))
    g = check_int(group_idx, "group_idx")
    if not 0 <= g <= _MAX_GROUP_IDX:
        raise InvalidArgumentError(f"group_idx must be in [0, 2**32 - 1], got {g}")
    return OffloadKey(block_hash + g.to_bytes(_GROUP_IDX_BYTES, "big", signed=False))


def _not_bytes(name: str, value: object) -> str:
    """The message for ``value`` that is not exactly ``bytes``."""
    if isinstance(value, np.bytes_):
        return (
            f"{name} must be bytes, got numpy.bytes_ {value!r}: numpy's fixed-width bytes drop trailing NUL "
            "bytes (every group-0 key ends in four), so it may not be the same key; pass plain bytes objects"
        )
    if isinstance(value, bytes):
        return f"{name} must be exactly bytes, got the bytes subclass {type(value).__name__}"
    return f"{name} must be bytes (an OffloadKey), got {type(value).__name__}"


def check_key_batch(keys: object, name: str = "keys") -> None:
    """Reject what cannot be a batch of keys: a single key or str, and numpy bytes/str arrays.

    A numpy ``S``-dtype array (what ``np.array(list_of_keys)`` makes) drops the trailing NUL
    bytes of its items, so its keys are not the caller's keys.
    """
    if isinstance(keys, (bytes, str, bytearray, memoryview)):
        raise InvalidTypeError(f"{name} must be a collection of bytes keys, not a single {type(keys).__name__}")
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "SU":
        raise InvalidTypeError(
            f"{name} must be a collection of bytes keys, got a numpy array of dtype {keys.dtype}: numpy's "
            "fixed-width bytes drop trailing NUL bytes (every group-0 key ends in four); pass a list of bytes"
        )


def _check_key(key: object) -> bytes:
    if key.__class__ is not bytes:
        raise InvalidTypeError(_not_bytes("key", key))
    if len(key) < _GROUP_IDX_BYTES:
        raise InvalidArgumentError(f"key must be at least {_GROUP_IDX_BYTES} bytes long, got {len(key)}")
    return key


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash of ``key``: all but its last 4 bytes."""
    return _check_key(key)[:-_GROUP_IDX_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-cache group index of ``key``: its last 4 bytes, big-endian unsigned."""
    return int.from_bytes(_check_key(key)[-_GROUP_IDX_BYTES:], "big", signed=False)


def validate_keys(
    keys: Iterable[OffloadKey], name: str = "keys", *, allow_duplicates: bool = False
) -> list[OffloadKey]:
    """Check a batch of keys before any state changes and return it as a list.

    Raises:
        InvalidTypeError: ``keys`` is a bare ``bytes``/``str`` (a single key, not a batch), a
            numpy bytes array, not iterable, or one of its items is not exactly ``bytes`` (a
            ``bytes`` subclass such as ``numpy.bytes_`` is refused: numpy drops trailing NULs).
        InvalidArgumentError: a key appears twice and ``allow_duplicates`` is False.
    """
    check_key_batch(keys, name)
    try:
        out = list(keys)
    except TypeError as exc:
        raise InvalidTypeError(f"{name} must be an iterable of bytes keys, got {type(keys).__name__}") from exc
    for i, k in enumerate(out):
        if k.__class__ is not bytes:
            raise InvalidTypeError(_not_bytes(f"{name}[{i}]", k))
    if not allow_duplicates and len(set(out)) != len(out):
        seen: set[bytes] = set()
        dup = next(k for k in out if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise InvalidArgumentError(f"{name} contains the key {dup!r} more than once")
    return out  # type: ignore[return-value]


@dataclass
class ReqContext:
    """Per-request context passed to every request-facing manager call.

    Attributes:
        req_id: the engine's request id ("" when unknown).
        kv_transfer_params: the request's ``kv_transfer_params`` (e.g. ``max_offload_tokens``).
        workload: an optional workload tag (e.g. ``"text/2"``: request type and turn) a policy
            may use; vLLM requests set it as ``kv_transfer_params["kv_workload"]``
            (:func:`workload_tag`). None (the default) costs nothing.
        key_positions: an optional ``key -> token position`` map (the end token of the block a
            key names), read through :meth:`get_offload_key_position` by policies that rank a
            request's blocks by position (``request_lru``); vLLM's context has the same method.

    Per-request scratch space for policies (:meth:`get_state` / :meth:`set_state`, one value per
    type) works as on vLLM's ``ReqContext``.
    """

    req_id: str = ""
    kv_transfer_params: dict[str, Any] | None = None
    workload: str | None = None
    key_positions: dict[bytes, int] | None = None
    _state: dict[type, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def get_offload_key_position(self, key: bytes) -> int | None:
        """The token position recorded for ``key`` in :attr:`key_positions`, or None."""
        return None if self.key_positions is None else self.key_positions.get(key)

    def get_state(self, cls: type[_T]) -> _T | None:
        """The value of type ``cls`` stored with :meth:`set_state`, or None."""
        return None if self._state is None else self._state.get(cls)

    def set_state(self, val: Any) -> None:
        """Keep ``val`` for this request (one value per type, replacing an earlier one)."""
        if self._state is None:
            self._state = {}
        self._state[type(val)] = val


def workload_tag(req_context: object) -> str | None:
    """The workload tag of a request context: :attr:`ReqContext.workload`, else a ``str``
    ``kv_transfer_params["kv_workload"]`` (vLLM's own context), else None."""
    tag = getattr(req_context, "workload", None)
    if tag is not None:
        return tag if isinstance(tag, str) else None
    params = getattr(req_context, "kv_transfer_params", None)
    if isinstance(params, dict):
        tag = params.get("kv_workload")
        return tag if isinstance(tag, str) else None
    return None


def check_req_context(req_context: object) -> None:
    """Raise :class:`InvalidTypeError` unless ``req_context`` is a request context.

    Accepted: a :class:`ReqContext` (or subclass), or an engine's own context object with a
    ``str`` ``req_id`` (vLLM's ``ReqContext``, which an engine may pass through unchanged).
    Hot paths test ``req_context.__class__ is ReqContext`` themselves and call this otherwise.
    """
    if isinstance(req_context, ReqContext):
        return
    if isinstance(req_context, type) or getattr(req_context, "req_id", None).__class__ is not str:
        raise InvalidTypeError(
            f"req_context must be a ReqContext (or an object with a str req_id), "
            f"got {type(req_context).__name__} {req_context!r:.80}"
        )


class LoadStoreSpec(ABC):
    """Where a transfer worker reads or writes blocks, on one medium."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """The medium's name, e.g. ``"GPU"`` or ``"CPU"``."""


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    """A spec given by block ids on its medium, kept as a 1-D ``np.int64`` array.

    Specs are immutable once built: their arrays are private read-only copies, and an attribute,
    once set, cannot be replaced or deleted (:class:`~kvoffload.errors.ReadOnlyError`). The
    constructor converts (integers only); the ids' ranges (non-negative, below the medium's size)
    are checked once, by the transfer worker that receives the spec.

    Args:
        block_ids: integer block ids (any iterable or integer numpy array).
    """

    def __init__(self, block_ids: Iterable[int] | np.ndarray) -> None:
        self.block_ids: np.ndarray = id_array(block_ids, "block_ids")

    def __setattr__(self, name: str, value: object) -> None:
        if name in self.__dict__:
            raise ReadOnlyError(
                f"{type(self).__name__}.{name} cannot be replaced: load/store specs are immutable (build a new one)"
            )
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise ReadOnlyError(f"{type(self).__name__}.{name} cannot be deleted: load/store specs are immutable")

    def __len__(self) -> int:
        return int(self.block_ids.size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()!r})"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Blocks in the host pool: ``block_ids`` are CPU slot ids, one per offloaded block."""

    @staticmethod
    def medium() -> str:
        return "CPU"


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Blocks in the GPU paged KV cache, for several KV-cache groups.

    Args:
        block_ids: GPU block ids ordered by group: the first ``group_sizes[0]`` belong to
            group 0, the next ``group_sizes[1]`` to group 1, and so on.
        group_sizes: number of GPU blocks of each group; ``sum(group_sizes) == len(block_ids)``.
        block_indices: ``block_indices[g]`` is the index, within the request, of the first GPU
            block of group ``g``. With ``block_size_factor`` GPU blocks per offloaded block,
            the worker skips ``block_indices[g] % block_size_factor`` sub-blocks of the first
            offloaded block of group ``g``. Defaults to all zeros.
    """

    def __init__(
        self,
        block_ids: Iterable[int] | np.ndarray,
        group_sizes: Sequence[int] | np.ndarray | None = None,
        block_indices: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        super().__init__(block_ids)
        n = len(self.block_ids)
        sizes = id_array([n] if group_sizes is None else group_sizes, "group_sizes")
        if int(sizes.sum()) != n:
            raise InvalidArgumentError(
                f"group_sizes must sum to len(block_ids)={n}, got sum {int(sizes.sum())} ({sizes.tolist()})"
            )
        indices = id_array(
            np.zeros(len(sizes), dtype=np.int64) if block_indices is None else block_indices, "block_indices"
        )
        if len(indices) != len(sizes):
            raise InvalidArgumentError(
                f"block_indices must have one entry per group ({len(sizes)}), got {len(indices)}"
            )
        self.group_sizes: np.ndarray = sizes
        self.block_indices: np.ndarray = indices

    @staticmethod
    def medium() -> str:
        return "GPU"

    def group_block_ids(self, group: int) -> np.ndarray:
        """The GPU block ids of group ``group`` (a view into ``block_ids``)."""
        start = int(self.group_sizes[:group].sum())
        return self.block_ids[start : start + int(self.group_sizes[group])]

    def __repr__(self) -> str:
        return (
            f"GPULoadStoreSpec(block_ids={self.block_ids.tolist()}, group_sizes={self.group_sizes.tolist()}, "
            f"block_indices={self.block_indices.tolist()})"
        )


@dataclass
class PrepareStoreOutput:
    """Result of :meth:`OffloadingManager.prepare_store`.

    Attributes:
        keys_to_store: the keys the caller must transfer (absent ones, in call order).
        store_spec: where to write them; ``store_spec.block_ids[i]`` is the slot of
            ``keys_to_store[i]``.
        evicted_keys: keys evicted to make room, in eviction order.
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Keys that became stored (``removed=False``) or were evicted (``removed=True``) on ``medium``."""

    keys: list[OffloadKey]
    medium: str
    removed: bool


class OffloadingManager(ABC):
    """Decides which offloaded blocks live in a medium; never moves bytes itself.

    A key is *absent*, *pending* (its store is in flight: not loadable, not evictable),
    or *ready*. A ready key may be *pinned* by loads (ref count > 0: not evictable).
    Implementations must validate every argument before changing any state.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` can be loaded.

        Returns:
            True if stored and ready, False if absent, None if present but its store is
            still in flight ("retry later": the scheduler defers the request).
        """

    def lookup_batch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> np.ndarray:
        """Look up many keys at once; equivalent to calling :meth:`lookup` on each, in order.

        Returns:
            ``np.int8`` array, one code per key: :data:`~kvoffload.core.lookup_code.LOOKUP_HIT`,
            ``LOOKUP_MISS`` or ``LOOKUP_PENDING``. Implementations override this with array code.
        """
        keys = validate_keys(keys, allow_duplicates=True)
        out = np.empty(len(keys), dtype=np.int8)
        for i, k in enumerate(keys):
            out[i] = lookup_code(self.lookup(k, req_context))
        return out

    @abstractmethod
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Pin ``keys`` for loading and say where they are.

        All keys must be stored and ready (else :class:`~kvoffload.errors.KeyStateError`).
        Each block's ref count goes up by one so it cannot be evicted until
        :meth:`complete_load`. ``spec.block_ids[i]`` belongs to ``keys[i]``.
        """

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` recently used; absent keys are ignored.

        Keys come in prefix order: the FIRST key ends up the most recent, so tails age first.
        """

    @abstractmethod
    def complete_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys`` (ref count -1). An absent or unpinned key is an error."""

    @abstractmethod
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Allocate slots for the keys that are not present yet.

        Keys already present (ready or pending) are dropped. Evicts only ready, unpinned
        blocks and never a key named in this call. All-or-nothing: if room cannot be made,
        returns None and changes nothing. New blocks are pending until :meth:`complete_store`.
        An empty ``keys_to_store`` is a normal result.
        """

    @abstractmethod
    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish stores.

        success: pending keys become ready (ref count 0, evictable).
        failure: keys still pending are removed and their slots freed; ready keys are
        untouched; absent keys are ignored.
        """

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Drain the events recorded since the last call (none unless events are enabled)."""
        return ()

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the default does nothing."""
