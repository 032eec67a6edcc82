"""kvoffload.registry: kernel backends and cache policies follow the same rules and errors."""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.cache.policies.base import POLICIES
from kvoffload.cache.policies.lru import LRUPolicy
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.kernels.registry import BACKENDS
from kvoffload.kernels.torch_ref import TorchBackend
from kvoffload.registry import Registry


class _Backend(TorchBackend):
    pass


class _Policy(LRUPolicy):
    pass


CASES = [(BACKENDS, "torch", TorchBackend, _Backend), (POLICIES, "lru", LRUPolicy, _Policy)]


@pytest.fixture(params=CASES, ids=["backends", "policies"])
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    reg = request.param[0]
    monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    return request.param  # type: ignore[no-any-return]


def test_same_rules_for_every_registry(case: tuple[Any, ...]) -> None:
    reg, builtin, builtin_cls, other = case
    assert isinstance(reg, Registry) and builtin in reg.names()
    assert reg.get(builtin) is builtin_cls
    assert reg.get(f"{other.__module__}:{other.__qualname__}") is other
    reg.register(builtin, builtin_cls)  # the same class again: a no-op
    with pytest.raises(InvalidArgumentError, match=rf"{reg.kind} name '{builtin}' is a built-in; pass replace=True"):
        reg.register(builtin, other)
    assert reg.get(builtin) is builtin_cls
    reg.register("x-test", other)
    with pytest.raises(InvalidArgumentError, match="already registered"):
        reg.register("x-test", builtin_cls)
    reg.register("x-test", builtin_cls, replace=True)
    assert reg.get("x-test") is builtin_cls and "x-test" in reg.names()
    faults: list[tuple[Any, type[Exception], str]] = [
        (lambda: reg.get(3), InvalidTypeError, f"{reg.kind} name must be a str"),
        (lambda: reg.get(""), InvalidArgumentError, "must not be empty"),
        (lambda: reg.get("nope"), InvalidArgumentError, f"unknown {reg.kind} 'nope'"),
        (lambda: reg.get("no_such_module_xyz:C"), BackendUnavailableError, "cannot import module"),
        (lambda: reg.get("kvoffload.errors:Nope"), InvalidArgumentError, "has no attribute 'Nope'"),
        (lambda: reg.get("kvoffload.errors:KVOffloadError"), InvalidTypeError, f"not a {reg.base.__name__} subclass"),
        (lambda: reg.get(":C"), InvalidArgumentError, "expected 'package.module:Class'"),
        (lambda: reg.register("a:b", other), InvalidArgumentError, "must not contain ':'"),
        (lambda: reg.register("y-test", object), InvalidTypeError, "not a"),
        (lambda: reg.register("y-test", reg.base), InvalidTypeError, "is abstract"),
        (lambda: reg.register("y-test", other, replace=1), InvalidTypeError, "replace must be a bool"),
    ]
    before = dict(reg._entries)
    for call, err, msg in faults:
        with pytest.raises(err, match=msg):
            call()
    assert reg._entries == before
