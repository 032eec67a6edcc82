"""The tier registry: the one place a tier spec is resolved to a :class:`~kvoffload.tiers.Tier`.

Every caller -- :func:`open_tier`, ``kvoffload simulate`` / ``demo --tier``, the vLLM adapter
(:class:`kvoffload.integrations.vllm.KVOffloadTier`) -- resolves tiers here. A spec is

* a URL, ``scheme:…``, resolved by its scheme: built-ins ``redis``, ``rediss``, ``unix``
  (:class:`~kvoffload.tiers.RedisTier`) and ``disk`` (:class:`~kvoffload.tiers.DiskTier`), a scheme
  given to :func:`register_tier`, or a scheme an installed package declares in the entry-point
  group ``kvoffload.tiers`` (``toy = "mypkg.tiers:ToyTier"``, found on first use); or
* a dict, the way vLLM names its secondary tiers: ``{"type": "ToyTier", "module_path": "mypkg.tiers",
  "url": …, …options}`` imports the class from ``module_path`` (no registration needed);
  ``{"url": …, …options}`` resolves ``url`` by its scheme. The other keys are constructor options.

A tier class turns its URL into constructor keywords with its ``options_from_url`` classmethod
(checking the syntax, connecting nothing); the keywords a class accepts (:func:`tier_options`)
are the named parameters of its ``__init__`` and of every base ``__init__`` it passes ``**kwargs``
to, so an unknown option is a typed error naming it before anything is opened.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvoffload.errors import InvalidArgumentError, InvalidTypeError
from kvoffload.registry import Registry
from kvoffload.tiers.base import Tier
from kvoffload.tiers.namespace import TierNamespace

__all__ = [
    "TIERS",
    "ENTRY_POINT_GROUP",
    "TierSpec",
    "register_tier",
    "tier_schemes",
    "tier_options",
    "resolve_tier",
    "check_tier_spec",
    "open_tier",
]

logger = logging.getLogger(__name__)

#: Python entry-point group of out-of-tree tiers: name = URL scheme, value = ``"module:Class"``.
ENTRY_POINT_GROUP = "kvoffload.tiers"

#: What a caller names a tier with: a URL, or a dict (see the module docstring).
TierSpec = str | Mapping[str, Any]

#: URL scheme -> tier class (built-ins imported on first use).
TIERS: Registry[Tier] = Registry(
    "tier scheme",
    Tier,
    {
        "redis": "kvoffload.tiers.redis:RedisTier",
        "rediss": "kvoffload.tiers.redis:RedisTier",
        "unix": "kvoffload.tiers.redis:RedisTier",
        "disk": "kvoffload.tiers.disk:DiskTier",
    },
    extras={"kvoffload.tiers.redis": "redis", "kvoffload.tiers.disk": "disk"},
)


def register_tier(scheme: str, cls: type[Tier], *, replace: bool = False) -> None:
    """Make ``cls`` open URLs of ``scheme`` (``scheme://…`` or ``scheme:…``)."""
    TIERS.register(scheme.lower() if isinstance(scheme, str) else scheme, cls, replace=replace)


def _entry_point(scheme: str) -> type[Tier] | None:
    """The class an installed package declares for ``scheme`` (registered on first use)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() == scheme:
            cls = TIERS.get(ep.value)  # checks it is a concrete Tier subclass
            TIERS.register(scheme, cls)
            return cls
    return None


def tier_schemes() -> list[str]:
    """Every scheme that resolves now: registered ones and installed entry points, sorted."""
    names = set(TIERS.names())
    names.update(ep.name.lower() for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _scheme_class(url: str) -> type[Tier]:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme and scheme in TIERS.names():
        return TIERS.get(scheme)
    cls = _entry_point(scheme) if scheme and "." not in scheme else None
    if cls is None:
        raise InvalidArgumentError(
            f"tier spec {url!r}: unknown scheme {scheme!r}; expected one of "
            f"{', '.join(s + ':' for s in tier_schemes())} (register_tier, or the entry-point group "
            f"{ENTRY_POINT_GROUP!r}), or a dict with 'type' and 'module_path'"
        )
    return cls


def tier_options(cls: type[Tier]) -> frozenset[str]:
    """The keyword options ``cls`` accepts (its ``__init__`` and the bases it forwards ``**kwargs`` to)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        names.update(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return frozenset(names - {"records", "namespace"})


def resolve_tier(spec: TierSpec, **options: Any) -> tuple[type[Tier], dict[str, Any]]:
    """The class ``spec`` names and its constructor keywords (the spec's, then ``options``),
    checked without opening anything: a typed error names the spec and what was expected."""
    if isinstance(spec, str):
        cls = _scheme_class(spec)
        kwargs = dict(cls.options_from_url(spec))
    elif isinstance(spec, Mapping):
        kwargs = dict(spec)
        type_name, module_path = kwargs.pop("type", None), kwargs.pop("module_path", None)
        url = kwargs.pop("url", None)
        if url is not None and not isinstance(url, str):
            raise InvalidTypeError(f"tier spec {dict(spec)!r}: 'url' must be a str, got {type(url).__name__}")
        if module_path is not None or type_name is not None:
            if not isinstance(type_name, str) or not isinstance(module_path, str) or not type_name or not module_path:
                raise InvalidArgumentError(
                    f"tier spec {dict(spec)!r}: 'type' (a class name) and 'module_path' (a module) go together"
                )
            cls = TIERS.get(f"{module_path}:{type_name}")
        elif url is not None:
            cls = _scheme_class(url)
        else:
            raise InvalidArgumentError(f"tier spec {dict(spec)!r}: expected a 'url', or 'type' and 'module_path'")
        if url is not None:
            kwargs = {**cls.options_from_url(url), **kwargs}
    else:
        raise InvalidTypeError(f"tier spec must be a URL str or a dict, got {type(spec).__name__}")
    kwargs.update(options)
    unknown = sorted(set(kwargs) - tier_options(cls))
    if unknown:
        raise InvalidArgumentError(
            f"tier spec {spec!r}: unknown option(s) {unknown} for {cls.__qualname__}; "
            f"expected some of {sorted(tier_options(cls))}"
        )
    return cls, kwargs


def check_tier_spec(spec: TierSpec, **options: Any) -> type[Tier]:
    """Check ``spec`` (syntax, options; nothing connects) and return the class it names."""
    return resolve_tier(spec, **options)[0]


def open_tier(spec: TierSpec, records: np.ndarray | memoryview, namespace: TierNamespace, **options: Any) -> Tier:
    """The tier ``spec`` names over ``records`` (see the module docstring for specs).

    ``spec`` is e.g. ``redis://host:6379`` (see :class:`~kvoffload.tiers.RedisTier`) or
    ``disk:<directory>[?max_bytes=N&o_direct=0|1|auto]`` (see :class:`~kvoffload.tiers.DiskTier`).
    ``options`` are passed to the tier's constructor (they override options given in the spec).
    """
    cls, kwargs = resolve_tier(spec, **options)
    return cls(records, namespace, **kwargs)
