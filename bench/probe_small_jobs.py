"""Is a small job's distance from the link peak a first-call effect or a per-call cost?

``python bench/probe_small_jobs.py`` (CUDA machine, ~10 s): bench_transfer's pool, tables and
timing; for 4 KiB pages (both shapes) and 8 KiB pages (llama8b), the direct and staged paths'
case of ~1k pages timed three times in a row on fresh random jobs, then ~4k pages, then ~1k again.
One line per case: ratio to the link peak P and the median time per job.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kvoffload.transfer.host_pool import HostPool


def main() -> None:
    sys.argv = ["bench_transfer"]
    m = runpy.run_path(str(Path(__file__).with_name("bench_transfer.py")))
    dev = torch.device("cuda", 0)
    methods = {k: v for k, v in m["_methods"](dev, 16, True)[0].items() if k in ("direct", "staged")}
    shapes, kib = m["SHAPES"], 1024
    page_sizes, counts = m["_plan"](True, False)
    pool = HostPool(1, m["pool_bytes"](page_sizes, counts), device=dev, pin=True)
    print("pool GiB", pool.nbytes / 2**30, flush=True)
    rng = np.random.default_rng(1234)
    with torch.cuda.stream(torch.cuda.Stream(dev)):
        for shape, page in ((shapes[0], 4 * kib), (shapes[1], 4 * kib), (shapes[0], 8 * kib)):
            bs = shape.block_size_for(page)
            table = m["_make_table"](shape, bs, 2 * max(max(1, c // shape.num_views) for c in counts), dev)
            m["_verify"](table, pool.buffer, methods, rng)
            for c in (1024, 1024, 1024, 4096, 1024):
                t0 = time.perf_counter()
                rows = m["_bench_case"](shape, table, pool.buffer, c, methods, rng, True, False)
                cells = " ".join(
                    f"{r['direction']}:{r['method']}={r['ratio_to_peak']:.2f}({r['ms'] * 1e3:.0f}us)" for r in rows
                )
                print(shape.name, page, c, cells, f"{time.perf_counter() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
