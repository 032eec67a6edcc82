"""A newcomer's first minutes, timed: clone the checkout, ``make demo`` (creates ``.venv`` and installs),
``make demo`` again (installed), and with ``--with-test`` ``make test`` in the same clone.

Run: ``python bench/newcomer_path.py [--with-test] [--no-write]``. Writes the wall times, the load
average before each step and the demo's own summary line to
``bench/results/<machine>-newcomer.json``. The clone is of the committed ``HEAD`` (uncommitted changes
are not in it). pip's cache and the local torch wheel make the install faster than a first install
on a machine that has never downloaded them; the machine's load is part of every figure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from bench.common import RESULTS_DIR, machine_slug, write_section  # noqa: E402


def timed(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``cmd`` in ``cwd``; its wall time, exit status, load average before it and last output line."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return {
        "command": " ".join(cmd),
        "wall_s": round(wall, 1),
        "returncode": proc.returncode,
        "load_average_before": round(load, 1),
        "last_line": lines[-1] if lines else "",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--with-test", action="store_true", help="also time `make test` in the clone")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    args = ap.parse_args(argv)
    repo = _HERE.parent
    steps: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvoffload-newcomer-") as tmp:
        clone = Path(tmp) / "kvoffload"
        steps["clone"] = timed(["git", "clone", "-q", str(repo), str(clone)], Path(tmp))
        steps["first_make_demo"] = timed(["make", "demo"], clone)
        steps["second_make_demo"] = timed(["make", "demo"], clone)
        if args.with_test:
            steps["make_test"] = timed(["make", "test"], clone)
    for name, step in steps.items():
        print(f"{name:18} {step['wall_s']:7.1f} s  (rc {step['returncode']}, load {step['load_average_before']})")
    if any(s["returncode"] for s in steps.values()):
        print("a step failed: nothing written", file=sys.stderr)
        return 1
    if not args.no_write:
        path = write_section("newcomer", steps, RESULTS_DIR / f"{machine_slug()}-newcomer.json")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
