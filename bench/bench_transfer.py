"""Transfer benchmark: pack (GPU pages -> pinned host records) and unpack, against honest baselines.

On a CUDA machine, for a Llama-8B-like cache (32 layers, flash-attn layout, K and V as separate
pages, 8 KV heads x 128, bf16) and an MLA-like cache (61 layers, 576-wide latent, bf16), page sizes
about 4, 8, 16, 32, 64 KiB and jobs of about 1k, 4k, 16k pages at random block permutations and
random host slots, it times in ONE run (``triton.testing.do_bench``, median, CUDA events):

* ``P``        -- one large ``cudaMemcpyAsync`` of the same bytes between a contiguous GPU buffer
  and pinned host memory: the link peak every figure is divided by;
* ``loop``     -- one ``cudaMemcpyAsync`` per page (what engines do today; the ``page_loop`` backend);
* ``batched``  -- every page copy of the job in ONE ``cuMemcpyBatchAsync`` (``cuda.bindings``;
  reported missing when it cannot be imported);
* ``direct``   -- kvoffload's Triton kernel reading/writing the pinned pool (``--max-programs``);
* ``staged``   -- copy engines + a GPU staging ring + the Triton kernel inside GPU memory;
* ``dma``      -- kvoffload's copy-engine-only path (coalesced copies, batched when possible).

Every row carries its ratio to ``P`` and to both baselines (``loop``, ``batched``) of the same case.
Targets: pack >= 0.9 P and unpack >= 0.8 P at 32 KiB, >= 0.6 P at 4 KiB; >= 5x the
per-page loop and >= 1.5x the batched copy at 4-24 KiB with >= 1k pages, using <= 16 programs.

On a CPU-only machine the same methods run on CPU tensors (the torch reference as the kernel,
plain copies as "DMA", ``memcpy`` of the same bytes as ``P``) at small sizes: this exercises the
code, it says nothing about a GPU.

Usage::

    python bench/bench_transfer.py [--quick] [--out PATH] [--plot PNG] [--max-programs N] [--budget-s S]

``run(quick, max_programs, verbose, budget_s) -> dict`` is the importable entry point (no file written).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

try:  # run as `python bench/bench_transfer.py` or imported with the repo root on sys.path
    from bench import common
    from bench.transfer_report import plot, summary
except ImportError:  # pragma: no cover - depends on how the file is launched
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import common  # type: ignore[no-redef]
    from transfer_report import plot, summary  # type: ignore[no-redef]

from kvoffload.kernels.config import launch_config
from kvoffload.kernels.copy_engine import BatchedCopies, CopyExecutor, TorchCopies, batched_copy_problem
from kvoffload.kernels.layout import KVCacheTable
from kvoffload.kernels.paths import DataPath
from kvoffload.kernels.registry import get_backend
from kvoffload.transfer.host_pool import HostPool
from kvoffload.transfer.worker_args import resolve_backend

__all__ = ["Shape", "SHAPES", "pool_bytes", "run", "main", "plot"]

KIB = 1024
Op = Callable[[KVCacheTable, torch.Tensor, np.ndarray, np.ndarray, np.ndarray], None]


@dataclass(frozen=True)
class Shape:
    """A model's KV cache: ``layers`` tensors of ``layout``; ``token_bytes`` per token per page."""

    name: str
    layout: Literal["flash_attn", "flashinfer", "mla"]
    layers: int
    token_dims: tuple[int, ...]  # dims after block_size
    dtype: torch.dtype

    @property
    def num_views(self) -> int:
        return self.layers * (2 if self.layout == "flash_attn" else 1)

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


