"""The commands configure logging as a program does (``configure_logging``: the root handler and the
``kvoffload`` logger's level); each test of them gets the process's logging back as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("kvoffload")
    saved = (root.level, list(root.handlers), ours.level)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    ours.setLevel(saved[2])
