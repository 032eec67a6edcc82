"""Command line: ``python -m kvoffload info | demo | simulate | bench``.

Bad flag values (negative capacities, unknown policy, unreadable trace) print one line
``kvoffload: error: ...`` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from kvoffload.app.logs import add_log_level_option, configure_logging
from kvoffload.errors import KVOffloadError
from kvoffload.simulate.suite import SUITE
from kvoffload.simulate.sweep import DTYPE_BYTES, MODEL_SHAPES

#: ``simulate --gpu-blocks``: at most 2**22 16-token blocks (67M tokens: more than any GPU's KV cache)
MAX_GPU_BLOCKS = 2**22
#: ``simulate --conversations``: at most this many conversations of the generated chat workload
MAX_CONVERSATIONS = 10_000


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"kvoffload: error: {message}\n")


def _int_at_least(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (and <= ``maximum``; ``why``, said of a larger
    value, says why), else a one-line error."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if maximum is not None:
        what = f"an integer from {minimum} to {maximum:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {what}{why if value > minimum else ''}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _warmup_fraction(text: str) -> float:
    """An argparse type: a number in [0, 1), else a one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _capacity_list(text: str) -> list[tuple[float, str]]:
    from kvoffload.simulate.capacity import parse_capacity

    return [parse_capacity(part) for part in text.split(",") if part.strip()]


def _tier_capacity_list(text: str) -> list[tuple[float, str]]:
    from kvoffload.simulate.capacity import parse_tier_capacity

    return [parse_tier_capacity(part) for part in text.split(",") if part.strip()]


