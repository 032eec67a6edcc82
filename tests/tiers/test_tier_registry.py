"""The tier registry: one resolution of a tier spec for every caller; out-of-tree tiers by module path,
by registration and by entry point; typed errors before anything opens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvoffload.engine.reference.engine import Engine
from kvoffload.errors import BackendUnavailableError, InvalidArgumentError, InvalidTypeError
from kvoffload.testing.tier_steps import make_keys, run_job
from kvoffload.tiers import DiskTier, RedisTier, check_tier_spec, open_tier, register_tier, tier_schemes
from kvoffload.tiers.registry import resolve_tier, tier_options
from tests.tiers.conftest import NS, make_records
from tests.tiers.test_engine_tiers import CFG, _no_leak, _run
from tests.tiers.toy_tier import STORES, ToyTier, install_entry_point

ROOT = Path(__file__).resolve().parents[2]
TOY = {"type": "ToyTier", "module_path": "tests.tiers.toy_tier"}


def test_builtin_schemes_resolve_without_connecting() -> None:
    for url in ("redis://127.0.0.1:1", "rediss://h:2", "unix:///tmp/r.sock", "redis://a:1,b:2"):
        assert check_tier_spec(url) is RedisTier
    cls, kw = resolve_tier("disk:/tmp/x?max_bytes=10&o_direct=0", io_threads=2)
    assert cls is DiskTier and kw == {"path": "/tmp/x", "max_bytes": 10, "o_direct": False, "io_threads": 2}
    assert {"redis", "rediss", "unix", "disk"} <= set(tier_schemes())
    assert {"url", "cluster", "integrity_key", "io_threads", "lookup_ttl_steps"} <= tier_options(RedisTier)
    assert {"path", "max_bytes", "o_direct", "batch_keys"} <= tier_options(DiskTier)


@pytest.mark.parametrize(
    "spec, options, err, needle",
    [
        ("s3://bucket", {}, InvalidArgumentError, "unknown scheme 's3'; expected one of .*disk:.*redis:"),
        ("no-scheme", {}, InvalidArgumentError, "unknown scheme ''"),
        (42, {}, InvalidTypeError, "URL str or a dict"),
        ("redis://127.0.0.1:1", {"bogus": 1}, InvalidArgumentError, r"unknown option\(s\) \['bogus'\] for RedisTier"),
        ("disk:/tmp/x", {"url": "x"}, InvalidArgumentError, r"unknown option\(s\) \['url'\]"),
        ({"type": "ToyTier"}, {}, InvalidArgumentError, "'type' .* and 'module_path' .* go together"),
        ({"module_path": "tests.tiers.toy_tier"}, {}, InvalidArgumentError, "go together"),
        ({"io_threads": 2}, {}, InvalidArgumentError, "expected a 'url', or 'type' and 'module_path'"),
        ({"type": "Nope", "module_path": "tests.tiers.toy_tier"}, {}, InvalidArgumentError, "no attribute 'Nope'"),
        ({"type": "X", "module_path": "no.such.module"}, {}, BackendUnavailableError, "cannot import"),
        ({"type": "ToyStore", "module_path": "tests.tiers.toy_tier"}, {}, InvalidTypeError, "not a Tier subclass"),
        ({**TOY, "url": "toy:/x"}, {}, InvalidArgumentError, "<scheme>://<store>"),
        ({**TOY, "url": 3}, {}, InvalidTypeError, "'url' must be a str"),
    ],
)
def test_bad_specs_are_typed_errors(spec: object, options: dict, err: type, needle: str) -> None:
    with pytest.raises(err, match=needle):
        check_tier_spec(spec, **options)  # type: ignore[arg-type]


def test_unknown_option_is_refused_before_the_tier_opens() -> None:
    recs = make_records(2, 64, seed=1)
    with pytest.raises(InvalidArgumentError, match="bogus"):
        open_tier({**TOY, "url": "toy://refused", "bogus": True}, recs, NS)
    assert "toy://refused" not in STORES


def test_module_path_registration_and_options_reach_the_class() -> None:
    recs = make_records(4, 256, seed=2)
    with open_tier({**TOY, "url": "toy://mp", "batch_keys": 1}, recs, NS, io_threads=1) as t:
        assert type(t) is ToyTier and t.io_threads == 1 and t._batch_keys == 1
        assert run_job(t, "store", 1, make_keys(2), [0, 1]) == (True, True)
    register_tier("toyreg", ToyTier)
    register_tier("TOYREG", ToyTier)  # the same class again: a no-op (schemes are case-insensitive)
    with pytest.raises(InvalidArgumentError, match="toyreg.*replace=True"):
        register_tier("toyreg", RedisTier)
    with open_tier("toyreg://mp", recs, NS) as t:
        assert run_job(t, "load", 2, make_keys(2), [2, 3]) == (False, False)  # another store name
    with open_tier("ToyReg://mp2", recs, NS) as t:
        assert type(t) is ToyTier


def test_entry_point_scheme(tmp_path: Path) -> None:
    install_entry_point(tmp_path)
    assert "toy" in tier_schemes()
    src, dst = make_records(4, 512, seed=3), make_records(4, 512, seed=4)
    with open_tier("toy://ep", src, NS) as a, open_tier("toy://ep", dst, NS) as b:
        assert type(a) is ToyTier
        run_job(a, "store", 1, make_keys(3), [0, 1, 2])
        assert run_job(b, "load", 2, make_keys(3), [3, 2, 1]) == (True,) * 3
    np.testing.assert_array_equal(dst[[3, 2, 1]], src[[0, 1, 2]])


def test_reference_engine_resolves_tiers_through_the_registry() -> None:
    """``simulate`` / ``demo``'s engine opens an out-of-tree tier named by module path; a second engine
    loads what the first stored (every loaded block verified against the KV it computes)."""
    spec = {**TOY, "url": "toy://engine"}
    first = Engine(CFG, tiers=[spec])
    _run(first, seed=1)
    first.shutdown()
    e = Engine(CFG, tiers=[spec])
    try:
        _run(e, seed=1)
        assert e.stats.tier_blocks_loaded > 0 and e.stats.verification_failures == 0
        _no_leak(e)
    finally:
        e.shutdown()
    with pytest.raises(InvalidArgumentError, match="unknown scheme 'nope'"):
        Engine(CFG, tiers=["nope://x"])


def test_the_suite_fails_a_tier_that_loads_unchecked_values() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kvoffload.testing.plugin"]
    cmd += ["--pyargs", "kvoffload.testing.test_tier_conformance", "-rf"]
    cmd += ["--kvoffload-tier=tests.tiers.toy_tier:UncheckedToyHarness", "-k", "rejection or round_trip"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOFFLOAD_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    failed = set(re.findall(r"FAILED \S+::(test_\w+)", out))
    assert failed == {"test_namespace_rejection", "test_integrity_rejection"}, out[-3000:]
    assert re.search(r"\d+ failed, \d+ passed", out), out[-3000:]
