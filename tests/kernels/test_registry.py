"""Backend registry: names, env var, module:Class, availability, fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch

from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels import registry
from kvoffload.kernels.registry import (
    ENV_BACKEND,
    KernelBackend,
    available_backends,
    get_backend,
    kernel_mode,
    register_backend,
    registered_backends,
)
from kvoffload.kernels.torch_ref import TorchBackend


class CudaOnly(TorchBackend):
    name = "cuda-only-test"

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        return torch.device(device).type == "cuda" and torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_BACKEND, raising=False)


@pytest.mark.interpreter
def test_builtins_registered_and_auto_choice_on_cpu() -> None:
    assert {"torch", "triton", "page_loop"} <= set(registered_backends())
    assert get_backend(device="cpu").name == "torch"
    assert get_backend("torch").name == "torch"
    assert get_backend("triton", "cpu").name == "triton"  # through the interpreter
    names = available_backends("cpu")
    assert "torch" in names and "triton" in names and "page_loop" not in names


@pytest.mark.interpreter
def test_env_var_selects_and_explicit_unavailable_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_BACKEND, "triton")
    assert get_backend(device="cpu").name == "triton"
    assert get_backend("torch", "cpu").name == "torch"  # argument wins over env
    monkeypatch.setenv(ENV_BACKEND, "page_loop")
    with pytest.raises(BackendUnavailableError, match=ENV_BACKEND):
        get_backend(device="cpu")


def test_explicit_unavailable_and_unknown() -> None:
    with pytest.raises(BackendUnavailableError):
        get_backend("page_loop", "cpu")
    with pytest.raises(InvalidArgumentError, match="unknown kernel backend"):
        get_backend("nope", "cpu")
    with pytest.raises(InvalidTypeError):
        get_backend(3, "cpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        get_backend("torch", 0)  # type: ignore[arg-type]


def test_module_class_spec() -> None:
    be = get_backend("kvoffload.kernels.torch_ref:TorchBackend", "cpu")
    assert isinstance(be, TorchBackend)
    with pytest.raises(BackendUnavailableError, match="cannot import"):
        get_backend("no_such_module_xyz:Foo", "cpu")
    with pytest.raises(InvalidArgumentError, match="no attribute"):
        get_backend("kvoffload.kernels.torch_ref:Missing", "cpu")
    with pytest.raises(InvalidTypeError, match="not a KernelBackend"):
        get_backend("kvoffload.kernels.torch_ref:np", "cpu")
    with pytest.raises(BackendUnavailableError):
        get_backend(f"{__name__}:CudaOnly", "cpu")


def test_register_backend_rules() -> None:
    register_backend("test-torch-alias", TorchBackend)
    try:
        assert isinstance(get_backend("test-torch-alias"), TorchBackend)
        register_backend("test-torch-alias", TorchBackend)  # same class again: fine
        with pytest.raises(InvalidArgumentError, match="already registered"):
            register_backend("test-torch-alias", CudaOnly)
        register_backend("test-torch-alias", CudaOnly, replace=True)
        with pytest.raises(BackendUnavailableError):
            get_backend("test-torch-alias", "cpu")
    finally:
        registry.BACKENDS._entries.pop("test-torch-alias", None)
    with pytest.raises(InvalidArgumentError):
        register_backend("a:b", TorchBackend)
    with pytest.raises(InvalidTypeError):
        register_backend("x", object)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        register_backend("", TorchBackend)


def test_auto_fallback_logs_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # pretend the auto choice for CUDA is unavailable and the torch backend runs anywhere
    class Never(TorchBackend):
        @classmethod
        def is_available(cls, device: torch.device) -> bool:
            return False

    class Anywhere(TorchBackend):
        @classmethod
        def is_available(cls, device: torch.device) -> bool:
            return True

    monkeypatch.setitem(registry.BACKENDS._entries, "triton", Never)
    monkeypatch.setitem(registry.BACKENDS._entries, "torch", Anywhere)
    monkeypatch.setattr(registry, "_fallback_logged", set())
    with caplog.at_level(logging.WARNING, logger="kvoffload.kernels.registry"):
        assert isinstance(get_backend(device="cuda:0"), Anywhere)
        assert isinstance(get_backend(device="cuda:0"), Anywhere)
    assert sum("falling back" in r.message for r in caplog.records) == 1


def test_kernel_mode_and_abstract_base() -> None:
    from kvoffload.kernels.triton_backend import interpreter_problem

    mode = kernel_mode()
    assert mode.split(":")[0] in ("compiled", "interpreted", "unavailable")
    if not torch.cuda.is_available():
        problem = interpreter_problem()
        assert mode == ("interpreted" if problem is None else f"unavailable: {problem}")
    with pytest.raises(TypeError):
        KernelBackend()  # type: ignore[abstract]


def test_interpreter_probe_agrees_with_availability() -> None:
    from kvoffload.kernels.triton_backend import TritonBackend, interpreter_problem

    problem = interpreter_problem()
    assert TritonBackend.is_available(torch.device("cpu")) is (problem is None)
    assert ("triton" in available_backends("cpu")) is (problem is None)
    if problem is not None:  # the reason names the versions and the way out
        assert "numpy" in problem or "triton" in problem
