"""Exception classes raised by kvoffload.

Every error the package raises on bad input derives from :class:`KVOffloadError` *and* from
the builtin exception an engine author would catch anyway (``ValueError``/``TypeError``/
``RuntimeError``), so ``except ValueError`` keeps working.

This module imports nothing from the rest of the package: every subpackage may use it, for the
exceptions and for :func:`check_int`, the one integer-argument check they all share.
"""

from __future__ import annotations

from numbers import Integral

__all__ = [
    "KVOffloadError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyStateError",
    "ReadOnlyError",
    "BackendUnavailableError",
    "TransferError",
    "StreamCaptureError",
    "check_int",
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
    """An explicitly requested kernel backend cannot run in this environment."""


class TransferError(KVOffloadError, RuntimeError):
    """A transfer could not be set up (the worker reports run-time failures as ``success=False``)."""


def check_int(value: object, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python int, or a typed error naming ``name``.

    Accepts ``int`` and numpy integers; rejects ``bool`` (``True`` is not 1 here), floats and
    strings with :class:`InvalidTypeError`, and values below ``minimum`` with
    :class:`InvalidArgumentError`.
    """
    if type(value) is int:  # the common case, ~10x cheaper than the ABC check below
        v = value
    elif isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    else:
        v = int(value)
    if minimum is not None and v < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {v}")
    return v


class StreamCaptureError(TransferError):
    """A transfer was submitted while the current CUDA stream was capturing a CUDA graph."""
