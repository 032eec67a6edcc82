"""Kernel backends behind one registry.

Built-in backends:

* ``"torch"``  -- pure-torch reference (:mod:`kvoffload.kernels.torch_ref`), the CPU default;
  also runs on CUDA.
* ``"triton"`` -- one Triton launch per job (:mod:`kvoffload.kernels.triton_backend`), the CUDA
  default; on CPU tensors it runs the same kernel through Triton's interpreter.
* ``"page_loop"`` -- CUDA only: one async copy per page, the baseline engines use today
  (:mod:`kvoffload.kernels.page_loop_backend`).

Choose with :func:`get_backend`: by name, by the environment variable ``KVOFFLOAD_BACKEND``, or
as ``"module:Class"`` for an out-of-tree :class:`KernelBackend` subclass. Names live in
:data:`BACKENDS`, a :class:`kvoffload.registry.Registry` (the same rules and errors as the cache
policies'). Backend modules are
imported lazily (importing this module imports neither triton nor CUDA).
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.backend import KernelBackend
from kvoffload.kernels.triton_support import interpreter_problem
from kvoffload.registry import Registry

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
    "BACKENDS",
]

ENV_BACKEND = "KVOFFLOAD_BACKEND"


#: the kernel backends by name (built-ins imported on first use)
BACKENDS: Registry[KernelBackend] = Registry(
    "kernel backend",
    KernelBackend,
    {
        "torch": "kvoffload.kernels.torch_ref:TorchBackend",
        "triton": "kvoffload.kernels.triton_backend:TritonBackend",
        "page_loop": "kvoffload.kernels.page_loop_backend:PageLoopBackend",
    },
)
_fallback_logged: set[tuple[str, str]] = set()


def backend_class(name: str) -> type[KernelBackend]:
    """The class registered under ``name`` (or ``"module:Class"``), imported if needed
    (:meth:`kvoffload.registry.Registry.get`)."""
    return BACKENDS.get(name)


def register_backend(name: str, cls: type[KernelBackend], *, replace: bool = False) -> None:
    """Make ``cls`` selectable as ``name`` (:meth:`kvoffload.registry.Registry.register`)."""
    BACKENDS.register(name, cls, replace=replace)


def registered_backends() -> list[str]:
    """Names of all registered backends, available or not."""
    return BACKENDS.names()


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
        cls = BACKENDS.get(name)
        if not _usable(cls, dev):
            raise BackendUnavailableError(f"kernel backend {name!r} (from {source}) cannot run on {dev}")
        return cls()
    auto = "triton" if dev.type == "cuda" else "torch"
    cls = BACKENDS.get(auto)
    if _usable(cls, dev):
        return cls()
    key = (auto, str(dev))
    if key not in _fallback_logged:
        _fallback_logged.add(key)
        logger.warning("kernel backend %r cannot run on %s; falling back to 'torch'", auto, dev)
    cls = BACKENDS.get("torch")
    if not _usable(cls, dev):
        raise BackendUnavailableError(f"no kernel backend can run on {dev}")
    return cls()


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Registered backends that can run on ``device`` (default: CUDA if present, else CPU)."""
    dev = _as_device(device)
    names = []
    for name in BACKENDS.names():
        try:
            cls = BACKENDS.get(name)
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
