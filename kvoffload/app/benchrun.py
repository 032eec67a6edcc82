"""``python -m kvoffload bench``: run the repository's benchmarks and plot the transfer figures.

The benchmarks live in the source checkout's ``bench/`` directory (they are not part of the
installed package). Each one exposes ``run(quick: bool) -> dict``; this module runs the selected
ones, merges their sections into ``bench/results/<gpu-or-cpu-slug>.json`` (``--quick``: a scratch
file, ``bench-quick/<slug>.json``) and draws GB/s vs page size per backend against a baseline
copy of the same bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from kvoffload.errors import InvalidArgumentError

BENCHES = ("transfer", "manager", "scheduler")
QUICK_DIR = Path("bench-quick")  # relative to the working directory; git-ignored in the checkout


def _bench_dir() -> Path:
    """The checkout's ``bench/``: beside the package (editable install or source tree), else in
    the working directory (a clone's root with kvoffload installed from elsewhere)."""
    for d in (Path(__file__).resolve().parent.parent / "bench", Path.cwd() / "bench"):
        if (d / "common.py").is_file():
            return d
    raise InvalidArgumentError(
        "`kvoffload bench` runs the benchmarks of a source checkout (its bench/ folder, not part of the "
        f"installed package at {Path(__file__).resolve().parent}): run it from the root of a clone, e.g. `make bench`"
    )


def _load(name: str, bench_dir: Path) -> ModuleType:
    """Import ``bench/<name>.py`` from the checkout by path."""
    path = bench_dir / f"{name}.py"
    if str(bench_dir.parent) not in sys.path:
        sys.path.insert(0, str(bench_dir.parent))
    spec = importlib.util.spec_from_file_location(f"bench.{name}", path)
    if spec is None or spec.loader is None:
        raise InvalidArgumentError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _log_scale_helps(values: list[float]) -> bool:
    """Lines would sit near 0 on a linear axis: the smallest positive value under 1/8 of the largest."""
    positive = [v for v in values if v > 0]
    return bool(positive) and min(positive) < max(positive) / 8


def plot_transfer(results: dict[str, Any], path: Path) -> Path:
    """GB/s vs page size, one line per (backend, shape), the baseline as a dashed/dotted line.

    ``results`` is the ``transfer`` section written by ``bench/bench_transfer.py``: its ``rows``
    have ``page_bytes``, ``direction``, ``method`` and ``gbps``; the baseline method is the one
    whose ``ratio_to_peak`` is 1 in every row: on GPU ``peak`` (one large copy of the same bytes
    over the link), on CPU ``memcpy`` (a contiguous copy of the same bytes in host memory; the
    plot then says that it shows CPU copies). The y axis is logarithmic when some line would sit
    near 0 on a linear one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    # minor ticks of a log axis labelled at 2 and 5 only (every one would overlap)
    sparse = FuncFormatter(lambda v, _pos: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
    rows = results["rows"]
    gpu = results.get("mode") == "gpu"
    peak_methods = {r["method"] for r in rows if r.get("ratio_to_peak") == 1.0}
    baseline = "link peak" if gpu else "contiguous copy of the same bytes"
    titles = (
        {"pack": "pack: GPU → host", "unpack": "unpack: host → GPU"}
        if gpu
        else {"pack": "pack: paged KV → packed copy (CPU)", "unpack": "unpack: packed copy → paged KV (CPU)"}
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    log_y = _log_scale_helps([r["gbps"] for r in rows])
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
            label = f"{method} · {shape}" + (f" ({baseline})" if peak else "")
            ax.plot([x / 1024 for x in xs], ys, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plain)
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(sparse)
        ax.set_title(titles[direction])
        ax.set_xlabel("page size (KiB)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("throughput (GB/s" + (", log scale)" if log_y else ")"))
    what = "GPU ↔ pinned host transfers" if gpu else "CPU copies only (no GPU on this machine)"
    fig.suptitle(f"kvoffload transfer throughput — {what} — {results.get('device', '?')}")
    handles, labels = axes[0].get_legend_handles_labels()  # both panels plot the same series
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03 + 0.045 * ((len(labels) + 2) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _check_not_mixed(path: Path, quick: bool, read_results: Any) -> None:
    """Refuse to merge a quick run into a file of full runs, or the reverse (checked before running)."""
    if not path.exists():
        return
    try:
        sections = read_results(path)["sections"]
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"--out {path} is not a results file: {exc}") from None
    mixed = [name for name, sec in sections.items() if bool(sec.get("results", {}).get("quick")) != quick]
    if mixed:
        kind = "full" if quick else "quick"
        raise InvalidArgumentError(
            f"--out {path} holds {kind}-run results ({', '.join(mixed)}); a {'quick' if quick else 'full'} run "
            "would mix with them: choose another --out"
        )


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmarks named by ``args.only`` (default all); print where results went.

    A full run merges into ``bench/results/<slug>.json`` (the measured figures the docs
    quote, docs/benchmarks.md); ``--quick`` writes ``bench-quick/<slug>.json`` under the working directory unless
    ``--out`` names a path. Results and plots are world-readable.
    """
    known = BENCHES + (("vllm",) if importlib.util.find_spec("vllm") else ())  # bench_vllm needs vLLM
    selected = known if not args.only else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in selected if s not in known]
    if unknown:
        raise InvalidArgumentError(f"--only takes {','.join(known)}; unknown: {','.join(unknown)}")
    bench_dir = _bench_dir()
    common = _load("common", bench_dir)
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = QUICK_DIR / common.results_path().name
    else:
        out = common.results_path()
    _check_not_mixed(out, args.quick, common.read_results)
    for name in selected:
        print(f"== bench_{name} ({'quick' if args.quick else 'full'})", flush=True)
        result = _load(f"bench_{name}", bench_dir).run(quick=args.quick)
        dest = out.with_name(out.stem + "-vllm.json") if name == "vllm" else out  # its own file
        path = common.write_section(name, result, dest)
        if dest != out:
            print(f"results: {path}")
        if name == "transfer":
            png = plot_transfer(result, path.with_suffix(".png"))
            os.chmod(png, 0o644)
            print(f"plot: {png}")
    print(f"results: {out}")
    return 0
