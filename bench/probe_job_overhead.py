"""Where does a small transfer job's time go? Host enqueue, pipelined and isolated GPU time, kernel alone.

``python bench/probe_job_overhead.py`` (CUDA machine, ~1 minute): bench_transfer's Llama-8B-like
cache at 4 KiB pages, jobs of 1,024 and 4,096 pages at random blocks and slots of a 2 GiB pinned
pool, the direct path at 16, 32, 64 and 132 programs. Per case, medians in microseconds:

* ``host``: the wall time of one ``DataPath.pack``/``unpack`` call (enqueue only, no sync);
* ``piped``: per job, 50 jobs enqueued back to back between two CUDA events (host work overlaps
  the GPU's);
* ``alone``: one job between two CUDA events, synchronised before and after (host enqueue work
  the GPU waits for counts), as ``bench_transfer`` times a job;
* ``kernel``: the same, but only the kernel launch of a job checked beforehand (no checks, no
  path choice);
* ``P``: one contiguous ``cudaMemcpyAsync`` of the same bytes, alone.

One JSON line per case. ``--profile``: then the top 25 functions (own time) of 200 host calls of
the 1,024-page pack at 16 programs, under cProfile.
"""

from __future__ import annotations

import cProfile
import functools
import json
import pstats
import runpy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from kvoffload.kernels.job import validate_job
from kvoffload.kernels.paths import DataPath
from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.worker_args import resolve_backend


def _alone(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def _profile(op: Callable[[], object]) -> None:
    """The host path of ``op`` under cProfile: the 25 functions with the most own time."""
    prof = cProfile.Profile()
    for _ in range(200):
        prof.enable()
        op()
        prof.disable()
        torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    profile = "--profile" in sys.argv[1:]
    sys.argv = ["bench_transfer"]
    m = runpy.run_path(str(Path(__file__).with_name("bench_transfer.py")))
    dev = torch.device("cuda", 0)
    shape = m["SHAPES"][0]
    bs = shape.block_size_for(4096)
    table = m["_make_table"](shape, bs, 2 * (16384 // shape.num_views), dev)
    group = table.groups[0]
    pool = HostPool(1, 2 << 30, device=dev, pin=True)
    host = pool.buffer
    rng = np.random.default_rng(7)
    for pages in (1024, 4096):
        blocks = pages // shape.num_views
        b, g, o = m["_job"](rng, group.num_blocks, blocks, group.record_bytes, host.numel())
        nbytes = blocks * group.record_bytes
        contiguous = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        for programs in (16, 32, 64, 132):
            dp = DataPath(resolve_backend("triton", dev, programs), table, "direct")
            for to_host in (True, False):
                op = dp.pack if to_host else dp.unpack
                job = validate_job(table, host, b, g, o, to_host=to_host)
                for _ in range(5):
                    op(host, b, g, o)
                torch.cuda.synchronize()
                host_us = []
                for _ in range(50):
                    t0 = time.perf_counter()
                    op(host, b, g, o)
                    host_us.append((time.perf_counter() - t0) * 1e6)
                    torch.cuda.synchronize()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(50):
                    op(host, b, g, o)
                e1.record()
                torch.cuda.synchronize()
                piped = e0.elapsed_time(e1) * 1e3 / 50
                alone = _alone(functools.partial(op, host, b, g, o), 30)
                kernel = _alone(functools.partial(dp.backend._copy, job, to_host), 30)
                dst, src = (host[:nbytes], contiguous) if to_host else (contiguous, host[:nbytes])
                peak = _alone(functools.partial(dst.copy_, src, non_blocking=True), 30)
                row = {
                    "pages": pages,
                    "programs": programs,
                    "direction": "pack" if to_host else "unpack",
                    "host": round(statistics.median(host_us), 1),
                    "piped": round(piped, 1),
                    "alone": round(alone, 1),
                    "kernel": round(kernel, 1),
                    "P": round(peak, 1),
                }
                print(json.dumps(row), flush=True)
                if profile and pages == 1024 and programs == 16 and to_host:
                    _profile(functools.partial(op, host, b, g, o))


if __name__ == "__main__":
    main()
