"""Another revision's ``kvoffload`` package, importable beside this checkout's, for in-process A/B runs.

:func:`extract_as_b` unpacks a git revision's package (``git archive``) into a directory as
``kvoffload_b``, its absolute imports of itself renamed, so that both versions load in one process
and take turns on the same data: a before/after that the machine's drift between two runs does not
blur (``bench_vllm_ab.py``, ``bench_manager_ab.py``).
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

__all__ = ["extract_as_b"]

ROOT = Path(__file__).resolve().parent.parent
_IMPORT = re.compile(r"\bkvoffload(?=[.\s])")


def extract_as_b(rev: str, into: Path) -> None:
    """``rev``'s ``kvoffload`` package as ``into/kvoffload_b``, its imports of itself renamed."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kvoffload"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    (into / "kvoffload").rename(into / "kvoffload_b")
    for path in (into / "kvoffload_b").rglob("*.py"):
        path.write_text(_IMPORT.sub("kvoffload_b", path.read_text()))
