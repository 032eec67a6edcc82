"""`make gpu-check OUT=DIR [PYTHON=python3]`: everything a first GPU session needs, in one command.

Runs on a machine with Python, torch, triton, numpy, pytest and matplotlib already installed and no
network: no venv, no pip; the checkout is put on ``PYTHONPATH``. Each step runs in its own process
with its own timeout; all output goes to DIR (8 files at most):

=================  ===========================================================================
``env.txt``        nvidia-smi (incl. PCIe generation/width), versions, device properties
``smoke.log``      pinned pool, both directions compiled, one store + one load per data path, verified
``gpu-tests.log``  the ``gpu``-marked test tier and the conformance suite on ``cuda``
``bench.log``      stdout of the three benchmark runs and of ``probe_job_overhead.py --profile`` (a
                   small job's host time per job, single and merged, the kernel alone, and where
                   the host time goes)
``bench-quick.json``  quick transfer benchmark at 16 and at 64 programs (sections ``p16``, ``p64``):
                   at 64 programs vs 16, a ratio that grows says "too few bytes in flight", one that
                   does not says "host-read ceiling"
``bench-full.json`` / ``bench-full.png``  the full benchmark with what is left of the time budget
``summary.txt``    one line per step and the final summary line (also printed last)
=================  ===========================================================================

On a machine without a GPU it prints a "no GPU" line, runs the CPU-runnable steps (environment,
smoke test through the torch reference on CPU) and exits 0. Elsewhere it exits 1 if a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 480.0


def _env_report() -> str:
    """Versions, device properties and nvidia-smi, as text (runs in its own process)."""
    lines = [f"python {sys.version.split()[0]} ({sys.executable})"]
    for mod in ("torch", "triton", "numpy", "pytest", "hypothesis", "matplotlib", "cuda.bindings"):
        try:
            m = __import__(mod, fromlist=["_"])
            lines.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001 - report and go on
            lines.append(f"{mod}: not importable ({type(exc).__name__}: {exc})")
    import torch

    from kvoffload.kernels.config import launch_config
    from kvoffload.kernels.copy_engine import batched_copy_problem
    from kvoffload.kernels.registry import available_backends, kernel_mode

    lines.append(f"torch CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
    lines.append(f"kernel mode: {kernel_mode()}; backends: {available_backends()}")
    lines.append(f"batched copies: {batched_copy_problem() or 'available'}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"device {i}: {p}")
            lines.append(f"  launch config: {launch_config(torch.device('cuda', i))}")
    query = "name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,driver_version"
    for cmd in (["nvidia-smi"], ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], ["nvidia-smi", "topo", "-m"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            lines.append(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}")
        except (OSError, subprocess.SubprocessError) as exc:
            lines.append(f"$ {' '.join(cmd)}: {exc}")
    return "\n".join(lines)


def _smoke() -> int:
    """Pinned pool, prepare (both directions compiled), one store and one load per path, byte-checked."""
    import torch

    from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
    from kvoffload.kernels.layout import KVCacheTable
    from kvoffload.transfer.worker import TransferWorker

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    backend = "triton" if cuda else "torch"
    failures = 0
    for path in ("direct", "staged", "dma"):
        t0 = time.perf_counter()
        kv = [
            torch.randint(0, 256, (2, 64, 16, 8, 128), dtype=torch.uint8, device=dev).view(torch.bfloat16)
            for _ in range(4)
        ]
        table = KVCacheTable.from_tensors([kv], "flash_attn")
        w = TransferWorker(table, 16, 2, backend=backend, path=path)
        t_init = time.perf_counter() - t0
        src = [5, 9, 2, 33]
        dst = [40, 41, 7, 12]
        want = [torch.cat([t[k, b].reshape(-1).view(torch.uint8) for t in kv for k in (0, 1)]).cpu() for b in src]
        w.transfer_async(1, (GPULoadStoreSpec(src, [4], [0]), CPULoadStoreSpec([3, 8])))
        w.wait([1])
        w.transfer_async(2, (CPULoadStoreSpec([3, 8]), GPULoadStoreSpec(dst, [4], [0])))
        w.wait([2])
        res = w.get_finished()
        got = [torch.cat([t[k, b].reshape(-1).view(torch.uint8) for t in kv for k in (0, 1)]).cpu() for b in dst]
        ok = (
            all(r.success for r in res)
            and len(res) == 2
            and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        )
        ok = ok and (w.host_pool.pinned or not cuda)
        failures += not ok
        times = ", ".join(f"{r.transfer_type[0]}->{r.transfer_type[1]} {r.transfer_time * 1e6:.0f} us" for r in res)
        print(
            f"smoke {path:>6} on {dev} ({backend}): {'PASS' if ok else 'FAIL'}  init {t_init:.1f} s  {times}",
            flush=True,
        )
        w.shutdown()
    return 1 if failures else 0


def _run(cmd: list[str], log: Path, timeout: float, append: bool = True) -> tuple[int, float]:
    """Run ``cmd`` with the checkout on PYTHONPATH, stdout+stderr into ``log``; (returncode, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    with log.open("a" if append else "w") as fh:
        fh.write(f"\n$ {' '.join(cmd)}  (timeout {timeout:.0f} s)\n")
        fh.flush()
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=max(1.0, timeout)
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            fh.write(f"\n[gpu-check] TIMEOUT after {timeout:.0f} s\n")
    return rc, time.perf_counter() - t0


def _pytest_counts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in re.finditer(r"(\d+) (passed|failed|errors?|skipped)", text):
        out[m.group(2).rstrip("s") if m.group(2).startswith("error") else m.group(2)] = int(m.group(1))
    return out


def _key_ratios(path: Path, section: str) -> str:
    try:
        res = json.loads(path.read_text())["sections"][section]["results"]
    except (OSError, KeyError, ValueError):
        return f"{section}: no results"
    parts = []
    for k, v in res.get("summary", {}).items():
        flag = "" if v.get("met") is None else (" ok" if v["met"] else " MISS")
        parts.append(f"{k}={v['min']:.2f}{flag}")
    return f"{section}: " + (" ".join(parts) or "no rows") + (" (truncated)" if res.get("truncated") else "")


def _job_overhead(log: Path) -> str:
    """A ~1k-page job of 4 KiB pages (16 programs): the host's µs per job, single and merged, the
    kernel alone and the contiguous copy P, from ``probe_job_overhead.py``'s JSON lines in ``log``."""
    rows = []
    try:
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                if (row.get("page_bytes"), row.get("pages"), row.get("programs")) == (4096, 1024, 16):
                    rows.append(row)
    except (OSError, ValueError):
        pass
    if not rows:
        return "job overhead: no results"
    return "1k-page 4 KiB job, host/merged/kernel/P us: " + " ".join(
        f"{r['direction']}={r['host']:.0f}/{r['host_merged']:.0f}/{r['kernel']:.0f}/{r['P']:.0f}" for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="first-GPU-run check (see the module docstring)")
    ap.add_argument("--out", type=Path, required=False, default=ROOT / "gpu-check-out")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="total time budget (default 8 minutes)")
    ap.add_argument("--step", choices=["env", "smoke"], help=argparse.SUPPRESS)
    # runs the GPU-only steps on whatever device there is (to test this script on a CPU machine)
    ap.add_argument("--all-steps", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step == "env":
        print(_env_report())
        return 0
    if args.step == "smoke":
        return _smoke()

    import torch  # only to know whether there is a GPU; the steps run in their own processes

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    py, me = sys.executable, str(Path(__file__).resolve())
    gpu = torch.cuda.is_available()
    run_all = gpu or args.all_steps
    steps: list[tuple[str, int, float]] = []

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def step(name: str, cmd: list[str], log: str, timeout: float) -> int:
        rc, secs = _run(cmd, out / log, min(timeout, max(5.0, left())))
        steps.append((name, rc, secs))
        print(
            f"[gpu-check] {name}: {'ok' if rc == 0 else f'FAILED (rc {rc})'} in {secs:.0f} s -> {out / log}", flush=True
        )
        return rc

    if not gpu:
        print("[gpu-check] no GPU: torch.cuda.is_available() is False; running the CPU-runnable steps only", flush=True)
    step("env", [py, me, "--step", "env"], "env.txt", 60)
    step("smoke", [py, me, "--step", "smoke"], "smoke.log", 180)
    tests: dict[str, int] = {}
    if run_all:
        step(
            "gpu tests",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"],
            "gpu-tests.log",
            170,
        )
        step(
            "conformance on cuda",
            [
                py,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "kvoffload.testing.plugin",
                "--pyargs",
                "kvoffload.testing",
                "--kvoffload-device=cuda",
            ],
            "gpu-tests.log",
            90,
        )
        log = (out / "gpu-tests.log").read_text()
        for chunk in log.split("\n$ ")[1:]:
            for k, v in _pytest_counts(chunk[-2000:]).items():
                tests[k] = tests.get(k, 0) + v
        bench = str(ROOT / "bench" / "bench_transfer.py")
        for progs in (16, 64):
            step(
                f"bench quick p{progs}",
                [py, "-c", _BENCH_SECTION.format(bench=bench, progs=progs, out=str(out / "bench-quick.json"))],
                "bench.log",
                90,
            )
        step(
            "job overhead",
            [py, str(ROOT / "bench" / "probe_job_overhead.py"), "--programs", "16,64", "--profile"],
            "bench.log",
            90,
        )
        step(
            "bench full",
            [
                py,
                bench,
                "--max-programs",
                "16",
                "--out",
                str(out / "bench-full.json"),
                "--plot",
                str(out / "bench-full.png"),
                "--budget-s",
                str(max(0.0, left() - 60)),
            ],
            "bench.log",
            left(),
        )
    failed = [n for n, rc, _ in steps if rc != 0]
    ratios = []
    if run_all:
        ratios = [
            _key_ratios(out / "bench-quick.json", "p16"),
            _key_ratios(out / "bench-quick.json", "p64"),
            _key_ratios(out / "bench-full.json", "transfer"),
            _job_overhead(out / "bench.log"),
        ]
    summary = (
        f"gpu-check summary: {'GPU' if gpu else 'no GPU'}; steps {len(steps) - len(failed)}/{len(steps)} ok"
        + (f" (failed: {', '.join(failed)})" if failed else "")
        + (f"; tests {tests}" if run_all else "")
        + ("; " + " | ".join(ratios) if ratios else "")
        + f"; {time.perf_counter() - t_start:.0f} s"
    )
    (out / "summary.txt").write_text(
        "\n".join(f"{n}: rc {rc} in {s:.0f} s" for n, rc, s in steps) + "\n" + summary + "\n"
    )
    print(summary, flush=True)
    return 0 if (not gpu or not failed) else 1


# one quick benchmark run written as its own section of bench-quick.json
_BENCH_SECTION = (
    "import sys; sys.argv=['bench_transfer']; import runpy; m = runpy.run_path({bench!r}); "
    "r = m['run'](quick=True, max_programs={progs}); "
    "m['common'].write_section('p{progs}', r, {out!r})"
)

if __name__ == "__main__":
    sys.exit(main())
