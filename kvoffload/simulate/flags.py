"""Checks of ``kvoffload simulate``'s flag values that need more than argparse's types: each error
is a :class:`~kvoffload.errors.InvalidArgumentError` naming the flag, raised before anything runs
(the command line prints it on one line and exits with status 2)."""

from __future__ import annotations

from kvoffload.cache.policies.base import get_policy_class
from kvoffload.errors import InvalidArgumentError, KVOffloadError

__all__ = ["policy_names"]


def policy_names(text: str) -> list[str]:
    """The ``--policies`` list: comma-separated policy names or ``module:Class``, at least one, each
    once and each resolvable (empty items between commas are skipped)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise InvalidArgumentError(f"--policies names no policy in {text!r}: give at least one (e.g. lru,arc)")
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidArgumentError(f"--policies names {name!r} twice: give each policy once")
        try:
            get_policy_class(name)
        except KVOffloadError as exc:
            raise InvalidArgumentError(f"--policies: {exc}") from None
    return names
