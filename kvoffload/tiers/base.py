"""The tier interface: a store beneath the host pool, batched and asynchronous.

A :class:`Tier` moves whole host-pool records (one offloaded block each) between the host pool's
record array and a store (Redis, a directory...). Every method is called from one engine thread
and returns without waiting on the store (except :meth:`Tier.probe_now` and :meth:`Tier.load_now`,
which a caller uses to answer a lookup within the call, and ``end_step``'s bounded wait); the
bytes move on the tier's own threads:

* :meth:`Tier.lookup` answers per key from verdicts already known and queues the rest, which
  answer :data:`LOOKUP_RETRY` until their probe returns; :meth:`Tier.end_step` sends the step's
  queued keys as **one** probe batch (one pipelined round trip) to the tier's lookup thread.
* :meth:`Tier.submit_store` / :meth:`Tier.submit_load` start jobs that copy records to / from the
  store; :meth:`Tier.get_finished` reports them with per-key success. The lookup thread hands
  their batches to the I/O threads (the engine thread wakes one thread, and starts none); it
  runs under ``SCHED_BATCH`` where the OS has it (:mod:`kvoffload.tiers.threads`).
* a store that cannot be reached puts the tier in back-off: lookups miss, stores are dropped
  (counted), loads fail; after the back-off the next operation reconnects.

Backends implement :meth:`Tier._probe`, :meth:`Tier._store_batch`, :meth:`Tier._load_batch` and
:meth:`Tier._close_backend`, called on tier threads (``_load_batch`` also on the engine thread,
by :meth:`Tier.load_now`), and report what they see (values absent, rejected, removed...) through
:attr:`Tier.counters` (:class:`TierCounters`).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np

from kvoffload.checks import check_int
from kvoffload.errors import InvalidArgumentError
from kvoffload.tiers.args import check_keys, check_records, check_slots, check_tier_options
from kvoffload.tiers.counters import TierCounters
from kvoffload.tiers.health import Health, TierUnavailable
from kvoffload.tiers.jobs import Job, JobBook
from kvoffload.tiers.namespace import TierNamespace
from kvoffload.tiers.record import IntegrityKeys, RecordCodec
from kvoffload.tiers.step_probe import Probe, StepProbe
from kvoffload.tiers.threads import LookupThread
from kvoffload.tiers.types import DROPPED, FAILED, PRESENT, STORED, TierJobResult, TierStats
from kvoffload.tiers.verdicts import Verdicts
from kvoffload.tiers.workers import LOAD, STORE, IOThreads

__all__ = ["Tier", "STORED", "PRESENT", "FAILED", "DROPPED"]

_R = TypeVar("_R")


class Tier(ABC):
    """A secondary KV tier over a host pool's records (see the module docstring and contract §8).

    Args:
        records: the host pool's records, a writable C-contiguous ``np.uint8`` array or 2-D
            ``memoryview`` of shape ``(num_slots, record_bytes)``; slot ``i`` is row ``i``.
        namespace: what the bytes depend on; only values with the same fingerprint are used.
        name: the tier's name in logs and reports.
        integrity_key: optional shared secret (>= 16 bytes, ``bytes`` or ``str``), or a list of
            them: values carry an HMAC-SHA256 under the first, values without a MAC that one of
            them verifies are rejected (not deleted); see :class:`RecordCodec`.
        io_threads: threads moving bytes (each with its own connection / file handles).
        batch_keys: keys per store/load task (one pipeline / one thread's batch).
        max_pending_write_bytes: record bytes of accepted, unfinished stores above which new
            stores are dropped (back-pressure).
        lookup_ttl_steps: engine steps a probed verdict is reused before the key is probed again.
        probe_wait: seconds :meth:`end_step` waits for probe answers while a key a lookup
            answered ``LOOKUP_RETRY`` is unprobed (0: never waits; see :meth:`end_step`).
        defer_hit_rate: least share of recently probed keys the store held (a moving average,
            :attr:`hit_rate`) for a key without a verdict to answer ``LOOKUP_RETRY`` (the request
            waits for its probe); below it such keys answer ``LOOKUP_MISS`` at once and are
            probed all the same, so a tier that finds nothing slows no request, and deferring
            resumes as soon as probes find keys again. 0: always defer.
        backoff_initial: first back-off after the store is unreachable, in seconds.
        backoff_max: longest back-off (it doubles up to this), in seconds.

    ``counters`` (:class:`TierCounters`) holds the tier's cumulative counters; ``stats()`` copies them.
    A backend found by URL scheme (:mod:`kvoffload.tiers.registry`) turns its URL into
    constructor keywords with :meth:`options_from_url`.
    """

    #: ``"LOCAL"`` (one machine's store) or ``"REMOTE"`` (shared over the network): what the vLLM
    #: adapter reports as the tier's locality unless configured.
    locality: ClassVar[str] = "REMOTE"

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        """The constructor keywords ``url`` stands for, checked (nothing connects); by default
        ``{"url": url}``."""
        return {"url": url}

    def __init__(
        self,
        records: np.ndarray | memoryview,
        namespace: TierNamespace,
        *,
        name: str,
        integrity_key: IntegrityKeys = None,
        io_threads: int = 4,
        batch_keys: int = 4,
        max_pending_write_bytes: int = 256 << 20,
        lookup_ttl_steps: int = 8,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        probe_wait: float = 0.0005,
        defer_hit_rate: float = 0.05,
    ) -> None:
        self.records = check_records(records)
        if not isinstance(namespace, TierNamespace):
            raise InvalidArgumentError(f"namespace must be a TierNamespace, got {type(namespace).__name__}")
        check_tier_options(
            io_threads,
            batch_keys,
            max_pending_write_bytes,
            lookup_ttl_steps,
            backoff_initial,
            backoff_max,
            probe_wait,
            defer_hit_rate,
        )
        self.name = name
        self._lock = threading.Lock()  # the counters' and the jobs'
        self.counters = TierCounters(name, self._lock)
        self.io_threads = io_threads
        self.namespace = namespace
        self.fingerprint = namespace.fingerprint()
        self.num_slots, self.record_bytes = (int(d) for d in self.records.shape)
        self.codec = RecordCodec(self.fingerprint, self.record_bytes, integrity_key)
        self._batch_keys = batch_keys
        self._max_pending_write = max_pending_write_bytes
        self._health = Health(name, backoff_initial, backoff_max)
        self._book = JobBook(self._lock)
        self._closed = False
        self._step = StepProbe(
            Verdicts(lookup_ttl_steps, float(defer_hit_rate)),
            self._health,
            float(probe_wait),
            self.counters,
            self._probe,
            self._probe_now,
            self._hand_probe,
        )
        self._pool = IOThreads(io_threads, f"kvoffload-tier-{name}")
        self._lookup = LookupThread(f"kvoffload-tier-{name}-lookup", self._pool, self._answer_probe)

    # ------------------------------------------------------------------ engine-thread API
    def lookup(self, keys: Sequence[bytes]) -> np.ndarray:
        """Per key :data:`LOOKUP_HIT` / :data:`LOOKUP_MISS` / :data:`LOOKUP_RETRY` (``np.int8``), never blocking.

        A key without a fresh verdict is queued for the next :meth:`end_step` and answers
        ``LOOKUP_RETRY`` until its probe has returned (``LOOKUP_MISS`` while :attr:`hit_rate` is
        below ``defer_hit_rate``); while the tier is in back-off new keys miss.
        """
        return self._step.lookup(check_keys(keys, "keys"))

    def end_step(self) -> None:
        """Send this step's queued lookups as one probe batch; call once per engine step.

        While a key answered ``LOOKUP_RETRY`` (a request waits on it) has not been probed, wait
        for the answers up to ``probe_wait`` seconds, so a request deferred on the probe is
        answered at the engine's next step. A backend that can (:meth:`_probe_now`: a standalone
        Redis server) sends the batch and reads its answer on this thread; otherwise the lookup
        thread probes and this thread sleeps on its answer.
        """
        self._step.end_step()

    def probe_now(self, keys: Sequence[bytes]) -> np.ndarray:
        """:meth:`lookup`, with the keys it queues probed at once on this thread when the backend can
        (:meth:`_probe_now`) and the tier is not in back-off: one round trip of its own, waited for
        at most ``probe_wait`` (a late reply is read by the lookup thread, the keys answer
        ``LOOKUP_RETRY`` until then; a backend that cannot sends nothing: the step's batch does)."""
        return self._step.probe_now(check_keys(keys, "keys"))

    def load_now(self, keys: Sequence[bytes], slots: Sequence[int] | np.ndarray) -> list[bool]:
        """Copy the values of ``keys`` into the records in ``slots`` on this thread (blocking: one
        pipelined read, up to the store's timeouts); per key whether it arrived (as
        :meth:`submit_load`'s jobs, counted the same). All fail at once while in back-off."""
        if self._closed:
            raise InvalidArgumentError(f"tier {self.name} is closed")
        keys = check_keys(keys, "keys")
        ok = self._load(keys, check_slots(slots, "slots", len(keys), self.num_slots))
        self._step.verdicts.finished(TierJobResult.loaded_now(keys, ok))
        return ok

    @property
    def hit_rate(self) -> float:
        """The share of recently probed keys the store held (a moving average over keys; 1 before
        any probe): below ``defer_hit_rate`` lookups of keys without a verdict miss at once."""
        return self._step.verdicts.hit_rate

    def take_answered(self) -> list[bytes]:
        """The keys whose probe has returned since the last call (their verdicts are applied first),
        so a caller can tell when a ``LOOKUP_RETRY`` may have changed. Keys are recorded from the
        first call on."""
        return self._step.take_answered()

    def submit_store(self, job_id: int, keys: Sequence[bytes], slots: Sequence[int] | np.ndarray) -> None:
        """Copy the records in ``slots`` to the tier under ``keys`` (parallel), asynchronously.

        The slots must stay unchanged until the job is reported by :meth:`get_finished`. Keys
        already in the tier are left as they are (reported ok). When the tier is in back-off or
        its write queue is full the whole job is dropped at once (reported failed, counted in
        ``dropped_writes``).
        """
        job_id, keys, slots = self._check_job(job_id, keys, slots)
        if not keys:
            self._finish_empty(job_id, "store")
            return
        nbytes = len(keys) * self.record_bytes
        with self._lock:
            reason = "unreachable" if self._health.is_down() else None
            if reason is None and self._book.pending_write_bytes + nbytes > self._max_pending_write:
                reason = "write queue full"
            if reason is not None:
                self.counters.dropped(len(keys), reason)
                self._book.finish_now(job_id, "store", keys, False)
                return
            self._book.pending_write_bytes += nbytes
            job = self._book.jobs[job_id] = Job(job_id, "store", keys, len(keys), self._batch_keys)
        self._dispatch(STORE, self._run_store, job, slots)

    def submit_load(self, job_id: int, keys: Sequence[bytes], slots: Sequence[int] | np.ndarray) -> None:
        """Copy the values of ``keys`` into the records in ``slots``, asynchronously.

        A key that is absent, rejected (counted by kind; see :class:`TierStats`) or unreachable is a
        failed key; its slot's bytes are then unspecified and must not be used.
        """
        job_id, keys, slots = self._check_job(job_id, keys, slots)
        if not keys:
            self._finish_empty(job_id, "load")
            return
        with self._lock:
            job = self._book.jobs[job_id] = Job(job_id, "load", keys, len(keys), self._batch_keys)
        self._dispatch(LOAD, self._run_load, job, slots)

    def get_finished(self) -> list[TierJobResult]:
        """The jobs finished since the last call (also updates lookup verdicts from them)."""
        done = self._book.take_finished()
        for res in done:
            self._step.verdicts.finished(res)
        return done

    def drain(self, timeout: float | None = None) -> bool:
        """Block until every submitted job and probe has finished; False on timeout.

        Results stay queued for :meth:`get_finished`. Not for the engine's step loop.
        """
        return self._book.wait_idle(timeout)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Probe ``keys`` now on the calling thread (blocking; tools and tests, not the engine)."""
        keys = check_keys(keys, "keys")
        try:
            return self._probe(keys)
        except TierUnavailable:
            return [False] * len(keys)

    def take_removed(self) -> list[bytes]:
        """The keys the store removed since the last call, as the tier learned of them (a Redis
        tier with ``removal_events``: evicted, expired, deleted by any client; a disk tier with
        ``removal_events``: evicted by its budget; both: values a load rejected); each key once per
        removal. Their cached verdicts become misses."""
        out = self.counters.take_removed()
        self._step.verdicts.forget(out)
        return out

    def check_store(self) -> None:
        """One round trip to the store, for a check at start: returns once it answers. Raises
        InvalidArgumentError when the configuration is wrong (retrying will not help) and
        :class:`~kvoffload.tiers.health.TierUnavailable` when the store does not answer."""
        self._check_store()

    def _check_store(self) -> None:  # noqa: B027 - optional hook
        """The backend's start-up check (see :meth:`check_store`); by default nothing to check."""

    def stats(self) -> TierStats:
        """A snapshot of the tier's cumulative counters."""
        return self.counters.snapshot()

    @property
    def serving(self) -> bool:
        """False while the tier backs off a store it could not reach (its calls then skip the
        store: lookups miss, stores are dropped), True otherwise."""
        return not self._health.is_down()

    def close(self) -> None:
        """Wait for submitted work, stop the threads and release connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.drain()
        self._lookup.stop()
        self._pool.shutdown()
        self._close_backend()

    def __enter__(self) -> Tier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ backend hooks
    @abstractmethod
    def _probe(self, keys: list[bytes]) -> list[bool]:
        """Which ``keys`` the store holds, in one round trip; raise TierUnavailable if unreachable."""

    def _probe_now(self, keys: list[bytes], wait: float) -> list[bool] | Callable[[], list[bool]] | None:
        """Probe ``keys`` on the engine thread, waiting up to ``wait`` seconds, never connecting
        nor raising: the answers; or, sent and not answered in time, a function the lookup thread
        calls to read them (may raise TierUnavailable); or None when not tried (the lookup thread
        then calls :meth:`_probe`). By default None."""
        return None

    @abstractmethod
    def _store_batch(self, keys: list[bytes], slots: np.ndarray) -> list[int]:
        """Store ``records[slots]`` under ``keys``; per key STORED / PRESENT / FAILED / DROPPED."""

    @abstractmethod
    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        """Load ``keys`` into ``records[slots]`` after :meth:`RecordCodec.check`; per key ok.

        Absent values are counted in ``absent`` (``self.counters.count("absent")``), rejected ones
        with :meth:`TierCounters.rejected`; a rejected value is deleted when ``delete`` says so, and only
        then (never an absent value, nor one that could not be read).
        """

    @abstractmethod
    def _close_backend(self) -> None:
        """Release connections / files."""

    # ------------------------------------------------------------------ internals
    def _check_job(
        self, job_id: int, keys: Sequence[bytes], slots: Sequence[int] | np.ndarray
    ) -> tuple[int, list[bytes], np.ndarray]:
        if self._closed:
            raise InvalidArgumentError(f"tier {self.name} is closed")
        job_id = check_int(job_id, "job_id")
        keys = check_keys(keys, "keys")
        slot_arr = check_slots(slots, "slots", len(keys), self.num_slots)
        with self._lock:
            if job_id in self._book.jobs:
                raise InvalidArgumentError(f"job_id {job_id} is already in flight on tier {self.name}")
        return job_id, keys, slot_arr

    def _dispatch(
        self, priority: int, run: Callable[[Job, int, int, np.ndarray], None], job: Job, slots: np.ndarray
    ) -> None:
        """Hand ``job``'s batches to the lookup thread, which submits them to the I/O threads."""
        self._lookup.submit((priority, run, [(job, a, b, slots[a:b]) for a, b in job.batches()]))

    def _hand_probe(self, probe: Probe) -> None:
        """A probe for the lookup thread (to send, or a late reply to read)."""
        with self._lock:
            self._book.probes_in_flight += 1
        self._lookup.probe(probe)

    def _on_lookup_thread(self, fn: Callable[[], None]) -> None:
        """Backends: run ``fn`` on the lookup thread, in turn with its probes (it must not raise)."""
        self._lookup.call(fn)

    def _answer_probe(self, probe: Probe) -> None:
        """The lookup thread: send ``probe`` (or read its late reply), and apply its answers."""
        down = probe.fresh and self._health.is_down()  # a late reply is read whatever the health
        found = None if down else self._call_backend("lookup", probe.run)
        self.counters.probe(probe.keys, found)
        self._step.answered(probe.keys, found)
        self._book.probe_done()

    def _call_backend(self, kind: str, fn: Callable[..., _R], *args: Any) -> _R | None:
        """``fn(*args)`` on a tier thread, its outcome told to the tier's health: None when the
        store is unreachable (back-off starts) or the backend raised (counted in ``errors``; a
        backend bug must not kill a tier thread)."""
        try:
            out = fn(*args)
        except TierUnavailable as exc:
            self._health.failed(exc)
            return None
        except Exception as exc:
            self.counters.error(kind, exc)
            return None
        self._health.succeeded()
        return out

    def _run_store(self, job: Job, start: int, stop: int, slots: np.ndarray) -> None:
        keys = job.keys[start:stop]
        t0 = time.perf_counter()
        dropped = self._health.is_down()
        outcome = None if dropped else self._call_backend("store", self._store_batch, keys, slots)
        if outcome is None:
            outcome = [FAILED] * len(keys)
        dt = time.perf_counter() - t0
        stored = outcome.count(STORED)
        with self._lock:
            self.counters.store_batch(outcome, dropped, dt, self.record_bytes)
            self._book.pending_write_bytes -= len(keys) * self.record_bytes
            ok = [o in (STORED, PRESENT) for o in outcome]
            self._book.record(job, start, ok, stored * self.record_bytes)

    def _load(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        """One load batch on this thread, counted; per key ok."""
        t0 = time.perf_counter()
        got = None if self._health.is_down() else self._call_backend("load", self._load_batch, keys, slots)
        ok = [False] * len(keys) if got is None else got
        dt = time.perf_counter() - t0
        with self._lock:
            self.counters.load_batch(sum(ok), len(keys), dt, self.record_bytes)
        return ok

    def _run_load(self, job: Job, start: int, stop: int, slots: np.ndarray) -> None:
        ok = self._load(job.keys[start:stop], slots)
        with self._lock:
            self._book.record(job, start, ok, sum(ok) * self.record_bytes)

    def _finish_empty(self, job_id: int, kind: Literal["store", "load"]) -> None:
        """A job without keys: finished (successfully) at submission."""
        with self._lock:
            self._book.finish_now(job_id, kind, [], True)
