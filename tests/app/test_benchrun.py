"""``kvoffload bench``: where results go, their permissions, the CPU plot, a missing checkout.

The benchmarks themselves are replaced by stand-ins in a temporary bench/ folder (a copy of the
real ``bench/common.py`` beside fake ``bench_*.py`` modules), so these tests take seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvoffload.app import benchrun
from kvoffload.errors import InvalidArgumentError

REPO = Path(__file__).resolve().parents[2]

_FAKE_TRANSFER = """
def run(quick=False):
    rows = []
    for page in (4096, 16384, 65536):
        for direction in ("pack", "unpack"):
            rows.append({"page_bytes": page, "direction": direction, "method": "memcpy", "shape": "s",
                         "gbps": 30.0, "ratio_to_peak": 1.0})
            rows.append({"page_bytes": page, "direction": direction, "method": "torch", "shape": "s",
                         "gbps": 2.0, "ratio_to_peak": 0.07})
    return {"mode": "cpu", "quick": quick, "device": "test cpu", "rows": rows}
"""
_FAKE_OTHER = "def run(quick=False):\n    return {'quick': quick, 'value': 1}\n"


@pytest.fixture
def fake_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A checkout whose bench/ holds fake benchmarks; the real ``bench.*`` modules (and sys.path)
    come back afterwards, for the tests that import them."""
    saved = {name: m for name, m in sys.modules.items() if name == "bench" or name.startswith("bench.")}
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield _make_fake_checkout(tmp_path, monkeypatch)
    for name in [n for n in sys.modules if n == "bench" or n.startswith("bench.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def _make_fake_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bench = tmp_path / "checkout" / "bench"
    bench.mkdir(parents=True)
    shutil.copy(REPO / "bench" / "common.py", bench / "common.py")
    (bench / "bench_transfer.py").write_text(_FAKE_TRANSFER)
    (bench / "bench_manager.py").write_text(_FAKE_OTHER)
    (bench / "bench_scheduler.py").write_text(_FAKE_OTHER)
    monkeypatch.setattr(benchrun, "_bench_dir", lambda: bench)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return bench


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"quick": False, "only": None, "out": None, **kw})


def test_quick_run_goes_to_a_scratch_file(fake_checkout: Path) -> None:
    assert benchrun.run_bench(_args(quick=True)) == 0
    results = fake_checkout / "results"
    assert not results.exists() or not any(results.iterdir())  # the measured-figures folder is untouched
    (out,) = (Path.cwd() / "bench-quick").glob("*.json")
    doc = json.loads(out.read_text())
    assert set(doc["sections"]) == {"transfer", "manager", "scheduler"}
    assert out.stat().st_mode & 0o777 == 0o644
    assert out.with_suffix(".png").stat().st_mode & 0o777 == 0o644


def test_full_run_writes_the_results_folder_and_refuses_quick_mixing(fake_checkout: Path) -> None:
    assert benchrun.run_bench(_args(only="manager")) == 0
    (full,) = (fake_checkout / "results").glob("*.json")
    assert full.stat().st_mode & 0o777 == 0o644
    before = full.read_text()
    with pytest.raises(InvalidArgumentError, match="holds full-run results"):
        benchrun.run_bench(_args(quick=True, out=str(full)))
    assert full.read_text() == before
    quick = Path.cwd() / "q.json"
    assert benchrun.run_bench(_args(quick=True, only="scheduler", out=str(quick))) == 0
    with pytest.raises(InvalidArgumentError, match="holds quick-run results"):
        benchrun.run_bench(_args(only="scheduler", out=str(quick)))


def test_cpu_plot_says_what_it_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    figs: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *a: Any, **kw: Any) -> None:
        figs.append(self)
        save(self, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    ns: dict[str, Any] = {}
    exec(_FAKE_TRANSFER, ns)  # noqa: S102
    benchrun.plot_transfer(ns["run"](), tmp_path / "t.png")
    (fig,) = figs
    texts = [fig.get_suptitle()] + [ax.get_title() for ax in fig.axes]
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert "CPU copies only" in texts[0]
    assert not any("GPU" in t for t in texts[1:]) and not any("link peak" in label for label in labels)
    assert all(ax.get_yscale() == "log" for ax in fig.axes)  # 2 GB/s beside 30 GB/s would sit near 0


def test_log_scale_only_when_lines_would_sit_near_zero() -> None:
    assert benchrun._log_scale_helps([2.0, 30.0])
    assert not benchrun._log_scale_helps([20.0, 30.0])


def test_installed_package_without_checkout_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages" / "kvoffload"
    site.mkdir(parents=True)
    monkeypatch.setattr(benchrun, "__file__", str(site / "benchrun.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match="runs the benchmarks of a source checkout"):
        benchrun.run_bench(_args())
    (tmp_path / "bench").mkdir()
    shutil.copy(REPO / "bench" / "common.py", tmp_path / "bench" / "common.py")
    assert benchrun._bench_dir() == tmp_path / "bench"  # run from a clone's root: found there
