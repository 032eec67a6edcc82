"""The cache policy registry: built-ins and registered names are replaced only with
``replace=True``; abstract classes are refused when registered or named."""

from __future__ import annotations

from abc import ABC

import pytest

from kvoffload.cache import policies
from kvoffload.cache.manager import CPUOffloadingManager
from kvoffload.cache.policies.base import CachePolicy, get_policy_class, register_policy
from kvoffload.cache.policies.lru import LRUPolicy
from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from tests.keys import POLICIES


# ------------------------------------------------------------------ policy registry
class _Tmp(LRUPolicy):
    pass


class _Abstract(CachePolicy, ABC):
    """Implements nothing: every abstract method is still missing."""


class _HalfDone(LRUPolicy, ABC):
    from abc import abstractmethod

    @abstractmethod
    def extra(self) -> None: ...


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    reg = dict(policies.base.POLICIES._entries)
    monkeypatch.setattr(policies.base.POLICIES, "_entries", reg)
    return reg


@pytest.mark.parametrize("name", POLICIES)
def test_register_policy_does_not_silently_replace_a_builtin(registry: dict, name: str) -> None:
    builtin = get_policy_class(name)
    with pytest.raises(InvalidArgumentError, match=rf"'{name}'.*replace=True"):
        register_policy(name, _Tmp)
    assert get_policy_class(name) is builtin
    register_policy(name, _Tmp, replace=True)
    assert get_policy_class(name) is _Tmp


def test_register_policy_replacing_a_registered_name_needs_replace(registry: dict) -> None:
    register_policy("tmp-policy", _Tmp)
    register_policy("tmp-policy", _Tmp)  # the same class again: nothing to replace

    class _Other(LRUPolicy):
        pass

    with pytest.raises(InvalidArgumentError, match="replace"):
        register_policy("tmp-policy", _Other)
    assert get_policy_class("tmp-policy") is _Tmp
    register_policy("tmp-policy", _Other, replace=True)
    assert get_policy_class("tmp-policy") is _Other
    with pytest.raises(InvalidTypeError, match="replace"):
        register_policy("tmp-policy", _Tmp, replace="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [_Abstract, _HalfDone, CachePolicy])
def test_register_policy_rejects_an_abstract_class(registry: dict, cls: type) -> None:
    with pytest.raises(InvalidTypeError, match=r"abstract.*(insert|extra|evict)"):
        register_policy("abstract-policy", cls)
    assert "abstract-policy" not in registry


def test_out_of_tree_abstract_policy_is_rejected_when_named() -> None:
    with pytest.raises(InvalidTypeError, match="abstract"):
        get_policy_class("kvoffload.cache.policies.base:CachePolicy")
    with pytest.raises(InvalidTypeError, match="abstract"):
        CPUOffloadingManager(4, cache_policy="tests.cache.test_policy_registry:_Abstract")


def test_register_policy_same_builtin_class_again_is_a_no_op(registry: dict) -> None:
    registry["lru"] = "kvoffload.cache.policies.lru:LRUPolicy"  # not loaded yet
    register_policy("lru", LRUPolicy)
    assert get_policy_class("lru") is LRUPolicy
