"""What importing kvoffload costs a process: ``import kvoffload`` and its subpackages, now and at
an earlier commit, in fresh interpreters.

Run: ``python bench/bench_import.py [--before REV] [--repeats N] [--out PATH]``.

Each measurement is a fresh ``python -X importtime -c "import M"``; reported per module: the
median and best of ``repeats`` of the module's cumulative import time as ``-X importtime`` reports
it (microseconds of the import itself, no interpreter start-up), and the modules it loaded
(kvoffload's, and whether numpy / torch came with it). With ``--before REV`` the same modules are
imported from ``git archive REV kvoffload`` unpacked in a temporary directory (first on
``PYTHONPATH``), runs alternating between the two trees, and each module's median now / before is
reported. Writes a JSON results file (default ``bench/results/import-time.json``); no targets are
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from bench.common import provenance  # noqa: E402

MODULES = ["kvoffload", "kvoffload.core", "kvoffload.cache", "kvoffload.engine.scheduler", "kvoffload.tiers"]
_LOADED = (
    "import sys; import {m}; "
    "print(repr((sorted(n for n in sys.modules if n.startswith('kvoffload')), 'numpy' in sys.modules, "
    "'torch' in sys.modules, sys.modules['kvoffload'].__file__)))"
)


def _env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def import_us(module: str, tree: Path | None) -> int:
    """Cumulative microseconds of ``import module`` in a fresh interpreter, per ``-X importtime``."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True, text=True, check=True, env=_env(tree), cwd=tempfile.gettempdir(),
    )  # fmt: skip
    for line in reversed(out.stderr.splitlines()):
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"no import time for {module} in:\n{out.stderr[-2000:]}")


def loaded(module: str, tree: Path | None) -> dict[str, Any]:
    """What ``import module`` loads: kvoffload's modules, numpy, torch (and which tree it came from)."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED.format(m=module)],
        capture_output=True, text=True, check=True, env=_env(tree), cwd=tempfile.gettempdir(),
    )  # fmt: skip
    mods, numpy, torch, origin = eval(out.stdout)  # noqa: S307 - our own repr of plain values
    if tree is not None and not origin.startswith(str(tree)):
        raise RuntimeError(f"{module} came from {origin}, not from {tree}")
    return {"kvoffload_modules": len(mods), "numpy": numpy, "torch": torch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="a git revision to compare with (its kvoffload/ is unpacked to a temp dir)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(_HERE / "results" / "import-time.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, Path | None] = {"now": None}
        if args.before:
            archive = subprocess.run(
                ["git", "archive", args.before, "kvoffload"], capture_output=True, check=True, cwd=_HERE.parent
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            trees["before"] = Path(tmp)
        times: dict[str, dict[str, list[int]]] = {t: {m: [] for m in MODULES} for t in trees}
        for _ in range(args.repeats):
            for m in MODULES:
                for t, tree in trees.items():  # alternating: the machine's load hits both alike
                    times[t][m].append(import_us(m, tree))
        result: dict[str, Any] = {"repeats": args.repeats, "before": args.before, "modules": {}}
        for m in MODULES:
            row: dict[str, Any] = {}
            for t, tree in trees.items():
                row[t] = {
                    "median_ms": round(statistics.median(times[t][m]) / 1000, 1),
                    "best_ms": round(min(times[t][m]) / 1000, 1),
                    **loaded(m, tree),
                }
            if "before" in trees:
                row["now_over_before"] = round(row["now"]["median_ms"] / row["before"]["median_ms"], 3)
            result["modules"][m] = row
            print(m, json.dumps(row), flush=True)
    doc = {"provenance": provenance(), "results": result}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
