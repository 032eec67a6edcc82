"""Exception classes raised by kvoffload.

Every error the package raises on bad input derives from :class:`KVOffloadError` *and* from
the builtin exception an engine author would catch anyway (``ValueError``/``TypeError``/
``RuntimeError``), so ``except ValueError`` keeps working.

This module imports nothing from the rest of the package: every subpackage may use it. The
argument checks that raise these errors live in :mod:`kvoffload.checks`.
"""

from __future__ import annotations

__all__ = [
    "KVOffloadError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyStateError",
    "ReadOnlyError",
    "BackendUnavailableError",
    "TransferError",
    "StreamCaptureError",
    "NumaError",
]


class KVOffloadError(Exception):
    """Base class of every exception raised by kvoffload."""


class InvalidArgumentError(KVOffloadError, ValueError):
    """An argument has the right type but a wrong value (range, length, duplicates...)."""


class InvalidTypeError(KVOffloadError, TypeError):
    """An argument has the wrong type (e.g. ``str`` where ``bytes`` is expected, ``bool`` for ``int``)."""


class KeyStateError(KVOffloadError, ValueError):
    """A key is not in the state the call requires (absent, pending, not pinned...)."""


class ReadOnlyError(InvalidTypeError, AttributeError):
    """An attribute of an immutable object (e.g. a load/store spec) was assigned or deleted.

    Also an ``AttributeError``, what Python raises for read-only attributes.
    """


class BackendUnavailableError(KVOffloadError, RuntimeError):
    """An explicitly requested kernel backend cannot run in this environment, or the module of a
    ``"module:Class"`` (kernel backend or cache policy) cannot be imported."""


class TransferError(KVOffloadError, RuntimeError):
    """A transfer could not be set up (the worker reports run-time failures as ``success=False``)."""


class StreamCaptureError(TransferError):
    """A transfer was submitted while the current CUDA stream was capturing a CUDA graph."""


class NumaError(KVOffloadError, OSError):
    """A NUMA system call (``mbind``, ``get_mempolicy``, ``move_pages``) failed: an ``OSError`` whose
    ``errno`` is the call's (``ENOSYS`` without NUMA support, ``EPERM`` under seccomp, ``EFAULT`` for an
    unmapped range, ``EINVAL`` for a node the kernel refuses)."""