def _positive_int_list(text: str) -> list[int]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return [_positive_int(part) for part in items]


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _cmd_info(args: argparse.Namespace) -> int:
    from kvoffload.app.info import collect_info, format_info

    print(format_info(collect_info()))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from kvoffload.app.demo import run_demo

    return run_demo(args)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from kvoffload.simulate.cli import run_simulate

    return run_simulate(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from kvoffload.app.benchrun import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``kvoffload`` argument parser (sub-commands info, demo, simulate, bench)."""
    parser = _Parser(prog="kvoffload", description="Paged KV-cache offloading to a pinned CPU pool.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p_info = sub.add_parser("info", help="versions, device, usable kernel backends")
    p_info.set_defaults(func=_cmd_info)

    p_demo = sub.add_parser("demo", help="multi-turn chat through the reference engine, real KV bytes")
    p_demo.add_argument("--policy", default="lru", help="eviction policy name or module:Class (default lru)")
    p_demo.add_argument("--cpu-blocks", type=_positive_int, default=None, help="CPU tier capacity in offloaded blocks")
    p_demo.add_argument("--gpu-blocks", type=_positive_int, default=None, help="GPU KV capacity in GPU blocks")
    p_demo.add_argument("--backend", default=None, help="kernel backend: triton, torch, page_loop or module:Class")
    p_demo.add_argument("--conversations", type=_positive_int, default=None, help="number of conversations")
    p_demo.add_argument("--seed", type=_non_negative_int, default=0)
    p_demo.add_argument(
        "--threads", type=_positive_int, default=None, help="torch intra-op threads (default on CPU: 1)"
    )
    p_demo.add_argument(
        "--json", metavar="PATH", default=None, help="also write the summary as JSON (its folder is created)"
    )
    p_demo.add_argument(
        "--tier",
        action="append",
        metavar="SPEC",
        default=None,
        help="a secondary KV tier beneath the host pool, repeatable (first asked first): "
        "redis://host:6379, rediss://..., unix:///path.sock, redis://h1:p1,h2:p2 (cluster), disk:/path?max_bytes=N; "
        "options in the query, e.g. ?integrity_key_file=/etc/kvoffload/keys&io_threads=8",
    )
    p_demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_demo.set_defaults(func=_cmd_demo)

    p_sim = sub.add_parser(
        "simulate",
        help="how much host memory: share of prompt tokens loaded from the CPU tier vs capacity, per policy",
    )
    p_sim.add_argument(
        "--trace", default=None, help="JSONL trace (see docs/simulate.md); default: the demo's chat workload"
    )
    p_sim.add_argument(
        "--suite",
        choices=tuple(SUITE),
        default=None,
        help="a generated workload that breaks policies instead of a trace (kvoffload.simulate.suite; --seed applies)",
    )
    p_sim.add_argument(
        "--trace-format",
        choices=("auto", "kvoffload", "mooncake", "bailian"),
        default="auto",
        help="trace format (default auto: bailian when the first line has chat_id/parent_chat_id, mooncake when "
        "it has hash_ids/input_length)",
    )
    p_sim.add_argument(
        "--trace-block-size",
        type=_positive_int,
        default=None,
        help="tokens per hash_ids entry of a Mooncake trace, a multiple of 16 (default 512)",
    )
    p_sim.add_argument(
        "--replay",
        choices=("auto", "cache", "engine"),
        default="auto",
        help="cache: prompt blocks through the manager, with Belady and the infinite cache; engine: the reference "
        "engine (GPU prefix cache, concurrency, generated blocks); auto (default): engine up to 1M prompt tokens",
    )
    p_sim.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        help="processes for the cache-level and fleet sweeps (default: the usable cores, at most 8)",
    )
    p_sim.add_argument("--policies", default=None, help="comma-separated policies (default: all registered)")
    p_sim.add_argument(
        "--capacities",
        type=_capacity_list,
        default=None,
        help="comma-separated CPU-tier capacities: offloaded blocks (e.g. 256), host memory (e.g. 2GiB, 512MiB, "
        "1.5GB) or tokens (e.g. 3Mtok, 500Ktok); default: 1/16 to 2x the prompts' working set (engine replay) "
        "or 1/256 to 2x of it (cache-level replay)",
    )
    p_sim.add_argument(
        "--tier-capacity",
        type=_tier_capacity_list,
        action="append",
        default=None,
        help="shared tier beneath host memory (Redis, allkeys-lru), as --capacities (e.g. 64GiB or 20Mtok; 0: "
        "none); comma-separated or repeated: every host capacity is replayed with each, and without one "
        "(cache-level replay only)",
    )
    p_sim.add_argument(
        "--trace-block-view",
        type=_warmup_fraction,
        default=None,
        metavar="WARMUP",
        help="also print the infinite cache counted as trace-analysis tools count it: the trace's own blocks (512 "
        "tokens in a Mooncake trace), no cap at prompt - 1, over the whole trace and over the requests after the "
        "first WARMUP share of them (e.g. 0.5)",
    )
    fleet = p_sim.add_argument_group("fleet (cache-level replay across replicas behind a router)")
    fleet.add_argument(
        "--replicas",
        type=_positive_int_list,
        default=None,
        help="comma-separated replica counts (e.g. 1,4,8): replay across that many engines, each with its own host "
        "pool of every --capacities (per replica), over one shared --tier-capacity tier; fleet.csv/json/png",
    )
    fleet.add_argument(
        "--routing",
        type=_name_list,
        default=None,
        help="comma-separated routings compared in one report: random, round-robin, least-loaded, session, kv-aware, "
        "prefix (default random,least-loaded,session,kv-aware)",
    )
    fleet.add_argument(
        "--kv-weight",
        default=None,
        help="kv-aware routing: weight of the prefill blocks still to compute against the queued work, "
        "comma-separated to sweep (default 1; 0: shortest queue)",
    )
    fleet.add_argument(
        "--load-window",
        type=_positive_float,
        default=None,
        help="least-loaded's load: prompt tokens routed to a replica over this many seconds of trace time (60)",
    )
    fleet.add_argument(
        "--rate-scale",
        default=None,
        help="comma-separated multiples of the trace's arrival rate to time the fleets at (default 1)",
    )
    fleet.add_argument(
        "--ttft-target", default=None, help="TTFT p99 target for the replicas-needed table (default 2s; e.g. 500ms)"
    )
    fleet.add_argument(
        "--gpu", default=None, help="GPU profile: h100 (default), h200, or a JSON file (docs/simulate.md, A fleet)"
    )
    fleet.add_argument(
        "--prefill-tokens-per-s",
        type=_positive_float,
        default=None,
        help="prefill throughput per replica, overriding the GPU profile's (default for --model 8b on an H100: "
        "24.6K; required with --model-config)",
    )
    fleet.add_argument("--link-gbps", default=None, help="host-to-GPU link, GB/s per GPU (default: the GPU profile's)")
    fleet.add_argument("--tier-gbps", default=None, help="shared-tier read rate per replica, GB/s (default 10)")
    fleet.add_argument(
        "--chunk-tokens", type=_positive_int, default=None, help="chunked-prefill token budget per step (8192)"
    )
    shape = p_sim.add_argument_group("model shape (turns blocks into bytes)")
    shape.add_argument(
        "--model",
        choices=sorted(MODEL_SHAPES),
        default="8b",
        help="named shape (default 8b: 32 layers, 8 KV heads, head dim 128, bf16); the flags below override its fields",
    )
    shape.add_argument(
        "--model-config",
        default=None,
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json on disk (GQA, MLA, sliding-window hybrids) instead of --model",
    )
    shape.add_argument("--layers", type=_positive_int, default=None)
    shape.add_argument("--kv-heads", type=_positive_int, default=None)
    shape.add_argument("--head-dim", type=_positive_int, default=None)
    shape.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None)
    shape.add_argument(
        "--block-size", type=_positive_int, default=32, help="tokens per offloaded block, a multiple of 16 (default 32)"
    )
    p_sim.add_argument(
        "--gpu-blocks",
        type=_int_at_least(2, MAX_GPU_BLOCKS, " (more 16-token blocks than any GPU holds)"),
        default=None,
        help="GPU KV capacity in 16-token GPU blocks (engine replay)",
    )
    p_sim.add_argument(
        "--conversations",
        type=_int_at_least(1, MAX_CONVERSATIONS, " (the chat workload is a demo: a larger one is a --trace)"),
        default=None,
        help="conversations of the chat workload (default 128)",
    )
    p_sim.add_argument("--seed", type=_non_negative_int, default=0)
    p_sim.add_argument(
        "--out", default="simulate-out", help="directory for hit_rate.png, results.csv, results.json (./simulate-out)"
    )
    p_sim.add_argument(
        "--no-plot",
        dest="plot",
        action="store_false",
        help="write no PNG (hit_rate.png, fleet.png): matplotlib is not imported, the tables, CSV and JSON stay",
    )
    p_sim.set_defaults(func=_cmd_simulate)

    p_bench = sub.add_parser("bench", help="transfer, manager and scheduler benchmarks")
    p_bench.add_argument("--quick", action="store_true", help="small sizes (a minute or so)")
    p_bench.add_argument("--only", default=None, help="comma-separated subset of transfer,manager,scheduler")
    p_bench.add_argument("--out", default=None, help="results JSON path (default bench/results/<slug>.json)")
    p_bench.set_defaults(func=_cmd_bench)
    for p in (p_info, p_demo, p_sim, p_bench):
        add_log_level_option(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvoffload`` console script."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.func(args))
    except KVOffloadError as exc:
        print(f"kvoffload: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
