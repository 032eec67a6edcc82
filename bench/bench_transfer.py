"""Transfer benchmark: pack (GPU pages -> pinned host records) and unpack, against the link peak.

On a CUDA machine, for a Llama-8B-like cache (32 layers, flash-attn layout, K and V as separate
pages, 8 KV heads x 128, bf16) and an MLA-like cache (61 layers, 576-wide latent, bf16), page sizes
about 4, 8, 16, 32, 64 KiB and jobs of about 1k, 4k, 16k pages at random block permutations and
random host slots, it times in ONE run:

* ``triton``  -- one launch per job (``--max-programs``, default 16 programs);
* ``dma``     -- one ``cudaMemcpyAsync`` per page (what engines do today);
* ``torch``   -- the pure-torch reference;
* ``peak``    -- one large ``cudaMemcpyAsync`` of the same bytes between a contiguous GPU buffer
  and pinned host memory: the link peak ``P`` every other figure is divided by.

GPU timings use ``triton.testing.do_bench`` (median, CUDA events). Targets (issue 4): pack >= 0.9 P
and unpack >= 0.8 P at 32 KiB pages with <= 16 programs; triton >= 5x dma at 4-24 KiB pages.

On a CPU-only machine it measures the torch backend on CPU tensors against a plain memcpy
(``Tensor.copy_`` of the same bytes, contiguous) at small sizes, finishing in well under a minute.

Results go to ``bench/results/<machine-slug>.json`` (section ``transfer``; see
``bench/common.py``). Usage::

    python bench/bench_transfer.py [--quick] [--out PATH] [--max-programs N]

``run(quick) -> dict`` is the importable entry point (no file written).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:  # run as `python bench/bench_transfer.py` or imported with the repo root on sys.path
    from bench import common
except ImportError:  # pragma: no cover - depends on how the file is launched
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import common  # type: ignore[no-redef]

from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.registry import KernelBackend, available_backends, get_backend
from kvoffload.offload.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.offload.host_pool import HostPool
from kvoffload.offload.job_mapping import GroupGeometry, map_job

__all__ = ["Shape", "SHAPES", "run", "main"]

KIB = 1024


@dataclass(frozen=True)
class Shape:
    """A model's KV cache: ``layers`` tensors of ``layout``; ``token_bytes`` per token per page."""

    name: str
    layout: str
    layers: int
    token_dims: tuple[int, ...]  # dims after block_size
    dtype: torch.dtype

    @property
    def views_per_layer(self) -> int:
        return 2 if self.layout == "flash_attn" else 1

    @property
    def num_views(self) -> int:
        return self.layers * self.views_per_layer

    @property
    def token_bytes(self) -> int:
        return math.prod(self.token_dims) * torch.empty(0, dtype=self.dtype).element_size()

    def block_size_for(self, page_bytes: int) -> int:
        return max(1, round(page_bytes / self.token_bytes))

    def tensor_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        if self.layout == "flash_attn":
            return (2, num_blocks, block_size, *self.token_dims)
        return (num_blocks, block_size, *self.token_dims)


SHAPES = (
    Shape("llama8b", "flash_attn", 32, (8, 128), torch.bfloat16),  # page = block_size * 2 KiB
    Shape("mla", "mla", 61, (576,), torch.bfloat16),  # page = block_size * 1152 B (non power of two)
)


def _make_table(shape: Shape, block_size: int, num_blocks: int, device: torch.device) -> KVCacheTable:
    tensors = []
    for _ in range(shape.layers):
        t = torch.empty(shape.tensor_shape(num_blocks, block_size), dtype=shape.dtype, device=device)
        t.view(torch.uint8).random_()
        tensors.append(t)
    return KVCacheTable.from_tensors([tensors], shape.layout)


