"""Name -> class registries: kernel backends and cache policies use one :class:`Registry` each.

A registry maps names to subclasses of one base class. Built-in entries are ``"module:Class"``
strings imported on first use; :meth:`Registry.get` also accepts ``"package.module:Class"`` for
an out-of-tree class that was never registered. The same faults raise the same errors in every
registry:

* a name that is not a ``str``, a class that is not a concrete subclass of the base, a
  ``replace`` that is not a bool: :class:`~kvoffload.errors.InvalidTypeError`;
* an empty name, a registered name containing ``':'``, an unknown name, a malformed
  ``"module:Class"``, a module without that attribute, a name already taken by another class
  without ``replace=True``: :class:`~kvoffload.errors.InvalidArgumentError`;
* a module that cannot be imported: :class:`~kvoffload.errors.BackendUnavailableError` (with the
  ``pip install 'kvoffload[extra]'`` line when the module belongs to an optional extra).

This module imports only :mod:`kvoffload.errors` and :mod:`kvoffload.checks`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Generic, TypeVar, cast

from kvoffload.checks import check_bool
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Registered subclasses of ``base`` by name.

    Args:
        kind: what a name selects, as the argument is called in messages (``"cache_policy"``,
            ``"kernel backend"``).
        base: the class every entry must subclass (concretely: abstract classes are refused).
        builtins: name -> ``"module:Class"`` of the built-in entries, imported on first use.
        extras: module prefix -> the optional extra (``pyproject.toml``) that brings what modules
            under that prefix import, named in the error when such a module cannot be imported.
    """

    def __init__(self, kind: str, base: type, builtins: dict[str, str], extras: dict[str, str] | None = None) -> None:
        # ``base`` is typed ``type``, not ``type[T]``: it is usually abstract
        self.kind = kind
        self.base = base
        self._builtins = frozenset(builtins)
        self._entries: dict[str, type[T] | str] = dict(builtins)
        self._extras = dict(extras or {})

    def _check_name(self, name: object) -> str:
        if not isinstance(name, str):
            raise InvalidTypeError(f"{self.kind} name must be a str, got {type(name).__name__} {name!r}")
        if not name:
            raise InvalidArgumentError(f"{self.kind} name must not be empty")
        return name

    def _check_class(self, cls: object, what: str) -> type[T]:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise InvalidTypeError(f"{what} is not a {self.base.__name__} subclass: {cls!r}")
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise InvalidTypeError(f"{what} {cls.__qualname__} is abstract: it does not implement {missing}")
        return cast("type[T]", cls)

    def _load(self, spec: str) -> type[T]:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise InvalidArgumentError(f"{self.kind} {spec!r}: expected 'package.module:Class'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            extra = next((e for prefix, e in self._extras.items() if module_name.startswith(prefix)), None)
            hint = f"; install it with: pip install 'kvoffload[{extra}]'" if extra else ""
            raise BackendUnavailableError(
                f"{self.kind} {spec!r}: cannot import module {module_name!r}: {exc}{hint}"
            ) from exc
        obj: Any = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                raise InvalidArgumentError(
                    f"{self.kind} {spec!r}: module {module_name!r} has no attribute {attr!r}"
                ) from exc
        return self._check_class(obj, f"{self.kind} {spec!r}:")

    def get(self, name: str) -> type[T]:
        """The class registered as ``name`` (a built-in imported on first use), or the class a
        ``"package.module:Class"`` names."""
        self._check_name(name)
        entry = self._entries.get(name)
        if entry is None:
            if ":" in name:
                return self._load(name)
            raise InvalidArgumentError(
                f"unknown {self.kind} {name!r}: expected one of {self.names()} or 'package.module:Class'"
            )
        if isinstance(entry, str):
            entry = self._load(entry)
            self._entries[name] = entry
        return entry

    def register(self, name: str, cls: type[T], *, replace: bool = False) -> None:
        """Make ``cls`` selectable as ``name``.

        Registering the class a name already has is a no-op; replacing another class (a
        built-in included) needs ``replace=True``.
        """
        self._check_name(name)
        if ":" in name:
            raise InvalidArgumentError(f"{self.kind} name {name!r} must not contain ':'")
        self._check_class(cls, f"{self.kind} class")
        replace = check_bool(replace, "replace")
        if not replace and name in self._entries:
            current = self.get(name)
            if current is not cls:
                what = "a built-in" if name in self._builtins else f"already registered ({current!r})"
                raise InvalidArgumentError(
                    f"{self.kind} name {name!r} is {what}; pass replace=True to replace it, or pick another name"
                )
        self._entries[name] = cls

    def names(self) -> list[str]:
        """Every registered name (built-ins included), sorted."""
        return sorted(self._entries)