def _job(rng: np.random.Generator, num_gpu_blocks: int, blocks: int, record_bytes: int, host_bytes: int) -> tuple:
    block_ids = rng.permutation(num_gpu_blocks)[:blocks].astype(np.int64)
    slots = rng.permutation(host_bytes // record_bytes)[:blocks].astype(np.int64)
    return block_ids, np.zeros(blocks, dtype=np.int32), slots * record_bytes


# --------------------------------------------------------------------------- methods


def _methods(dev: torch.device, max_programs: int, gpu: bool) -> tuple[dict[str, tuple[Op, Op]], dict[str, str]]:
    """name -> (pack, unpack) callables, and name -> why missing."""
    cfg = launch_config(dev).merged({"staging_bytes": 64 << 20} if gpu else {"staging_bytes": 1 << 20}, "bench")
    kernel = resolve_backend("triton" if gpu else "torch", dev, max_programs)
    paths: dict[str, tuple[KVCacheTable, DataPath]] = {}  # one DataPath per path, for the current table

    def data_path(path: str, table: KVCacheTable) -> DataPath:
        if path not in paths or paths[path][0] is not table:
            paths[path] = (table, DataPath(kernel, table, path, config=cfg))  # staging allocated here
        return paths[path][1]

    def via(path: str, to_host: bool) -> Op:
        def op(table: KVCacheTable, host: torch.Tensor, b: np.ndarray, g: np.ndarray, o: np.ndarray) -> None:
            dp = data_path(path, table)
            (dp.pack if to_host else dp.unpack)(host, b, g, o)

        return op

    def per_page(executor: CopyExecutor, to_host: bool) -> Op:
        """One copy per page through ``executor`` (the page list of the dma path, not coalesced)."""

        def op(table: KVCacheTable, host: torch.Tensor, b: np.ndarray, g: np.ndarray, o: np.ndarray) -> None:
            dp = data_path("dma", table)
            executor.run([host, *dp._spaces()[0]], dp.page_copies(b, g, o, to_host))

        return op

    methods: dict[str, tuple[Op, Op]] = {p: (via(p, True), via(p, False)) for p in ("direct", "staged", "dma")}
    missing: dict[str, str] = {}
    if gpu:
        loop = get_backend("page_loop", dev)
        methods["loop"] = (loop.pack, loop.unpack)
    else:
        methods["loop"] = (per_page(TorchCopies(), True), per_page(TorchCopies(), False))
    problem = batched_copy_problem() if gpu else "CPU-only machine"
    if problem is None:
        batched = BatchedCopies()
        methods["batched"] = (per_page(batched, True), per_page(batched, False))
    else:
        missing["batched"] = problem
    return methods, missing


# --------------------------------------------------------------------------- timing


def _time_cpu(fn: Callable[[], object], budget_s: float = 0.15, min_reps: int = 3, max_reps: int = 15) -> float:
    """Best wall time in ms after one warm-up call (robust to other processes on a shared CPU)."""
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


def _verify(
    table: KVCacheTable, pool: torch.Tensor, methods: dict[str, tuple[Op, Op]], rng: np.random.Generator
) -> dict[str, bool]:
    """Each method's pack of a few blocks then unpack into other blocks, checked against the pages."""
    group = table.groups[0]
    blocks = min(4, group.num_blocks // 2, pool.numel() // group.record_bytes)
    out = {}
    for name, (pack, unpack) in methods.items():
        ids, gids, offs = _job(rng, group.num_blocks, 2 * blocks, group.record_bytes, pool.numel())
        src, dst, offs, gids = ids[:blocks], ids[blocks:], offs[:blocks], gids[:blocks]
        for off in offs.tolist():
            pool[off : off + group.record_bytes].zero_()
        pack(table, pool, src, gids, offs)
        unpack(table, pool, dst, gids, offs)
        if table.device.type == "cuda":
            torch.cuda.synchronize(table.device)
        ok = True
        for s_id, d_id, off in zip(src.tolist(), dst.tolist(), offs.tolist(), strict=True):
            want = torch.cat([v.pages[s_id].cpu() for v in group.views])
            got = torch.cat([v.pages[d_id].cpu() for v in group.views])
            ok = ok and torch.equal(pool[off : off + group.record_bytes], want) and torch.equal(got, want)
        out[name] = ok
    return out


def _bench_case(
    shape: Shape,
    table: KVCacheTable,
    pool: torch.Tensor,
    pages: int,
    methods: dict[str, tuple[Op, Op]],
    rng: np.random.Generator,
    gpu: bool,
    quick: bool,
) -> list[dict[str, Any]]:
    group = table.groups[0]
    blocks = max(1, pages // shape.num_views)
    job = _job(rng, group.num_blocks, blocks, group.record_bytes, pool.numel())
    nbytes = blocks * group.record_bytes
    contiguous = torch.empty(nbytes, dtype=torch.uint8, device=table.device)
    host = pool[:nbytes]
    timer: Callable[[Callable[[], object]], float] = (lambda f: _time_gpu(f, quick)) if gpu else _time_cpu
    base = {
        "shape": shape.name,
        "page_bytes": group.views[0].page_bytes,
        "pages": blocks * shape.num_views,
        "blocks": blocks,
        "bytes": nbytes,
    }
    rows = []
    for direction in ("pack", "unpack"):
        to_host = direction == "pack"
        if to_host:
            peak_ms = timer(lambda: host.copy_(contiguous, non_blocking=gpu))
        else:
            peak_ms = timer(lambda: contiguous.copy_(host, non_blocking=gpu))
        case: list[dict[str, Any]] = [
            {**base, "direction": direction, "method": "P" if gpu else "memcpy", "ms": peak_ms}
        ]
        for name, ops in methods.items():
            ms = timer(functools.partial(ops[0] if to_host else ops[1], table, pool, *job))
            case.append({**base, "direction": direction, "method": name, "ms": ms})
        ref = {r["method"]: r["ms"] for r in case}
        for r in case:
            r["gbps"] = nbytes / r["ms"] / 1e6
            r["ratio_to_peak"] = peak_ms / r["ms"]
            for b in ("loop", "batched"):
                r[f"vs_{b}"] = ref[b] / r["ms"] if b in ref else None
        rows += case
    return rows


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


def pool_bytes(page_sizes: list[int], counts: list[int]) -> int:
    """The host pool a plan needs: twice its largest job (random slots of the pool per job)."""
    return 2 * max(
        max(1, c // s.num_views) * s.num_views * s.block_size_for(p) * s.token_bytes
        for s in SHAPES
        for p in page_sizes
        for c in counts
    )


def run(
    quick: bool = False, max_programs: int = 16, verbose: bool = True, budget_s: float | None = None
) -> dict[str, Any]:
    """Run the benchmark on this machine's device and return the results (no file written).

    ``budget_s``: stop starting new cases after this many seconds (the result says ``truncated``).
    """
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    rng = np.random.default_rng(1234)
    page_sizes, counts = _plan(gpu, quick)
    methods, missing = _methods(dev, max_programs, gpu)
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    if not gpu:
        torch.set_num_threads(1)  # one core: stable on a shared CPU, same for every method
    pool = HostPool(1, pool_bytes(page_sizes, counts), device=dev, pin=True if gpu else False)
    rows: list[dict[str, Any]] = []
    verified: dict[str, dict[str, bool]] = {}
    truncated = False
    stream_ctx = torch.cuda.stream(torch.cuda.Stream(dev)) if gpu else None  # batched copies need a non-default stream
    try:
        if stream_ctx is not None:
            stream_ctx.__enter__()
        for shape in SHAPES:
            for page in page_sizes:
                if budget_s is not None and time.perf_counter() - t_start > budget_s:
                    truncated = True
                    break
                bs = shape.block_size_for(page)
                table = _make_table(shape, bs, 2 * max(max(1, c // shape.num_views) for c in counts), dev)
                verified[f"{shape.name}/{bs}"] = _verify(table, pool.buffer, methods, rng)
                for c in counts:
                    case_rows = _bench_case(shape, table, pool.buffer, c, methods, rng, gpu, quick)
                    rows += case_rows
                    if verbose:
                        for r in case_rows:
                            vs = "  ".join(f"{b} {r[f'vs_{b}']:.2f}x" for b in ("loop", "batched") if r.get(f"vs_{b}"))
                            head = f"{r['shape']:>8} page {r['page_bytes'] / KIB:6.2f} KiB x {r['pages']:6d}"
                            head += f" {r['direction']:>6} {r['method']:>7}"
                            print(
                                f"{head}: {r['gbps']:8.2f} GB/s {r['ratio_to_peak']:.2f} P  {vs}",
                                flush=True,
                            )
                del table
                if gpu:
                    torch.cuda.empty_cache()
    finally:
        if stream_ctx is not None:
            stream_ctx.__exit__(None, None, None)
        pool.shutdown()
        torch.set_num_threads(threads)
    return {
        "mode": "gpu" if gpu else "cpu",
        "quick": quick,
        "device": common.gpu_name() if gpu else common.cpu_model(),
        "baseline": "P: one cudaMemcpyAsync of the same bytes, contiguous GPU <-> pinned host"
        if gpu
        else "memcpy: Tensor.copy_ of the same bytes between contiguous CPU buffers",
        "max_programs": max_programs,
        "methods": list(methods),
        "missing": missing,
        "verified": verified,
        "rows": rows,
        "summary": summary(rows, gpu),
        "truncated": truncated,
        "elapsed_s": round(time.perf_counter() - t_start, 2),
        **(
            {}
            if gpu
            else {"note": "CPU-only machine: CPU copies stand in for DMA, torch for the kernel; no GPU figure"}
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes (CI / smoke runs)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default bench/results/<machine-slug>.json); merged by section",
    )
    parser.add_argument("--plot", type=Path, default=None, help="also draw the figures into this PNG")
    parser.add_argument("--max-programs", type=int, default=16, help="triton program cap (SM budget)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new case after this many seconds")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, max_programs=args.max_programs, budget_s=args.budget_s)
    path = common.write_section("transfer", result, args.out)
    for k, v in result["summary"].items():
        print(f"{k}: {v}")
    if result["missing"]:
        print(f"missing baselines: {result['missing']}")
    if args.plot is not None:
        print(f"plot: {plot(result, args.plot)}")
    print(f"wrote {path} ({result['elapsed_s']} s{', truncated by the time budget' if result['truncated'] else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
