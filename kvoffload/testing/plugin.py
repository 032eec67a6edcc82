"""Optional pytest plugin of the conformance suite: command-line options.

Load it with ``-p kvoffload.testing.plugin``; it adds

* ``--kvoffload-backend NAME`` (repeatable): a registered backend name or ``module:Class``;
* ``--kvoffload-device DEVICE`` (repeatable): device of the KV cache (default ``cpu`` and ``cuda``;
  ``cuda`` cases are skipped without a GPU);
* ``--kvoffload-tier NAME`` (repeatable): a tier harness for the tier suite, ``redis``,
  ``redis-cluster``, ``disk`` or ``module:Class`` (a :class:`kvoffload.testing.tier_harness.TierHarness`).

Without the plugin the suites read the same choices from the environment variables
``KVOFFLOAD_BACKEND``, ``KVOFFLOAD_TEST_DEVICE`` and ``KVOFFLOAD_TIER`` (comma-separated).
"""

from __future__ import annotations

import pytest

from kvoffload.errors import KVOffloadError
from kvoffload.kernels.registry import backend_class

__all__ = ["check_backend_names"]


def check_backend_names(names: list[str], source: str) -> None:
    """Raise ONE :class:`pytest.UsageError` naming every backend that cannot be resolved."""
    bad = []
    for name in names:
        try:
            backend_class(name)
        except KVOffloadError as exc:
            bad.append(f"{name!r}: {exc}")
    if bad:
        raise pytest.UsageError(f"{source}: unusable kernel backend(s): " + "; ".join(bad))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvoffload", "kvoffload backend conformance suite")
    group.addoption(
        "--kvoffload-backend",
        action="append",
        default=None,
        metavar="NAME",
        help="kernel backend to test: registered name or 'module:Class' (repeatable)",
    )
    group.addoption(
        "--kvoffload-device",
        action="append",
        default=None,
        metavar="DEVICE",
        help="device of the KV cache (repeatable; default: cpu and cuda)",
    )
    group.addoption(
        "--kvoffload-tier",
        action="append",
        default=None,
        metavar="NAME",
        help="tier harness for the tier suite: redis, redis-cluster, disk or 'module:Class' (repeatable)",
    )


def pytest_configure(config: pytest.Config) -> None:
    names = config.getoption("--kvoffload-backend")
    if names:
        check_backend_names([n for n in names if n], "--kvoffload-backend")
