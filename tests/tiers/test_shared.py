"""Two engine processes share one tier: the second loads what the first stored, every byte verified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import redis

from kvoffload.core.lookup_code import LOOKUP_HIT
from kvoffload.testing.redis_server import RedisCluster3
from kvoffload.testing.tier_steps import make_keys, run_job, settle
from kvoffload.tiers import RedisTier
from tests.tiers.conftest import NS, make_records

ROOT = Path(__file__).resolve().parents[2]


def _process(role: str, spec: str, n: int, seed: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.tiers.share_worker", role, spec, str(n), str(seed)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _share(spec: str) -> None:
    assert _process("store", spec, 12, seed=21) == {"stored": 12}
    assert _process("load", spec, 12, seed=21) == {"hits": 12, "loaded": 12, "verified": 12, "untouched": 1}


def test_two_processes_share_a_redis_tier(redis_url: str) -> None:
    _share(redis_url)


def test_two_processes_share_a_redis_cluster(redis_cluster: RedisCluster3) -> None:
    for n in redis_cluster.nodes:
        n.cli("flushall")
    _share(redis_cluster.url + "?cluster=true")
    sizes = [int(n.cli("dbsize")) for n in redis_cluster.nodes]
    assert sum(sizes) == 12 and min(sizes) > 0  # the keys spread over the three shards


def test_two_processes_share_a_disk_tier(tmp_path: Path) -> None:
    _share(f"disk:{tmp_path}/kv")


def test_cluster_roundtrip_lookups_and_bad_value(redis_cluster: RedisCluster3) -> None:
    src = make_records(40, 8192, seed=22)
    keys = make_keys(40, b"cl")
    with RedisTier(src, NS, redis_cluster.url) as t:
        assert t.config.cluster
        assert run_job(t, "store", 1, keys, list(range(40))) == (True,) * 40
        assert (settle(t, keys) == LOOKUP_HIT).all()
        dst = np.zeros_like(src)
        with RedisTier(dst, NS, redis_cluster.url) as u:
            assert run_job(u, "load", 2, keys, list(range(40))) == (True,) * 40
            np.testing.assert_array_equal(dst, src)
            # a corrupt value on one shard fails that key only
            rc = redis.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
            rc.set(u.store_key(keys[7]), b"garbage")
            dst[:] = 0
            ok = run_job(u, "load", 3, keys, list(range(40)))
            assert ok == tuple(i != 7 for i in range(40))
            assert u.stats().rejected_values == 1 and rc.exists(u.store_key(keys[7])) == 0
            rc.close()
