"""Logging for kvoffload's applications (``kvoffload demo | simulate | bench | info``, ``demo-shared``).

The library only adds a ``NullHandler`` to its ``kvoffload`` logger; an application decides what
is shown. These show kvoffload's warnings by default (a tier unreachable, values rejected, a
Redis tier without an integrity key), on stderr, one line each.
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["LOG_LEVELS", "add_log_level_option", "configure_logging"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` (default ``warning``) to ``parser``."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="kvoffload's log messages shown on stderr from this level on (default warning)",
    )


def configure_logging(level: str) -> None:
    """Show kvoffload's log records of ``level`` and above on stderr; other libraries' warnings too."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("kvoffload").setLevel(level.upper())
