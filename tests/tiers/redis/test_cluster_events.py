"""A Redis Cluster of 3 masters + 3 replicas under the events a fleet meets: a master SIGKILLed
and its replica promoted, a graceful ``CLUSTER FAILOVER``, thousands of slots resharded while
two engines run, a slot left half-migrated (``ASK``).

Two engine processes (:mod:`tests.tiers.cluster_engine`) share the cluster through each event;
every loaded byte is checked. Each test asserts that nothing wrong was loaded, that no host-pool
slot was left pinned or reserved, that kvoffload
deleted nothing (its counter, and the servers' own command statistics: no ``EVAL``, its only
way to delete, reached any node), that no engine stopped, and that the stores made after the event landed and
load back exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from redis.crc import key_slot

from kvoffload.testing.redis_server import RedisCluster3
from kvoffload.testing.tier_steps import run_job
from kvoffload.tiers import RedisTier
from tests.tiers.cluster_engine import PER_STEP, RB, record_of, step_keys
from tests.tiers.conftest import NS, graceful_failover, served_slots, within
from tests.tiers.scenario_report import report

ROOT = Path(__file__).resolve().parents[3]
SETTLED = 1.0  # seconds after an event's end from which every store must land
AFTER_STEPS = 10  # steps each engine makes after SETTLED before it is stopped
EVENT_TIMEOUT = 60.0  # a loaded machine's cluster elects and gossips slowly


def _steps_since(out: Path, since: float) -> int:
    """How many steps the engine writing ``out`` has finished that began after ``since``."""
    steps = Path(f"{out}.steps")
    return sum(float(t) > since for t in steps.read_text().split()) if steps.exists() else 0


def _through_event(cl: RedisCluster3, tmp: Path, event: Callable[[], None]) -> list[dict]:
    """Two engine processes on ``cl`` before and during ``event()``, and after it until each has
    made :data:`AFTER_STEPS` steps that began :data:`SETTLED` seconds after its end; their results,
    each with ``event_done`` (wall-clock end of the event)."""
    stop = tmp / "stop"
    outs = [tmp / f"engine{i}.json" for i in range(2)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.tiers.cluster_engine", cl.url, str(stop), str(out)],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for out in outs
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{out}.ready").exists() for out in outs):  # both engines stored and loaded
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "an engine did not start"
            time.sleep(0.05)
        event()
        done = time.time()
        deadline = time.monotonic() + 120
        while not all(_steps_since(out, done + SETTLED) >= AFTER_STEPS for out in outs):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "an engine stopped stepping"
            time.sleep(0.05)
    finally:
        stop.touch()
    results = []
    for p, out in zip(procs, outs, strict=True):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err  # no engine stopped
        results.append({**json.loads(out.read_text()), "event_done": done})
    return results


def _check(name: str, cl: RedisCluster3, results: list[dict]) -> dict[str, int]:
    """The assertions every event shares; the counters summed over the engines (reported)."""
    after_keys: set[bytes] = set()
    for r in results:
        assert r["wrong"] == 0 and r["verified"] == r["loaded"] > 0 and r["leaked"] == 0
        st = r["stats"]
        assert st["corrupt"] == st["rejected_values"] == st["deleted_values"] == 0, st
        # stores after the event land. An engine learns the new topology from its first command
        # refused or redirected after the event (a refused one is dropped, and the slot map is
        # refreshed at most once per refresh interval): its first two steps after the event may
        # still meet the old map, however late a loaded machine lets it make them
        since = [step for step, (t, _) in enumerate(r["steps"]) if t > r["event_done"]]
        late = [step for step in since[2:] if r["steps"][step][0] > r["event_done"] + SETTLED]
        assert len(late) >= AFTER_STEPS - 2, r["steps"][since[0] :]
        assert all(r["steps"][step][1] == PER_STEP for step in late), r["steps"][since[0] :]
        for step in late:
            after_keys.update(step_keys(step))
    for n in cl.alive():  # kvoffload deletes with EVAL (compare-and-delete) only: none reached any node
        assert "cmdstat_eval:" not in n.cli("info", "commandstats")
    keys = sorted(after_keys)
    recs = np.zeros((len(keys), RB), dtype=np.uint8)
    with RedisTier(recs, NS, cl.url) as fresh:  # a fresh client with its own slot map
        assert run_job(fresh, "load", 1, keys, list(range(len(keys)))) == (True,) * len(keys)
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(recs[i], record_of(k))
    fields = ("blocks_written", "writes_skipped", "blocks_read", "absent", "rejected_values", "deleted_values")
    fields += ("redirected", "timed_out", "dropped_writes", "write_failures", "read_failures", "errors")
    counters = {f: sum(r["stats"][f] for r in results) for f in fields}
    counters["verified_loads"] = sum(r["verified"] for r in results)
    counters["stores_after_event_reloaded"] = len(keys)
    report(name, counters)
    return counters


def _until(cond: Callable[[], bool], timeout: float = EVENT_TIMEOUT) -> None:
    assert within(cond, timeout), "the event did not complete"


def _master_and_replica(cl: RedisCluster3) -> tuple[int, str, int]:
    port, node_id = next(iter(cl.masters().items()))
    return port, node_id, cl.replica_of(node_id).port


def test_master_sigkill_and_promotion_two_engines(cluster6: RedisCluster3, tmp_path: Path) -> None:
    port, node_id, replica = _master_and_replica(cluster6)

    def kill() -> None:
        cluster6.node(port).kill()
        _until(lambda: replica in cluster6.masters())  # the replica took over
        cluster6.wait_ok(EVENT_TIMEOUT)

    counters = _check("master SIGKILL + replica promotion", cluster6, _through_event(cluster6, tmp_path, kill))
    assert counters["dropped_writes"] + counters["write_failures"] > 0  # the dead master's keys missed


def test_graceful_failover_two_engines(cluster6: RedisCluster3, tmp_path: Path) -> None:
    port, _, replica = _master_and_replica(cluster6)
    served = served_slots(cluster6.node(port))
    recs = np.zeros((2 * PER_STEP, RB), dtype=np.uint8)
    # a client whose slot map predates the failover: the old master's keys go to it, and the
    # engines may learn the new map from a refused write before they ever meet a MOVED
    stale = RedisTier(recs, NS, cluster6.url, batch_keys=PER_STEP)  # one pipeline
    names = (f"stale-{i}".encode().ljust(36, b".") for i in range(10000))
    keys = [k for k in names if any(key_slot(stale.store_key(k)) in r for r in served)][:PER_STEP]
    for i, k in enumerate(keys):
        recs[i] = record_of(k)

    def failover() -> None:
        graceful_failover(cluster6, replica, port, EVENT_TIMEOUT)

    try:
        assert stale.contains(keys) == [False] * PER_STEP  # its slot map: the old master's
        results = _through_event(cluster6, tmp_path, failover)
        assert run_job(stale, "store", 1, keys, list(range(PER_STEP))) == (True,) * PER_STEP
        st = stale.stats()
    finally:
        stale.close()
    assert st.redirected == PER_STEP and st.dropped_writes == st.write_failures == st.deleted_values == 0
    with RedisTier(recs, NS, cluster6.url) as fresh:  # the old master answered MOVED: followed, nothing lost
        assert run_job(fresh, "load", 2, keys, list(range(PER_STEP, 2 * PER_STEP))) == (True,) * PER_STEP
    np.testing.assert_array_equal(recs[PER_STEP:], recs[:PER_STEP])
    _check("graceful CLUSTER FAILOVER", cluster6, results)


def test_reshard_thousands_of_slots_while_engines_run(cluster6: RedisCluster3, tmp_path: Path) -> None:
    masters = list(cluster6.masters().items())
    (src_port, src_id), (_, dst_id) = masters[0], masters[1]

    def reshard() -> None:
        subprocess.run(
            ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{src_port}", "--cluster-from", src_id,
             "--cluster-to", dst_id, "--cluster-slots", "3000", "--cluster-yes"],
            check=True, capture_output=True, timeout=240,
        )  # fmt: skip
        cluster6.wait_ok(EVENT_TIMEOUT)

    counters = _check("reshard of 3000 slots", cluster6, _through_event(cluster6, tmp_path, reshard))
    assert counters["redirected"] > 0


def test_half_migrated_slot_asks_and_nothing_is_lost(cluster6: RedisCluster3) -> None:
    masters = list(cluster6.masters().items())
    (a_port, a_id), (b_port, b_id) = masters[0], masters[1]
    a, b = cluster6.node(a_port), cluster6.node(b_port)
    recs = np.zeros((32, RB), dtype=np.uint8)
    # keys with one hash tag share a slot; pick a tag whose slot node A serves
    served = served_slots(a)
    tag = next(t for t in range(10000) if any(key_slot(f"{{t{t}}}".encode()) in r for r in served))
    keys = [f"{{t{tag}}}old-{j}".encode() for j in range(8)]
    new_keys = [f"{{t{tag}}}new-{j}".encode() for j in range(4)]
    for i, k in enumerate(keys + new_keys):
        recs[i] = record_of(k)
    with RedisTier(recs, NS, cluster6.url) as t:
        assert run_job(t, "store", 1, keys, list(range(8))) == (True,) * 8
        slot = key_slot(t.store_key(keys[0]))
        b.cli("cluster", "setslot", str(slot), "importing", a_id)
        a.cli("cluster", "setslot", str(slot), "migrating", b_id)
        moved = [t.store_key(k).decode() for k in keys[:4]]
        a.cli("migrate", "127.0.0.1", str(b_port), "", "0", "5000", "KEYS", *moved)
        # half the slot's keys on B, half on A: lookups, loads and stores of both halves
        assert t.contains(keys) == [True] * 8  # EXISTS, probed now
        assert run_job(t, "load", 2, keys, list(range(16, 24))) == (True,) * 8
        assert run_job(t, "store", 3, new_keys, list(range(8, 12))) == (True,) * 4  # absent on A: ASK to B
        st = t.stats()
    with RedisTier(recs, NS, cluster6.url) as fresh:
        assert run_job(fresh, "load", 4, new_keys, list(range(24, 28))) == (True,) * 4
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(recs[16 + i], record_of(k))
    for i, k in enumerate(new_keys):
        np.testing.assert_array_equal(recs[24 + i], record_of(k))
    assert int(b.cli("cluster", "countkeysinslot", str(slot))) == 8  # the new keys went to the importing node
    assert st.redirected >= 4 + 4 + 4 and st.deleted_values == st.rejected_values == st.absent == 0
    report(
        "slot left half-migrated (ASK)",
        {f: getattr(st, f) for f in ("blocks_written", "blocks_read", "absent", "redirected", "deleted_values")},
    )
