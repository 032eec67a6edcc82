"""MkDocs hook: the docstrings' Sphinx roles (``:class:`X```, ``:meth:``...) shown as plain code.

mkdocstrings renders the docstrings as Markdown, where a role's name would stay in the text
(":class:X"); this drops the role and keeps the code span, and a leading ``~`` (Sphinx's "last
component only") shortens the name the same way.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):<code>(~?)([\w.]+)")


def _code(match: re.Match[str]) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}"


def on_page_content(html: str, **_: Any) -> str:
    """Every page's HTML after Markdown, with the roles in front of code spans dropped."""
    return _ROLE.sub(_code, html)