def _job(
    rng: np.random.Generator, num_gpu_blocks: int, blocks: int, record_bytes: int, host_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    block_ids = rng.permutation(num_gpu_blocks)[:blocks].astype(np.int64)
    slots = rng.permutation(host_bytes // record_bytes)[:blocks].astype(np.int64)
    return block_ids, np.zeros(blocks, dtype=np.int32), slots * record_bytes


# --------------------------------------------------------------------------- timing


def _time_cpu(fn: Callable[[], object], budget_s: float = 0.15, min_reps: int = 3, max_reps: int = 15) -> float:
    """Best wall time in ms after one warm-up call (the minimum: robust to other processes
    preempting a shared CPU)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def _time_gpu(fn: Callable[[], object], quick: bool) -> float:
    """Median GPU time in ms (CUDA events through triton.testing.do_bench)."""
    from triton.testing import do_bench

    warmup, rep = (5, 20) if quick else (10, 60)
    try:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except TypeError:  # older triton without return_mode
        return float(do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])[0])


# --------------------------------------------------------------------------- one case


def _bench_case(
    shape: Shape,
    block_size: int,
    table: KVCacheTable,
    pool: torch.Tensor,
    pages: int,
    backends: dict[str, KernelBackend],
    rng: np.random.Generator,
    gpu: bool,
    quick: bool,
) -> list[dict[str, Any]]:
    group = table.groups[0]
    blocks = max(1, pages // shape.num_views)
    job = _job(rng, group.num_blocks, blocks, group.record_bytes, pool.numel())
    nbytes = blocks * group.record_bytes
    dev = table.device
    contiguous = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host = pool[:nbytes]
    timer: Callable[[Callable[[], object]], float] = (lambda f: _time_gpu(f, quick)) if gpu else _time_cpu
    base = {
        "shape": shape.name,
        "block_size": block_size,
        "page_bytes": group.views[0].page_bytes,
        "pages": blocks * shape.num_views,
        "blocks": blocks,
        "bytes": nbytes,
    }
    rows = []
    for direction in ("pack", "unpack"):
        to_host = direction == "pack"
        if to_host:
            peak_fn = lambda: host.copy_(contiguous, non_blocking=gpu)  # noqa: E731
        else:
            peak_fn = lambda: contiguous.copy_(host, non_blocking=gpu)  # noqa: E731
        peak_ms = timer(peak_fn)
        peak_gbps = nbytes / peak_ms / 1e6
        rows.append(
            {
                **base,
                "direction": direction,
                "method": "peak" if gpu else "memcpy",
                "ms": peak_ms,
                "gbps": peak_gbps,
                "ratio_to_peak": 1.0,
            }
        )
        for name, be in backends.items():
            op = be.pack if to_host else be.unpack
            ms = timer(lambda op=op: op(table, pool, *job))
            gbps = nbytes / ms / 1e6
            rows.append(
                {
                    **base,
                    "direction": direction,
                    "method": name,
                    "ms": ms,
                    "gbps": gbps,
                    "ratio_to_peak": gbps / peak_gbps,
                }
            )
    return rows


def _verify(
    table: KVCacheTable, pool: torch.Tensor, backends: dict[str, KernelBackend], rng: np.random.Generator
) -> dict[str, bool]:
    """Each backend's pack of a few random blocks, then unpack into other blocks, byte-checked
    against the pages themselves (read with plain slicing, independent of every backend)."""
    group = table.groups[0]
    blocks = min(4, group.num_blocks // 2, pool.numel() // group.record_bytes)
    out = {}
    for name, be in backends.items():
        ids, gids, offs = _job(rng, group.num_blocks, 2 * blocks, group.record_bytes, pool.numel())
        src, dst, offs = ids[:blocks], ids[blocks:], offs[:blocks]
        gids = gids[:blocks]
        for off in offs.tolist():
            pool[off : off + group.record_bytes].zero_()
        be.pack(table, pool, src, gids, offs)
        be.unpack(table, pool, dst, gids, offs)
        if table.device.type == "cuda":
            torch.cuda.synchronize(table.device)
        ok = True
        for s_id, d_id, off in zip(src.tolist(), dst.tolist(), offs.tolist(), strict=True):
            rec = pool[off : off + group.record_bytes]
            want = torch.cat([v.pages[s_id].cpu() for v in group.views])
            got = torch.cat([v.pages[d_id].cpu() for v in group.views])
            ok = ok and torch.equal(rec, want) and torch.equal(got, want)
        out[name] = ok
    return out


def _map_job_overhead(quick: bool) -> dict[str, float]:
    """Host cost (µs) of turning a spec pair into per-block arrays, 3 groups, factor 4."""
    out = {}
    rng = np.random.default_rng(0)
    geom = GroupGeometry(
        record_bytes=np.array([64 * 32768, 61 * 36864, 0], dtype=np.int64),
        num_gpu_blocks=np.array([1 << 20] * 3, dtype=np.int64),
        factors=np.array([4, 4, 4], dtype=np.int64),
        slot_bytes=4 * 64 * 32768,
        num_slots=1 << 20,
    )
    for n in (16, 256) if quick else (16, 256, 4096):
        sizes = [n, n, n // 2]
        gpu = GPULoadStoreSpec(rng.permutation(1 << 20)[: sum(sizes)], sizes, [1, 0, 3])
        need = sum((i % 4 + s + 3) // 4 for s, i in zip(sizes, [1, 0, 3], strict=True))
        cpu = CPULoadStoreSpec(rng.permutation(1 << 20)[:need])
        out[f"{sum(sizes)}_blocks"] = _time_cpu(lambda g=gpu, c=cpu: map_job(g, c, geom, store=True)) * 1e3
    return out


# --------------------------------------------------------------------------- run


def _plan(gpu: bool, quick: bool) -> tuple[list[int], list[int]]:
    """(page sizes in bytes, page counts per job)."""
    if gpu:
        page_kib = [4, 32] if quick else [4, 8, 16, 32, 64]
        counts = [1024, 4096] if quick else [1024, 4096, 16384]
    else:
        page_kib = [4, 32] if quick else [4, 16, 64]
        counts = [256] if quick else [256, 1024]
    return [k * KIB for k in page_kib], counts


def _summary(rows: list[dict[str, Any]], gpu: bool) -> dict[str, Any]:
    def pick(method: str, direction: str, lo: int, hi: int) -> list[dict[str, Any]]:
        return [
            r for r in rows if r["method"] == method and r["direction"] == direction and lo <= r["page_bytes"] <= hi
        ]

    out: dict[str, Any] = {}
    if gpu:
        for direction, target in (("pack", 0.9), ("unpack", 0.8)):
            sel = pick("triton", direction, 28 * KIB, 36 * KIB)
            if sel:
                ratios = [r["ratio_to_peak"] for r in sel]
                out[f"{direction}_ratio_at_32k"] = {
                    "min": min(ratios),
                    "median": statistics.median(ratios),
                    "target": target,
                    "met": min(ratios) >= target,
                }
            speedups = []
            for r in pick("triton", direction, 0, 24 * KIB):
                d = next(
                    (
                        x
                        for x in rows
                        if x["method"] == "dma"
                        and x["direction"] == direction
                        and x["shape"] == r["shape"]
                        and x["page_bytes"] == r["page_bytes"]
                        and x["pages"] == r["pages"]
                    ),
                    None,
                )
                if d:
                    speedups.append(r["gbps"] / d["gbps"])
            if speedups:
                out[f"{direction}_speedup_vs_dma_4_24k"] = {
                    "min": min(speedups),
                    "median": statistics.median(speedups),
                    "target": 5.0,
                    "met": min(speedups) >= 5.0,
                }
    else:
        for direction in ("pack", "unpack"):
            ratios = [r["ratio_to_peak"] for r in rows if r["method"] == "torch" and r["direction"] == direction]
            if ratios:
                out[f"{direction}_torch_vs_memcpy"] = {
                    "min": min(ratios),
                    "median": statistics.median(ratios),
                    "max": max(ratios),
                }
    return out


def run(quick: bool = False, max_programs: int = 16, verbose: bool = True) -> dict[str, Any]:
    """Run the benchmark on this machine's device and return the results (no file written)."""
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    rng = np.random.default_rng(1234)
    page_sizes, counts = _plan(gpu, quick)
    names = [n for n in (("triton", "dma", "torch") if gpu else ("torch",)) if n in available_backends(dev)]
    backends: dict[str, KernelBackend] = {}
    for n in names:
        be = get_backend(n, dev)
        if n == "triton":
            be = type(be)(num_programs=max_programs)  # type: ignore[call-arg]
        backends[n] = be
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    if not gpu:
        torch.set_num_threads(1)  # one core each side: stable on a shared CPU, same for both methods

    # one pinned (GPU) / pageable (CPU) host region reused by every case: room for 2x the largest job
    max_job = max(
        max(1, c // s.num_views) * s.num_views * s.block_size_for(p) * s.token_bytes
        for s in SHAPES
        for p in page_sizes
        for c in counts
    )
    pool = HostPool(1, 2 * max_job, device=dev, pin=True if gpu else False)
    rows: list[dict[str, Any]] = []
    verified: dict[str, dict[str, bool]] = {}  # "<shape>/<block_size>" -> backend -> byte-exact
    try:
        for shape in SHAPES:
            for page in page_sizes:
                bs = shape.block_size_for(page)
                num_blocks = 2 * max(max(1, c // shape.num_views) for c in counts)
                table = _make_table(shape, bs, num_blocks, dev)
                verified[f"{shape.name}/{bs}"] = _verify(table, pool.buffer, backends, rng)
                for c in counts:
                    case_rows = _bench_case(shape, bs, table, pool.buffer, c, backends, rng, gpu, quick)
                    rows += case_rows
                    if verbose:
                        for r in case_rows:
                            print(
                                f"{r['shape']:>8} page {r['page_bytes'] / KIB:6.2f} KiB x {r['pages']:6d} "
                                f"{r['direction']:>6} {r['method']:>7}: {r['gbps']:8.2f} GB/s "
                                f"({r['ratio_to_peak']:.2f} of {'P' if gpu else 'memcpy'})",
                                flush=True,
                            )
                del table
                if gpu:
                    torch.cuda.empty_cache()
    finally:
        pool.shutdown()
        torch.set_num_threads(threads)

    result: dict[str, Any] = {
        "mode": "gpu" if gpu else "cpu",
        "quick": quick,
        "device": common.gpu_name() if gpu else common.cpu_model(),
        "baseline": "peak: one cudaMemcpyAsync of the same bytes, contiguous GPU <-> pinned host"
        if gpu
        else "memcpy: Tensor.copy_ of the same bytes between contiguous CPU buffers",
        "max_programs": max_programs if "triton" in backends else None,
        "backends": list(backends),
        "verified": verified,
        "rows": rows,
        "summary": _summary(rows, gpu),
        "map_job_us": _map_job_overhead(quick),
        "elapsed_s": round(time.perf_counter() - t_start, 2),
    }
    if not gpu:
        result["note"] = (
            "CPU-only machine: one torch thread, best of several runs; triton runs only "
            "through the interpreter here (not timed); GPU figures need a CUDA machine"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes (CI / smoke runs)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default bench/results/<machine-slug>.json); merged by section",
    )
    parser.add_argument("--max-programs", type=int, default=16, help="triton program cap (SM budget)")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, max_programs=args.max_programs)
    path = common.write_section("transfer", result, args.out)
    for k, v in result["summary"].items():
        print(f"{k}: {v}")
    print(f"map_job host cost (us): {result['map_job_us']}")
    print(f"wrote {path} ({result['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
