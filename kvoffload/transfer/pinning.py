"""Page-locking a :class:`~kvoffload.transfer.pin_plan.RegisterPlan`: the ``cudaHostRegister``
calls, their rollback, and the background thread that makes the rest of a pool usable after
its first chunk.

:class:`Pinning` registers the plan's ranges in ascending order and publishes, after each, how
many rows are registered (:attr:`Pinning.rows`: a plain int, read without a lock).

* :meth:`~Pinning.register_now` registers the first chunk (or all of it) on the calling thread;
  a failure undoes every registration of the plan and raises
  :class:`~kvoffload.errors.TransferError` naming the size.
* :meth:`~Pinning.start` registers the rest on a daemon thread, in ascending order, with the
  caller's CUDA device current. A failure there stops the thread and is kept:
  :meth:`~Pinning.check` and :meth:`~Pinning.wait_rows` raise it from then on. The thread undoes
  nothing itself -- transfers may be using the rows registered so far; the owner calls
  :meth:`~Pinning.unregister` once none does.
* :meth:`~Pinning.unregister` stops the thread (waiting for the registration in progress, one
  range at most), then unregisters every range registered. Idempotent.

A failed registration's error is also cleared from the CUDA runtime's per-thread last error, so
that no later, unrelated CUDA call reports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from typing import Any

from kvoffload.errors import TransferError
from kvoffload.transfer.pin_plan import RegisterPlan

logger = logging.getLogger(__name__)

__all__ = ["Pinning", "REGISTER_FLAGS", "cuda_ok", "runtime_library"]

#: cudaHostRegisterPortable | cudaHostRegisterMapped: usable from every CUDA context, and mapped
#: into the device address space (with UVA the device address equals the host address).
REGISTER_FLAGS = 0x01 | 0x02


def cuda_ok(rc: Any) -> bool:
    """Whether a CUDA runtime return code (an int or a ``cudaError_t`` enum) is success."""
    try:
        return int(rc) == 0
    except (TypeError, ValueError):
        return str(rc).rsplit(".", 1)[-1].lower() == "success"


def runtime_library() -> Any:
    """The CUDA runtime library this process already loaded (through torch), or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
    return None


def _clear_last_error(cudart: Any) -> None:
    """Drop the calling thread's last CUDA error (a failed registration sets it)."""
    get = getattr(cudart, "cudaGetLastError", None)
    if get is None:
        lib = runtime_library()
        get = getattr(lib, "cudaGetLastError", None) if lib is not None else None
    if get is not None:
        try:
            get()
        except Exception:  # noqa: BLE001 - best effort
            pass


class Pinning:
    """The registrations of one pool's plan.

    Args:
        plan: what to register.
        cudart: the CUDA runtime (``torch.cuda.cudart()``), kept for every call, the background
            thread's and the unregistrations included.
        device: a context manager making the pool's CUDA device current (entered on the background
            thread, so that it registers in that device's context), or None.
        what: how logs and errors name the pool (``"a host pool of N bytes"``).

    Attributes:
        rows: rows ``[0, rows)`` are registered (read by any thread without a lock).
        plan: the plan.
    """

    def __init__(self, plan: RegisterPlan, cudart: Any, device: Any = None, what: str = "a host pool") -> None:
        self.plan = plan
        self.rows = 0
        self._cudart = cudart
        self._device = device
        self._what = what
        self._done = 0  # registrations made
        self._registered: list[int] = []  # their start addresses, in order
        self._cond = threading.Condition()
        self._error: str | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    @property
    def done(self) -> bool:
        """Every range of the plan is registered."""
        return self._done == len(self.plan)

    @property
    def registered_bytes(self) -> int:
        """Bytes registered so far."""
        return int(self.plan.sizes[: self._done].sum())

    def _register(self, i: int) -> str | None:
        """Register range ``i``; None, or why it failed."""
        ptr, size = int(self.plan.starts[i]), int(self.plan.sizes[i])
        try:
            rc = self._cudart.cudaHostRegister(ptr, size, REGISTER_FLAGS)
        except Exception as exc:  # noqa: BLE001 - a runtime that raises instead of returning
            rc = f"{type(exc).__name__}: {exc}"
        if not cuda_ok(rc):
            _clear_last_error(self._cudart)
            return f"cudaHostRegister(0x{ptr:x}, {size} bytes) returned {rc}"
        with self._cond:
            self._registered.append(ptr)
            self._done = i + 1
            self.rows = int(self.plan.rows[i])
            self._cond.notify_all()
        return None

    def _failure(self, i: int, why: str) -> str:
        p = self.plan
        return (
            f"cannot pin {self._what} ({p.nbytes} bytes to register in {len(p)} registration(s) of at most "
            f"{int(p.sizes.max())} bytes): registration {i + 1} of {len(p)} failed: {why}"
        )

    def register_now(self, count: int | None = None) -> None:
        """Register the plan's first ``count`` ranges (None: all) on this thread.

        Raises:
            TransferError: a registration failed; every registration of the plan is undone.
        """
        stop = len(self.plan) if count is None else min(count, len(self.plan))
        for i in range(self._done, stop):
            why = self._register(i)
            if why is not None:
                released = self.registered_bytes
                self.unregister()
                raise TransferError(f"{self._failure(i, why)}; the {released} bytes registered before were released")

    def start(self) -> None:
        """Register the remaining ranges on a background thread (no-op when none remain)."""
        if self.done or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kvoffload-pinning", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._device if self._device is not None else contextlib.nullcontext():
                for i in range(self._done, len(self.plan)):
                    if self._stop:
                        return
                    why = self._register(i)
                    if why is not None:
                        self._fail(self._failure(i, why))
                        return
        except BaseException as exc:  # noqa: BLE001 - whatever stops the thread surfaces to the owner
            self._fail(self._failure(self._done, f"{type(exc).__name__}: {exc}"))
            return
        logger.info("%s: %s page-locked in %.2f s", self._what, self.plan.describe(), time.perf_counter() - self._t0)

    def _fail(self, message: str) -> None:
        logger.error("%s (background pinning stopped)", message)
        with self._cond:
            self._error = message
            self._cond.notify_all()

    def check(self) -> int:
        """Rows registered so far.

        Raises:
            TransferError: background pinning failed (raised on every call from then on).
        """
        if self._error is not None:
            raise TransferError(self._error)
        return self.rows

    def wait_rows(self, rows: int, timeout: float | None = None) -> bool:
        """Block until rows ``[0, rows)`` are registered; False if ``timeout`` seconds passed first.

        Raises:
            TransferError: background pinning failed, or stopped (:meth:`unregister`) before
                registering them.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.rows < rows:
                if self._error is not None:
                    raise TransferError(self._error)
                if self._stop or self._thread is None:
                    raise TransferError(f"{self._what}: pinning stopped with {self.rows} rows registered")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def unregister(self) -> None:
        """Stop the background thread (after the registration in progress) and unregister every
        range registered. Idempotent. The caller makes sure no transfer uses the pool."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._cond:
            ptrs, self._registered = self._registered, []
            self._done = 0
            self.rows = 0
        for ptr in reversed(ptrs):
            try:
                rc = self._cudart.cudaHostUnregister(ptr)
            except Exception as exc:  # noqa: BLE001 - the runtime is gone (interpreter exit): nothing to undo
                logger.warning("%s: cannot unregister 0x%x: %s", self._what, ptr, exc)
                continue
            if not cuda_ok(rc):
                _clear_last_error(self._cudart)
                logger.warning("%s: cudaHostUnregister(0x%x) failed: %s", self._what, ptr, rc)
