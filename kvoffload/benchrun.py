"""``python -m kvoffload bench``: run the repository's benchmarks and plot the transfer figures.

The benchmarks live in the source checkout's ``bench/`` directory (they are not part of the
installed package). Each one exposes ``run(quick: bool) -> dict``; this module runs the selected
ones, merges their sections into ``bench/results/<gpu-or-cpu-slug>.json`` and draws GB/s vs page
size per backend, with the link peak (one large copy of the same bytes) as a dashed line.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from kvoffload.errors import InvalidArgumentError

BENCHES = ("transfer", "manager", "scheduler")
_BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> ModuleType:
    """Import ``bench/<name>.py`` from the checkout by path."""
    path = _BENCH_DIR / f"{name}.py"
    if not path.is_file():
        raise InvalidArgumentError(f"{path} not found: `kvoffload bench` runs from a source checkout")
    if str(_BENCH_DIR.parent) not in sys.path:
        sys.path.insert(0, str(_BENCH_DIR.parent))
    spec = importlib.util.spec_from_file_location(f"bench.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def plot_transfer(results: dict[str, Any], path: Path) -> Path:
    """GB/s vs page size, one line per (backend, direction), the link peak as a dashed line.

    ``results`` is the ``transfer`` section written by ``bench/bench_transfer.py``: its ``rows``
    have ``page_bytes``, ``direction``, ``method`` and ``gbps``; the peak method is the one
    whose ``ratio_to_peak`` is 1 in every row (``memcpy`` on CPU, ``peak`` on GPU).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    peak_methods = {r["method"] for r in rows if r.get("ratio_to_peak") == 1.0}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, direction in zip(axes, ("pack", "unpack"), strict=True):
        series: dict[tuple[str, str], dict[int, list[float]]] = {}
        for r in rows:
            if r["direction"] == direction:
                key = (r["method"], r.get("shape", ""))
                series.setdefault(key, {}).setdefault(r["page_bytes"], []).append(r["gbps"])
        for (method, shape), points in sorted(series.items()):
            xs = sorted(points)
            ys = [max(points[x]) for x in xs]
            peak = method in peak_methods
            style: dict[str, Any] = {"linestyle": "--", "color": "black"} if peak else {"marker": "o"}
            if peak and shape != rows[0].get("shape", ""):
                style["linestyle"] = ":"
            label = f"{method} · {shape}" + (" (link peak)" if peak else "")
            ax.plot([x / 1024 for x in xs], ys, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{direction} ({'GPU→host' if direction == 'pack' else 'host→GPU'})")
        ax.set_xlabel("page size (KiB)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("throughput (GB/s)")
    fig.suptitle(f"kvoffload transfer throughput — {results.get('device', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks named by ``args.only`` (default all); print where results went."""
    known = BENCHES + (("vllm",) if importlib.util.find_spec("vllm") else ())  # bench_vllm needs vLLM
    selected = known if not args.only else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in selected if s not in known]
    if unknown:
        raise InvalidArgumentError(f"--only takes {','.join(known)}; unknown: {','.join(unknown)}")
    common = _load("common")
    out = Path(args.out) if args.out else common.results_path()
    for name in selected:
        print(f"== bench_{name} ({'quick' if args.quick else 'full'})", flush=True)
        result = _load(f"bench_{name}").run(quick=args.quick)
        dest = out.with_name(out.stem + "-vllm.json") if name == "vllm" else out  # its own file
        path = common.write_section(name, result, dest)
        if name == "transfer":
            png = plot_transfer(result, path.with_suffix(".png"))
            print(f"plot: {png}")
    print(f"results: {out}")
    return 0
