"""Kernel backends behind one registry.

Built-in backends:

* ``"torch"``  -- pure-torch reference (:mod:`kvoffload.kernels.torch_ref`), the CPU default;
  also runs on CUDA.
* ``"triton"`` -- one Triton launch per job (:mod:`kvoffload.kernels.triton_backend`), the CUDA
  default; on CPU tensors it runs the same kernel through Triton's interpreter.
* ``"page_loop"`` -- CUDA only: one async copy per page, the baseline engines use today
  (:mod:`kvoffload.kernels.page_loop_backend`).

Choose with :func:`get_backend`: by name, by the environment variable ``KVOFFLOAD_BACKEND``, or
as ``"module:Class"`` for an out-of-tree :class:`KernelBackend` subclass. Backend modules are
imported lazily (importing this module imports neither triton nor CUDA).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import torch

from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.triton_support import interpreter_problem

logger = logging.getLogger(__name__)

__all__ = [
    "KernelBackend",
    "register_backend",
    "get_backend",
    "available_backends",
    "registered_backends",
    "kernel_mode",
    "backend_class",
    "ENV_BACKEND",
]

ENV_BACKEND = "KVOFFLOAD_BACKEND"


# name -> class, or "module:Class" for built-ins imported on first use
_REGISTRY: dict[str, type[KernelBackend] | str] = {
    "torch": "kvoffload.kernels.torch_ref:TorchBackend",
    "triton": "kvoffload.kernels.triton_backend:TritonBackend",
    "page_loop": "kvoffload.kernels.page_loop_backend:PageLoopBackend",
}
_fallback_logged: set[tuple[str, str]] = set()


def _check_name(name: Any, what: str = "name") -> str:
    if not isinstance(name, str):
        raise InvalidTypeError(f"backend {what} must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(f"backend {what} must not be empty")
    return name


def _load_class(spec: str) -> type[KernelBackend]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidArgumentError(f"backend {spec!r}: expected 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise InvalidArgumentError(f"backend {spec!r}: {module_name!r} has no attribute {attr!r}") from exc
    if not (isinstance(obj, type) and issubclass(obj, KernelBackend)):
        raise InvalidTypeError(f"backend {spec!r} is not a KernelBackend subclass")
    return obj


def _resolve(name: str) -> type[KernelBackend]:
    if name in _REGISTRY:
        entry = _REGISTRY[name]
        if isinstance(entry, str):
            entry = _load_class(entry)
            _REGISTRY[name] = entry
        return entry
    if ":" in name:
        return _load_class(name)
    raise InvalidArgumentError(
        f"unknown kernel backend {name!r}; registered: {sorted(_REGISTRY)} (or pass 'module:Class')"
    )


def backend_class(name: str) -> type[KernelBackend]:
    """The class registered under ``name`` (or ``"module:Class"``), imported if needed.

    Raises :class:`InvalidArgumentError` for an unknown name, :class:`BackendUnavailableError`
    when its module cannot be imported.
    """
    return _resolve(_check_name(name))


def register_backend(name: str, cls: type[KernelBackend], *, replace: bool = False) -> None:
    """Register ``cls`` under ``name`` (no ``':'``). Re-registering another class needs ``replace=True``."""
    _check_name(name)
    if ":" in name:
        raise InvalidArgumentError(f"backend name {name!r} must not contain ':'")
    if not (isinstance(cls, type) and issubclass(cls, KernelBackend)):
        raise InvalidTypeError(f"cls must be a KernelBackend subclass, got {cls!r}")
    current = _REGISTRY.get(name)
    if current is not None and current is not cls and not replace:
        raise InvalidArgumentError(f"backend name {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = cls


def registered_backends() -> list[str]:
    """Names of all registered backends, available or not."""
    return sorted(_REGISTRY)


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, (str, torch.device)):
        try:
            return torch.device(device)
        except RuntimeError as exc:
            raise InvalidArgumentError(f"device {device!r} is not a valid torch device") from exc
    raise InvalidTypeError(f"device must be a torch.device or str, got {type(device).__name__}")


def _usable(cls: type[KernelBackend], device: torch.device) -> bool:
    try:
        return bool(cls.is_available(device))
    except Exception as exc:  # noqa: BLE001 - a backend that fails to probe is unavailable
        logger.debug("backend %s probe failed on %s: %s", cls.__name__, device, exc)
        return False


def get_backend(name: str | None = None, device: torch.device | str = "cpu") -> KernelBackend:
    """A backend instance for a KV cache on ``device``.

    ``name`` None: the env var ``KVOFFLOAD_BACKEND`` if set, else automatic (``"triton"`` on CUDA,
    ``"torch"`` on CPU; if the automatic choice cannot run it falls back to ``"torch"`` with one
    log line). An explicit name (argument or env var) that cannot run raises
    :class:`BackendUnavailableError`; an unknown name raises :class:`InvalidArgumentError`.
    """
    dev = _as_device(device)
    source = "argument"
    if name is None:
        env = os.environ.get(ENV_BACKEND, "").strip()
        if env:
            name, source = env, f"env {ENV_BACKEND}"
    if name is not None:
        _check_name(name)
        cls = _resolve(name)
        if not _usable(cls, dev):
            raise BackendUnavailableError(f"kernel backend {name!r} (from {source}) cannot run on {dev}")
        return cls()
    auto = "triton" if dev.type == "cuda" else "torch"
    cls = _resolve(auto)
    if _usable(cls, dev):
        return cls()
    key = (auto, str(dev))
    if key not in _fallback_logged:
        _fallback_logged.add(key)
        logger.warning("kernel backend %r cannot run on %s; falling back to 'torch'", auto, dev)
    cls = _resolve("torch")
    if not _usable(cls, dev):
        raise BackendUnavailableError(f"no kernel backend can run on {dev}")
    return cls()


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Registered backends that can run on ``device`` (default: CUDA if present, else CPU)."""
    dev = _as_device(device)
    names = []
    for name in sorted(_REGISTRY):
        try:
            cls = _resolve(name)
        except (BackendUnavailableError, InvalidArgumentError, InvalidTypeError):
            continue
        if _usable(cls, dev):
            names.append(name)
    return names


def kernel_mode() -> str:
    """``"compiled"`` (triton + CUDA), ``"interpreted"`` (triton's interpreter on CPU) or
    ``"unavailable"`` (no triton, or an interpreter that cannot run the kernel: ``"unavailable: why"``)."""
    try:
        importlib.import_module("triton")
    except Exception:  # noqa: BLE001 - a broken triton install is "unavailable"
        return "unavailable"
    if torch.cuda.is_available():
        return "compiled"
    problem = interpreter_problem()
    return "interpreted" if problem is None else f"unavailable: {problem}"
