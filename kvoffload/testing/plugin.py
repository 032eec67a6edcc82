"""Optional pytest plugin of the conformance suite: command-line options.

Load it with ``-p kvoffload.testing.plugin``; it adds

* ``--kvoffload-backend NAME`` (repeatable): a registered backend name or ``module:Class``;
* ``--kvoffload-device DEVICE`` (repeatable): device of the KV cache (default ``cpu`` and ``cuda``;
  ``cuda`` cases are skipped without a GPU).

Without the plugin the suite reads the same choices from the environment variables
``KVOFFLOAD_BACKEND`` and ``KVOFFLOAD_TEST_DEVICE`` (comma-separated).
"""

from __future__ import annotations

import pytest


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
