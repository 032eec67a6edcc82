"""Benchmark of the secondary tiers against the stores' own tools, in the same run on the same machine.

Run: ``python bench/bench_tiers.py [--quick] [--only redis|disk]``. Writes the ``tiers`` section
of ``bench/results/<machine>.json`` (unless ``--no-write``; with ``--only`` just that part of it).
Needs ``redis-server``, ``redis-benchmark`` and ``fio`` (Debian: ``apt-get install -y redis-server redis-tools fio``).

1. **Redis tier** against a local ``redis-server`` (persistence off, ``allkeys-lru``): for
   1, 2 and 4 MiB records, ``RedisTier`` store GB/s (``SET NX`` pipelines, header included in
   the value, payload bytes counted) and load GB/s (``GET`` pipelines into the host records,
   checksum verified), against ``redis-benchmark -t set,get -d <record bytes> -P 8 -c 8`` on
   the same server. Goal: >= 0.8x the baseline. Beside it, alternated in the same repetition, the
   load path that receives each value whole into a buffer and copies it into its record
   (``copy_load_gbps``; ``load_vs_copy_ratio``, goal >= 1.1x).
2. **Disk tier** in a directory of the filesystem given by ``--dir`` (default: the system temp
   directory): ``DiskTier`` store and load GB/s (O_DIRECT where the filesystem accepts it; host
   records page aligned, as the host pool's are; the tier's default ``io_threads``) against
   ``fio --direct=1 --ioengine=psync`` sequential write and read at ``--bs=<record bytes>``,
   same directory, same total bytes, in two job shapes: one job on one file (the textbook
   sequential stream) and ``io_threads`` jobs each on its own file (the tier's concurrency).
   The baseline is the better of the two, per direction. Goal: >= 0.8x. Every run's figures
   are kept, and the ratios of the medians are given beside those of the bests. For reference (not the
   goal) also fio writing one new file per record (``--nrfiles --create_on_open``), the work the
   tier really does: a file per block, created then written.

Each pair is measured ``--reps`` times interleaved (baseline then ours, then ours then baseline...,
after a ``sync``), and the
best of each is reported with the ratio: the machine may be shared, the best run is the least
disturbed one. No targets are asserted here; the figures are reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import mmap
import os
import shutil
import statistics
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
from kvoffload.tiers.redis.io import get_into

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


class CopyingRedisTier(RedisTier):
    """The Redis tier's load path before loads landed in the host record: each value is received
    whole into a per-thread buffer, checked there, then copied into its record (the baseline of
    ``copy_load_gbps``)."""

    def _load_batch(self, keys: list[bytes], slots: np.ndarray) -> list[bool]:
        sk = [self._prefix + k for k in keys]
        sizes = [self.codec.value_bytes(k) for k in keys]
        buf = self._headers(sum(sizes))
        dests, offset = [], 0
        for n in sizes:
            dests.append(buf[offset : offset + n])
            offset += n
        replies = self._nodes.run(
            sk, lambda pool, idx, asking: get_into(pool, [sk[i] for i in idx], [dests[i] for i in idx], asking)
        )
        ok = []
        for i, r in enumerate(replies):
            good = isinstance(r, int) and not isinstance(r, bool)
            if good:
                self.records[slots[i]] = np.frombuffer(self.codec.check(keys[i], dests[i]), dtype=np.uint8)
            ok.append(good)
        return ok


def bench_redis(record_mib: list[int], total_mib: int, reps: int, workdir: Path) -> list[dict[str, Any]]:
    srv = RedisServer(workdir / "redis", maxmemory=f"{3 * total_mib + 512}mb").start()
    rows = []
    try:
        for mib in record_mib:
            rb = mib * MIB
            n = max(8, total_mib // mib)
            records = np.random.default_rng(mib).integers(0, 256, (n, rb), dtype=np.uint8)
            tier = RedisTier(records, NS, srv.url, max_pending_write_bytes=n * rb)
            copying = CopyingRedisTier(records, NS, srv.url, max_pending_write_bytes=n * rb)
            base: list[dict[str, float]] = []
            ours: list[tuple[float, float]] = []
            copy_loads: list[float] = []
            try:
                for r in range(reps):
                    srv.cli("flushall")
                    base.append(redis_benchmark(srv.port, rb, n * 4))
                    srv.cli("flushall")
                    keys = _keys(n, f"r{mib}-{r}")
                    st = _timed_job(tier, "store", keys, list(range(n)))
                    slots = list(range(n))[::-1]
                    for first in (copying, tier) if r % 2 else (tier, copying):  # alternated
                        ld = _timed_job(first, "load", keys, slots)
                        if first is tier:
                            ours.append((n * rb / st / 1e9, n * rb / ld / 1e9))
                        else:
                            copy_loads.append(n * rb / ld / 1e9)
            finally:
                tier.close()
                copying.close()
            row = {
                "record_mib": mib,
                "records": n,
                "baseline_set_gbps": round(max(b["set_gbps"] for b in base), 3),
                "baseline_get_gbps": round(max(b["get_gbps"] for b in base), 3),
                "tier_store_gbps": round(max(o[0] for o in ours), 3),
                "tier_load_gbps": round(max(o[1] for o in ours), 3),
            }
            row["copy_load_gbps"] = round(max(copy_loads), 3)
            row["load_vs_copy_ratio"] = round(row["tier_load_gbps"] / row["copy_load_gbps"], 2)
            row["store_ratio"] = round(row["tier_store_gbps"] / row["baseline_set_gbps"], 2)
            row["load_ratio"] = round(row["tier_load_gbps"] / row["baseline_get_gbps"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    return rows


def fio(directory: Path, rw: str, record_bytes: int, total_bytes: int, jobs: int = 1) -> float:
    """GB/s of ``fio --direct=1`` sequential ``rw`` at block size ``record_bytes``.

    ``jobs`` jobs, each on its own file of ``total_bytes / jobs`` (fio names them in ``directory``).
    """
    out = subprocess.run(
        ["fio", "--name=seq", f"--directory={directory}", f"--rw={rw}", f"--bs={record_bytes}",
         f"--size={total_bytes // jobs}", "--direct=1", "--ioengine=psync", f"--numjobs={jobs}",
         "--group_reporting", "--output-format=json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    side = job["write" if rw == "write" else "read"]
    return float(side["bw_bytes"]) / 1e9


def fio_file_per_record(directory: Path, record_bytes: int, count: int) -> float:
    """GB/s of one fio job writing ``count`` new files of one record each (created when written)."""
    out = subprocess.run(
        ["fio", "--name=files", f"--directory={directory}", "--rw=write", f"--bs={record_bytes}",
         f"--filesize={record_bytes}", f"--nrfiles={count}", "--file_service_type=sequential",
         "--create_on_open=1", "--direct=1", "--ioengine=psync", "--output-format=json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    return float(job["write"]["bw_bytes"]) / 1e9


def _aligned_records(n: int, record_bytes: int, seed: int) -> tuple[np.ndarray, mmap.mmap]:
    """``n`` random records in page-aligned anonymous memory (as the host pool allocates them)."""
    mm = mmap.mmap(-1, n * record_bytes)
    records = np.frombuffer(mm, dtype=np.uint8).reshape(n, record_bytes)
    records[:] = np.random.default_rng(seed).integers(0, 256, (n, record_bytes), dtype=np.uint8)
    return records, mm


def bench_disk(record_mib: list[int], total_mib: int, reps: int, base_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for mib in record_mib:
        rb = mib * MIB
        n = max(8, total_mib // mib)
        records, _mm = _aligned_records(n, rb, mib)
        fio_w: dict[str, list[float]] = {"1job": [], "njobs": [], "file_per_record": []}
        fio_r: dict[str, list[float]] = {"1job": [], "njobs": []}
        ours_w, ours_r = [], []
        o_direct, threads = None, 0
        for r in range(reps):
            d = Path(tempfile.mkdtemp(prefix="kvoffload-bench-", dir=base_dir))
            try:
                tier = DiskTier(records, NS, d / "tier", max_pending_write_bytes=n * rb)
                with tier:
                    o_direct, threads = tier.o_direct, tier.io_threads

                    # alternate the order: what ran just before (a burst of writes) slows what follows
                    for stage in ("fio", "tier") if r % 2 == 0 else ("tier", "fio"):
                        if stage == "tier":
                            keys = _keys(n, f"d{mib}-{r}")
                            os.sync()
                            ours_w.append(n * rb / _timed_job(tier, "store", keys, list(range(n))) / 1e9)
                            ours_r.append(n * rb / _timed_job(tier, "load", keys, list(range(n))[::-1]) / 1e9)
                            continue
                        for shape, jobs in (("1job", 1), ("njobs", threads)):
                            (d / "fio").mkdir()
                            os.sync()
                            fio_w[shape].append(fio(d / "fio", "write", rb, n * rb, jobs))
                            fio_r[shape].append(fio(d / "fio", "read", rb, n * rb, jobs))
                            shutil.rmtree(d / "fio")
                        (d / "fio").mkdir()
                        os.sync()
                        fio_w["file_per_record"].append(fio_file_per_record(d / "fio", rb, n))
                        shutil.rmtree(d / "fio")
            finally:
                shutil.rmtree(d)
        best_w = {k: round(max(v), 3) for k, v in fio_w.items()}
        best_r = {k: round(max(v), 3) for k, v in fio_r.items()}
        row: dict[str, Any] = {
            "record_mib": mib,
            "records": n,
            "o_direct": o_direct,
            "io_threads": threads,
            "fio_write_gbps": max(best_w["1job"], best_w["njobs"]),
            "fio_read_gbps": max(best_r["1job"], best_r["njobs"]),
            "tier_store_gbps": round(max(ours_w), 3),
            "tier_load_gbps": round(max(ours_r), 3),
        }
        row["store_ratio"] = round(row["tier_store_gbps"] / row["fio_write_gbps"], 2)
        row["load_ratio"] = round(row["tier_load_gbps"] / row["fio_read_gbps"], 2)
        row["fio_write_gbps_by_shape"] = best_w
        row["fio_read_gbps_by_shape"] = best_r
        row["store_ratio_vs_file_per_record"] = round(row["tier_store_gbps"] / best_w["file_per_record"], 2)
        # the medians too: on a shared machine a single lucky baseline run can set the best
        med_w = max(statistics.median(fio_w["1job"]), statistics.median(fio_w["njobs"]))
        med_r = max(statistics.median(fio_r["1job"]), statistics.median(fio_r["njobs"]))
        row["store_ratio_of_medians"] = round(statistics.median(ours_w) / med_w, 2)
        row["load_ratio_of_medians"] = round(statistics.median(ours_r) / med_r, 2)
        row["runs_gbps"] = {
            "tier_store": [round(x, 3) for x in ours_w],
            "tier_load": [round(x, 3) for x in ours_r],
            **{f"fio_write_{k}": [round(x, 3) for x in v] for k, v in fio_w.items()},
            **{f"fio_read_{k}": [round(x, 3) for x in v] for k, v in fio_r.items()},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(quick: bool, reps: int = 3, disk_dir: Path | None = None, only: str | None = None) -> dict[str, Any]:
    """The ``tiers`` section (the interface of every ``bench_*.run``; ``disk_dir`` defaults to the temp dir).

    ``only`` (``"redis"`` or ``"disk"``) measures just that part; the other key is then absent.
    """
    disk_dir = Path(tempfile.gettempdir()) if disk_dir is None else disk_dir
    tools = {"redis": ("redis-server", "redis-benchmark"), "disk": ("fio",)}
    for part, names in tools.items():
        for tool in names if only in (None, part) else ():
            if shutil.which(tool) is None:
                raise SystemExit(f"bench_tiers needs {tool} (apt-get install -y redis-server redis-tools fio)")
    sizes = [1, 4] if quick else [1, 2, 4]
    total = 256 if quick else 512
    out: dict[str, Any] = {}
    if only in (None, "redis"):
        load = _load_avg()
        with tempfile.TemporaryDirectory(prefix="kvoffload-bench-redis-") as wd:
            out["redis"] = bench_redis(sizes, total, reps, Path(wd))
        out["redis_load_avg"] = [load, _load_avg()]
    if only in (None, "disk"):
        load = _load_avg()
        out["disk"] = bench_disk(sizes, total, reps, disk_dir)
        out["disk_load_avg"] = [load, _load_avg()]
        out["disk_dir"] = str(disk_dir)
    out.update(
        reps=reps,
        total_mib_per_size=total,
        goal=">= 0.8x the baseline (redis-benchmark -P 8 -c 8; fio --direct=1, the better of 1 job and "
        "io_threads jobs), same run",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB records, 256 MiB per size")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (best reported)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="directory of the disk-tier runs")
    parser.add_argument("--only", choices=("redis", "disk"), default=None, help="measure only this part")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/<machine>.json")
    parser.add_argument("--out", default=None, help="results JSON path")
    args = parser.parse_args(argv)
    result = run(args.quick, args.reps, Path(args.dir), args.only)
    if not args.no_write:
        common = _load_sibling("common")
        if args.only is not None:  # keep the other part's figures, with the provenance they came with
            prev = common.read_results(args.out or common.results_path()).get("sections", {}).get("tiers", {})
            merged = dict(prev.get("results", {}))
            parts = dict(merged.pop("provenance_by_part", {}))
            for part in ("redis", "disk"):
                parts.setdefault(part, prev.get("provenance"))
            parts[args.only] = common.provenance()
            merged.update(result)
            merged["provenance_by_part"] = parts
            result = merged
        path = common.write_section("tiers", result, args.out)
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
