"""The README's code blocks that its tests execute.

A block marked ``<!-- runnable: NAME -->`` on the line above its fence runs as written (the tests
say how: a shell command, a vLLM configuration); ``<!-- output of: NAME -->`` above a block marks
what that command prints (its lines must appear in the command's output, in order).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"

__all__ = ["README", "kv_transfer_config", "marked_blocks", "shell_commands"]


def marked_blocks(kind: str, text: str | None = None) -> dict[str, str]:
    """``{NAME: code}`` of the blocks marked ``<!-- KIND: NAME -->`` (``runnable`` or ``output of``)."""
    text = README.read_text() if text is None else text
    pattern = rf"<!-- {re.escape(kind)}: ([\w-]+) -->\n```[\w-]*\n(.*?)```"
    return dict(re.findall(pattern, text, re.S))


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block (continuation lines joined, comments dropped), as argv lists."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def kv_transfer_config(block: str) -> dict[str, Any]:
    """The JSON of a ``vllm serve ... --kv-transfer-config '{...}'`` block."""
    args = shlex.split(block, comments=True)  # one command; its quoted JSON spans lines
    assert args[:2] == ["vllm", "serve"], args
    return dict(json.loads(args[args.index("--kv-transfer-config") + 1]))
