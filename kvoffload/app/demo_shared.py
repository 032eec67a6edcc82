"""``make demo-shared``: two engine replicas, in two processes, share one Redis tier.

Starts a local ``redis-server`` on a free port (:mod:`kvoffload.testing.redis_server`), writes a
random integrity key to a file (mode 600), runs ``kvoffload demo --tier
redis://127.0.0.1:<port>?integrity_key_file=<file>`` twice, one process after the other (replica 1
computes and writes its KV through to Redis; replica 2 starts with an empty GPU cache and host
pool), and prints how much replica 2 loaded from what replica 1 computed. The demo's KV is a
function of the tokens, their positions and the seed (:mod:`kvoffload.engine.reference.kvcache`), so replica 2
checks every block it loads against the KV it would have computed itself.

Usage: ``python -m kvoffload.app.demo_shared [--conversations N] [--keep DIR]``; exit status 0 when
replica 2 loaded blocks from the tier and every loaded block verified, 1 otherwise, 2 when
``redis-server`` is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoffload.app.logs import add_log_level_option, configure_logging
from kvoffload.testing.redis_server import RedisServer, redis_binaries_problem

__all__ = ["run_replica", "main"]


def run_replica(url: str, json_path: Path, extra: Sequence[str] = ()) -> tuple[dict[str, Any], float]:
    """Run ``kvoffload demo --tier url`` in a new process (its log lines pass through to stderr);
    its ``--json`` summary and wall seconds."""
    cmd = [sys.executable, "-m", "kvoffload", "demo", "--tier", url, "--no-progress", "--json", str(json_path)]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *extra], stdout=subprocess.PIPE, text=True, timeout=900)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{proc.stdout}")
    return json.loads(json_path.read_text()), secs


def _key_file(work: Path) -> Path:
    """A new random integrity key in ``work/integrity.key`` (mode 600), for both replicas."""
    path = work / "integrity.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


def _line(name: str, summary: dict[str, Any], secs: float) -> str:
    s, t = summary["stats"], summary["tiers"][0]
    return (
        f"{name}: {secs:5.1f} s ({s['wall_seconds']:.1f} s of engine steps); prompt tokens "
        f"{s['prompt_tokens']:,}: {s['prefill_gpu_hit_tokens']:,} GPU prefix cache, {s['prefill_loaded_tokens']:,} "
        f"loaded, {s['prefill_computed_tokens']:,} computed; tier: loaded {t['blocks_loaded']:,} blocks "
        f"({t['tokens_loaded']:,} tokens), wrote {t['blocks_written']:,} blocks ({t['tokens_written']:,} tokens)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-shared", description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=None, help="conversations per replica (demo default)")
    parser.add_argument("--keep", default=None, help="directory for the Redis files and both JSON summaries")
    add_log_level_option(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    problem = redis_binaries_problem()
    if problem is not None:
        print(f"demo-shared: needs Debian's redis-server: {problem}", file=sys.stderr)
        return 2
    extra = ["--log-level", args.log_level]
    extra += [] if args.conversations is None else ["--conversations", str(args.conversations)]
    with tempfile.TemporaryDirectory(prefix="kvoffload-shared-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        server = RedisServer(work / "redis", maxmemory="2gb").start()
        try:
            print(f"redis-server on {server.url} (maxmemory 2gb, allkeys-lru, no persistence)", flush=True)
            key_file = _key_file(work)
            print(f"both replicas sign and check every value with the integrity key in {key_file}", flush=True)
            url = f"{server.url}?integrity_key_file={key_file}"
            one, t1 = run_replica(url, work / "replica1.json", extra)
            print(_line("replica 1", one, t1), flush=True)
            two, t2 = run_replica(url, work / "replica2.json", extra)
            print(_line("replica 2", two, t2), flush=True)
            keys = int(server.cli("dbsize").strip() or 0)
        finally:
            server.stop()
    s2, tier2 = two["stats"], two["tiers"][0]
    geo = two["geometry"]
    written = one["tiers"][0]["blocks_written"]
    print(
        f"replica 2 loaded {tier2['blocks_loaded']:,} offloaded blocks ({tier2['tokens_loaded']:,} tokens, "
        f"{tier2['blocks_loaded'] * geo['offloaded_block_bytes'] / 2**20:,.0f} MiB) from the {written:,} that "
        f"replica 1 computed and wrote to Redis ({keys:,} values in Redis at the end); loads to the GPU of "
        f"blocks that came from the tier: {s2['tier_blocks_loaded']:,} (once per request that needed one)"
    )
    print(
        f"replica 2 prompt tokens loaded instead of computed: {s2['prefill_loaded_tokens']:,} of "
        f"{s2['prompt_tokens']:,} (replica 1: {one['stats']['prefill_loaded_tokens']:,}); computed "
        f"{s2['prefill_computed_tokens']:,} (replica 1: {one['stats']['prefill_computed_tokens']:,})"
    )
    rejected = [r["tiers"][0]["tier_stats"]["rejected_values"] for r in (one, two)]
    print(f"values refused by the integrity or format checks: {rejected[0]} (replica 1), {rejected[1]} (replica 2)")
    ok = s2["verification_failures"] == 0 and one["stats"]["verification_failures"] == 0 and rejected == [0, 0]
    print(
        f"verified: all {s2['verified_blocks']:,} GPU blocks written by replica 2's loads hold exactly the KV computed "
        "for them"
        if ok
        else f"VERIFICATION FAILED: {s2['verification_failures']:,} GPU blocks of replica 2 differ"
    )
    return 0 if ok and tier2["blocks_loaded"] > 0 and s2["tier_blocks_loaded"] > 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
