"""The admission lookup of a waiting request: what it can load from the offloaded tier, or a deferral.

:class:`AdmissionLookup` is a part that :class:`~kvoffload.engine.scheduler.scheduler.OffloadingScheduler`
holds; it answers the scheduler's ``get_num_new_matched_tokens`` (whose docstring is the contract):
it checks the arguments, looks the request's keys up
(:func:`~kvoffload.engine.scheduler.matching.find_loadable_tokens`), defers the request when a key it
would load is pending or being loaded by another request, touches the keys it keeps, and leaves the
request's :class:`~kvoffload.engine.scheduler.state.LoadOffer` on its state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvoffload.engine.scheduler.config import OffloadingSchedulerConfig
from kvoffload.engine.scheduler.deferral import DeferredLookups, request_signature
from kvoffload.engine.scheduler.matching import find_loadable_tokens, load_ranges, make_fetch, touch_request
from kvoffload.engine.scheduler.state import LoadOffer, RequestOffloadState
from kvoffload.engine.scheduler.validation import check_count, check_request
from kvoffload.errors import InvalidArgumentError

__all__ = ["AdmissionLookup"]


class AdmissionLookup:
    """``get_num_new_matched_tokens`` of an :class:`~kvoffload.engine.scheduler.scheduler.OffloadingScheduler`.

    Args:
        config: the scheduler's configuration.
        state_of: the scheduler's state of a request, created on first use.
        loading_keys: the scheduler's keys being loaded (key -> number of load jobs), read only.
        deferred: the scheduler's deferred lookups (updated here), or None without ``take_resolved``.
    """

    def __init__(
        self,
        config: OffloadingSchedulerConfig,
        state_of: Callable[[Any], RequestOffloadState],
        loading_keys: dict[bytes, int],
        deferred: DeferredLookups | None,
    ) -> None:
        self.config = config
        self._groups = config.groups
        self._min_load_tokens = config.max_offloaded_block_size
        self._state_of = state_of
        self._loading_keys = loading_keys
        self._deferred = deferred

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int, manager: Any
    ) -> tuple[int | None, bool]:
        """:meth:`~kvoffload.engine.scheduler.scheduler.OffloadingScheduler.get_num_new_matched_tokens`
        (its docstring is the contract), looking up and touching keys in ``manager`` (the
        scheduler's ``manager`` at the time of the call)."""
        n_comp = check_count(num_computed_tokens, "num_computed_tokens")
        num_tokens = check_request(request, "request")
        if n_comp > num_tokens:
            raise InvalidArgumentError(f"num_computed_tokens ({n_comp}) exceeds request.num_tokens ({num_tokens})")
        for g in self._groups:
            if n_comp % g.gpu_block_size:
                raise InvalidArgumentError(
                    f"num_computed_tokens ({n_comp}) must be a multiple of group {g.group_idx}'s "
                    f"gpu_block_size ({g.gpu_block_size})"
                )
        st = self._state_of(request)
        if st.load_job_id is not None:
            return None, False  # its own load is still in flight
        st.offer = None
        deferred = self._deferred
        if deferred is not None:  # a repeat of a deferred lookup: look up again only if a key it waits on changed
            sig = request_signature(request, n_comp, num_tokens)
            if deferred.still_deferred(st.req_id, sig):
                return None, False
            deferred.forget(st.req_id)
        st.sync_keys()
        hbs = self.config.effective_hash_block_size
        max_end = min(num_tokens - 1 if self.config.has_sliding_window else num_tokens, len(request.block_hashes) * hbs)
        st.update_keys(num_tokens)
        end = n_comp
        if max_end - n_comp >= self._min_load_tokens:
            fetch, batched = make_fetch(manager, st.req_context)
            waits: list[Any] | None = [] if deferred is not None else None
            found = find_loadable_tokens(
                self.config, [gs.keys for gs in st.groups], n_comp, max_end, fetch, batched, pending=waits
            )
            if found is None:
                if deferred is not None:
                    deferred.defer(st.req_id, sig, waits or ())
                return None, False
            if found - n_comp >= self._min_load_tokens:
                end = found
        ranges = load_ranges(self.config, n_comp, end)
        if end > n_comp and self._loading_keys:
            for (first, last), gcfg, gs in zip(ranges, self._groups, st.groups, strict=False):
                f = gcfg.block_size_factor
                for key in gs.keys[first // f : last // f]:
                    if key in self._loading_keys:
                        if deferred is not None:
                            deferred.defer(st.req_id, sig, [key])
                        return None, False
        touch_request(self.config, st, end, manager)
        if end <= n_comp:
            return 0, False
        st.offer = LoadOffer(n_comp, end - n_comp, ranges)
        return end - n_comp, True
