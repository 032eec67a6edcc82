"""Shared helpers for the benchmarks: machine slug, provenance, merged JSON results.

Every benchmark writes one *section* of ``bench/results/<slug>.json``::

    {"provenance": {...latest run...}, "sections": {"transfer": {...}, "manager": {...}}}

``<slug>`` names the machine: the GPU's name (``nvidia-h100-80gb-hbm3``) on a CUDA machine,
``cpu-<cpu model>`` otherwise, so figures from different machines never overwrite each other.
Writing merges: a benchmark replaces only its own section.

Importing this module does not initialise CUDA.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "slugify",
    "cpu_model",
    "gpu_name",
    "machine_slug",
    "results_path",
    "provenance",
    "write_section",
    "read_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_REPO = Path(__file__).resolve().parent.parent


def slugify(text: str) -> str:
    """Lower-case, non-alphanumerics collapsed to ``-``: ``"NVIDIA H100 80GB HBM3"`` -> ``nvidia-h100-80gb-hbm3``."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "unknown"


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else ``platform.processor()``/machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_name() -> str | None:
    """Name of CUDA device 0, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def machine_slug() -> str:
    """``slugify(gpu name)`` on a CUDA machine, else ``cpu-`` + ``slugify(cpu model)``."""
    name = gpu_name()
    return slugify(name) if name else "cpu-" + slugify(cpu_model())


def results_path(slug: str | None = None) -> Path:
    """``bench/results/<slug>.json`` (slug defaults to :func:`machine_slug`)."""
    return RESULTS_DIR / f"{slug or machine_slug()}.json"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def provenance() -> dict[str, Any]:
    """Where a figure came from: GPU (name, capability, SMs, driver, CUDA), CPU, versions, commit."""
    import numpy as np
    import torch

    try:
        import triton

        triton_version = str(triton.__version__)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        triton_version = None
    prov: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "numpy": np.__version__,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")),
        "argv": sys.argv,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        prov["gpu"] = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "driver": _driver_version(),
            "cuda_runtime": torch.version.cuda,
        }
    else:
        prov["gpu"] = None
    return prov


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON at ``path``, or an empty results document when it does not exist."""
    p = Path(path)
    if not p.exists():
        return {"provenance": {}, "sections": {}}
    data = json.loads(p.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object at top level")
    data.setdefault("provenance", {})
    data.setdefault("sections", {})
    return data


def write_section(
    section: str, data: Any, path: str | os.PathLike[str] | None = None, prov: dict[str, Any] | None = None
) -> Path:
    """Merge ``{section: data}`` into the results file (atomically) and return its path.

    Other sections are kept; the top-level ``provenance`` becomes this run's, and the section
    also records its own copy (sections may come from different runs).
    """
    p = Path(path) if path is not None else results_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = read_results(p)
    prov = provenance() if prov is None else prov
    doc["provenance"] = prov
    doc["sections"][section] = {"provenance": prov, "results": data}
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # world-readable like any written file (mkstemp makes it 0600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
