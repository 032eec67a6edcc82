"""Benchmark of the secondary tiers against the stores' own tools, in the same run on the same machine.

Run: ``python bench/bench_tiers.py [--quick]``. Writes the ``tiers`` section of
``bench/results/<machine>.json`` (unless ``--no-write``). Needs ``redis-server``,
``redis-benchmark`` and ``fio`` (Debian: ``apt-get install -y redis-server redis-tools fio``).

1. **Redis tier** against a local ``redis-server`` (persistence off, ``allkeys-lru``): for
   1, 2 and 4 MiB records, ``RedisTier`` store GB/s (``SET NX`` pipelines, header included in
   the value, payload bytes counted) and load GB/s (``GET`` pipelines into the host records,
   checksum verified), against ``redis-benchmark -t set,get -d <record bytes> -P 8 -c 8`` on
   the same server. Goal: >= 0.8x the baseline.
2. **Disk tier** in a directory of the filesystem given by ``--dir`` (default: the system temp
   directory): ``DiskTier`` store and load GB/s (O_DIRECT where the filesystem accepts it)
   against ``fio --direct=1`` sequential write and read at the record size, same directory,
   same total bytes. Goal: >= 0.8x.

Each pair is measured ``--reps`` times interleaved (baseline, ours, baseline, ours...), and the
best of each is reported with the ratio: the machine may be shared, the best run is the least
disturbed one. No targets are asserted here; the figures are reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kvoffload.testing.redis_server import RedisServer
from kvoffload.tiers import DiskTier, RedisTier, TierNamespace

MIB = 1 << 20
NS = TierNamespace("bench/model", "float16", "float16", "flash_attn", (32, 16, 8, 128), 16)


def _load_sibling(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _keys(n: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:08d}".encode().ljust(32, b".") + (0).to_bytes(4, "big") for i in range(n)]


def _timed_job(tier: Any, kind: str, keys: list[bytes], slots: list[int]) -> float:
    """Seconds from submission to the last key done; asserts every key succeeded."""
    t0 = time.perf_counter()
    (tier.submit_store if kind == "store" else tier.submit_load)(1, keys, slots)
    assert tier.drain(timeout=600)
    dt = time.perf_counter() - t0
    (res,) = tier.get_finished()
    assert res.success, f"{kind}: {res.ok.count(False)} keys failed ({tier.stats()})"
    return dt


def redis_benchmark(port: int, record_bytes: int, requests: int) -> dict[str, float]:
    """``redis-benchmark -t set,get -d B -P 8 -c 8``: GB/s of SET and GET values."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-t", "set,get", "-d", str(record_bytes), "-P", "8", "-c", "8",
         "-n", str(requests), "--csv"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    rps = {}
    for line in out.stdout.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] in ("SET", "GET"):
            rps[cells[0]] = float(cells[1])
    return {"set_gbps": rps["SET"] * record_bytes / 1e9, "get_gbps": rps["GET"] * record_bytes / 1e9}


