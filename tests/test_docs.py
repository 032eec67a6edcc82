"""The documentation site's sources (``docs/``, ``mkdocs.yml``): its examples run, every page is in the
navigation, every relative link resolves. ``make docs`` (MkDocs ``--strict``, in CI) checks the rest:
anchors, the API reference's objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_engine_kit_example_runs() -> None:
    """The engine kit's first example: a request's prefix stored to the CPU tier and loaded back."""
    text = (DOCS / "engine-kit.md").read_text()
    section = text[text.index("## Wiring it into an engine") :]
    blocks = _python_blocks(section)
    assert blocks and "assert torch.equal" in blocks[0]
    exec(compile(blocks[0], "docs/engine-kit.md", "exec"), {"__name__": "docs_example"})  # noqa: S102


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert "index.md" in pages and "vllm.md" in pages
    assert [p for p in pages if f": {p}\n" not in nav] == []


@pytest.mark.parametrize("page", sorted(str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *DOCS.rglob("*.md")]))
def test_relative_links_resolve(page: str) -> None:
    path = ROOT / page
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    bad = []
    for t in targets:
        if re.match(r"[a-z]+:", t) or t.startswith("#"):
            continue
        if not (path.parent / t.split("#")[0]).exists():
            bad.append(t)
    assert bad == []
