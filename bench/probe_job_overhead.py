"""Where does a small transfer job's time go on a GPU? The host's submit, the kernel alone, the link.

``python bench/probe_job_overhead.py [--programs 16,32,64,132] [--profile]`` (CUDA machine, about
a minute): bench_transfer's Llama-8B-like cache at 4 KiB and 32 KiB pages, jobs of 1,024 and
4,096 pages at random blocks and slots, submitted through :class:`TransferWorker` (the engine's
path: checks, job table, bound kernel, events) on the direct path. Per case, medians in µs:

* ``host``: wall time of one ``transfer_async`` (the host's work per job, driver calls included);
* ``host_merged``: per job, 16 jobs submitted with ``merge=True`` and flushed, / 16;
* ``kernel``: the kernel alone -- the worker's own timing events around a launch that was already
  enqueued when the GPU reached them (its stream held by a spin kernel while the host submits),
  so no host work is inside;
* ``alone``: the worker's events for a job submitted to an idle stream (the launch's own latency
  inside);
* ``P``: one contiguous ``cudaMemcpyAsync`` of the same bytes; ``kernel_vs_P`` = P / kernel.

One JSON line per case (``entry``: how the bound kernel launches). ``--profile``: then the 25
functions with the most own time over 200 submits of the 1,024-page 4 KiB store, under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import runpy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvoffload.core.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.transfer.worker import TransferWorker
from kvoffload.transfer.worker_args import resolve_backend

_SPIN_CYCLES = 2_000_000  # ~1 ms at 2 GHz: longer than the host's submit


def _specs(rng: Any, blocks: int, num_blocks: int, num_slots: int, store: bool) -> Any:
    gpu = GPULoadStoreSpec(rng.permutation(num_blocks)[:blocks])
    cpu = CPULoadStoreSpec(rng.permutation(num_slots)[:blocks])
    return (gpu, cpu) if store else (cpu, gpu)


def _timed(w: TransferWorker, jid: int, spec: Any, hold: bool) -> float:
    """The worker's own timing (µs) of one job; ``hold``: its stream held by a spin kernel first."""
    torch.cuda.synchronize()
    if hold:
        with torch.cuda.stream(w._jobs.stream):  # type: ignore[union-attr]
            torch.cuda._sleep(_SPIN_CYCLES)
    w.transfer_async(jid, spec)  # after the current stream, idle here: the spin alone holds the worker's
    w.wait([jid])
    (res,) = w.get_finished()
    assert res.success
    return res.transfer_time * 1e6


def _case(w: TransferWorker, merged: TransferWorker, specs: list[Any], nbytes: int) -> dict[str, float]:
    host, host_merged, kernel, alone = [], [], [], []
    jid = 0
    for spec in specs[:5]:  # warm-up
        jid += 1
        w.transfer_async(jid, spec)
    torch.cuda.synchronize()
    w.get_finished()
    for i in range(30):
        torch.cuda.synchronize()
        jid += 1
        t0 = time.perf_counter()
        w.transfer_async(jid, specs[i % len(specs)])
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        w.get_finished()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k in range(16):
            merged.transfer_async(1000 * i + k, specs[(i + k) % len(specs)])
        merged.flush()
        host_merged.append((time.perf_counter() - t0) * 1e6 / 16)
        torch.cuda.synchronize()
        merged.get_finished()
        jid += 1
        kernel.append(_timed(w, jid, specs[i % len(specs)], hold=True))
        jid += 1
        alone.append(_timed(w, jid, specs[i % len(specs)], hold=False))
    dst = torch.empty(nbytes, dtype=torch.uint8, device=w.device)
    src = w.host_pool.buffer[:nbytes]
    peak = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        torch.cuda.synchronize()
        peak.append(a.elapsed_time(b) * 1e3)
    out = {
        "host": statistics.median(host),
        "host_merged": statistics.median(host_merged),
        "kernel": statistics.median(kernel),
        "alone": statistics.median(alone),
        "P": statistics.median(peak),
    }
    out = {k: round(v, 1) for k, v in out.items()}
    out["kernel_vs_P"] = round(out["P"] / out["kernel"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", default="16", help="grid caps to try, comma-separated")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    sys.argv = ["bench_transfer"]
    m = runpy.run_path(str(Path(__file__).with_name("bench_transfer.py")))
    dev = torch.device("cuda", 0)
    shape = m["SHAPES"][0]
    rng = np.random.default_rng(7)
    for page in (4096, 32768):
        bs = shape.block_size_for(page)
        num_blocks = 2 * 4096 // shape.num_views
        table = m["_make_table"](shape, bs, num_blocks, dev)
        num_slots = num_blocks
        for programs in (int(p) for p in args.programs.split(",")):
            backend = resolve_backend("triton", dev, programs)
            w = TransferWorker(table, num_slots, backend=backend, path="direct")
            merged = TransferWorker(table, num_slots, backend=backend, path="direct", merge=True)
            for pages in (1024, 4096):
                blocks = pages // shape.num_views
                for store in (True, False):
                    specs = [_specs(rng, blocks, num_blocks, num_slots, store) for _ in range(8)]
                    row = {"page_bytes": page, "pages": pages, "programs": programs}
                    row["direction"] = "pack" if store else "unpack"
                    row["entry"] = w.kernel.entry if w.kernel is not None else "none"
                    row.update(_case(w, merged, specs, blocks * table.groups[0].record_bytes))
                    print(json.dumps(row), flush=True)
                    if args.profile and page == 4096 and pages == 1024 and store and programs == 16:
                        prof = cProfile.Profile()
                        for i in range(200):
                            prof.enable()
                            w.transfer_async(10**6 + i, specs[i % len(specs)])
                            prof.disable()
                            torch.cuda.synchronize()
                            w.get_finished()
                        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            w.shutdown()
            merged.shutdown()


if __name__ == "__main__":
    main()