def bench_redis(record_mib: list[int], total_mib: int, reps: int, workdir: Path) -> list[dict[str, Any]]:
    srv = RedisServer(workdir / "redis", maxmemory=f"{3 * total_mib + 512}mb").start()
    rows = []
    try:
        for mib in record_mib:
            rb = mib * MIB
            n = max(8, total_mib // mib)
            records = np.random.default_rng(mib).integers(0, 256, (n, rb), dtype=np.uint8)
            tier = RedisTier(records, NS, srv.url, max_pending_write_bytes=n * rb)
            base: list[dict[str, float]] = []
            ours: list[tuple[float, float]] = []
            try:
                for r in range(reps):
                    srv.cli("flushall")
                    base.append(redis_benchmark(srv.port, rb, n * 4))
                    srv.cli("flushall")
                    keys = _keys(n, f"r{mib}-{r}")
                    st = _timed_job(tier, "store", keys, list(range(n)))
                    ld = _timed_job(tier, "load", keys, list(range(n))[::-1])
                    ours.append((n * rb / st / 1e9, n * rb / ld / 1e9))
            finally:
                tier.close()
            row = {
                "record_mib": mib,
                "records": n,
                "baseline_set_gbps": round(max(b["set_gbps"] for b in base), 3),
                "baseline_get_gbps": round(max(b["get_gbps"] for b in base), 3),
                "tier_store_gbps": round(max(o[0] for o in ours), 3),
                "tier_load_gbps": round(max(o[1] for o in ours), 3),
            }
            row["store_ratio"] = round(row["tier_store_gbps"] / row["baseline_set_gbps"], 2)
            row["load_ratio"] = round(row["tier_load_gbps"] / row["baseline_get_gbps"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    return rows


def fio(directory: Path, rw: str, record_bytes: int, total_bytes: int) -> float:
    """GB/s of ``fio --direct=1`` sequential ``rw`` at block size ``record_bytes``."""
    out = subprocess.run(
        ["fio", "--name=seq", f"--filename={directory / 'fio.dat'}", f"--rw={rw}", f"--bs={record_bytes}",
         f"--size={total_bytes}", "--direct=1", "--ioengine=psync", "--numjobs=1", "--output-format=json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    return float(side["bw_bytes"]) / 1e9


def bench_disk(record_mib: list[int], total_mib: int, reps: int, base_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for mib in record_mib:
        rb = mib * MIB
        n = max(8, total_mib // mib)
        records = np.random.default_rng(mib).integers(0, 256, (n, rb), dtype=np.uint8)
        base_w, base_r, ours_w, ours_r = [], [], [], []
        o_direct = None
        for r in range(reps):
            d = Path(tempfile.mkdtemp(prefix="kvoffload-bench-", dir=base_dir))
            try:
                base_w.append(fio(d, "write", rb, n * rb))
                base_r.append(fio(d, "read", rb, n * rb))
                (d / "fio.dat").unlink()
                with DiskTier(records, NS, d / "tier", max_pending_write_bytes=n * rb) as tier:
                    o_direct = tier.o_direct
                    keys = _keys(n, f"d{mib}-{r}")
                    ours_w.append(n * rb / _timed_job(tier, "store", keys, list(range(n))) / 1e9)
                    ours_r.append(n * rb / _timed_job(tier, "load", keys, list(range(n))[::-1]) / 1e9)
            finally:
                shutil.rmtree(d)
        row = {
            "record_mib": mib,
            "records": n,
            "o_direct": o_direct,
            "fio_write_gbps": round(max(base_w), 3),
            "fio_read_gbps": round(max(base_r), 3),
            "tier_store_gbps": round(max(ours_w), 3),
            "tier_load_gbps": round(max(ours_r), 3),
        }
        row["store_ratio"] = round(row["tier_store_gbps"] / row["fio_write_gbps"], 2)
        row["load_ratio"] = round(row["tier_load_gbps"] / row["fio_read_gbps"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def run(quick: bool, reps: int = 3, disk_dir: Path | None = None) -> dict[str, Any]:
    """The ``tiers`` section (the interface of every ``bench_*.run``; ``disk_dir`` defaults to the temp dir)."""
    disk_dir = Path(tempfile.gettempdir()) if disk_dir is None else disk_dir
    for tool in ("redis-server", "redis-benchmark", "fio"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench_tiers needs {tool} (apt-get install -y redis-server redis-tools fio)")
    sizes = [1, 4] if quick else [1, 2, 4]
    total = 256 if quick else 512
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-redis-") as wd:
        redis_rows = bench_redis(sizes, total, reps, Path(wd))
    disk_rows = bench_disk(sizes, total, reps, disk_dir)
    return {
        "redis": redis_rows,
        "disk": disk_rows,
        "disk_dir": str(disk_dir),
        "reps": reps,
        "total_mib_per_size": total,
        "goal": ">= 0.8x the baseline (redis-benchmark -P 8 -c 8; fio --direct=1), same run",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB records, 256 MiB per size")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (best reported)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="directory of the disk-tier runs")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/<machine>.json")
    parser.add_argument("--out", default=None, help="results JSON path")
    args = parser.parse_args(argv)
    result = run(args.quick, args.reps, Path(args.dir))
    if not args.no_write:
        path = _load_sibling("common").write_section("tiers", result, args.out)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
