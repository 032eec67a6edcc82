"""The tier conformance suite's set-up: which harnesses it runs on, its fixtures and test data.

:mod:`kvoffload.testing.test_tier_conformance` imports these as its own (its ``harness`` and
``store`` fixtures, its ``pytest_generate_tests``); another test module can do the same to run the
suite on more harnesses (:func:`parametrize_harnesses`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest

from kvoffload.testing.redis_server import redis_binaries_problem
from kvoffload.testing.tier_harness import HARNESSES, TierHarness, harness_class
from kvoffload.testing.tier_steps import run_job
from kvoffload.testing.tier_steps import settle as _settle
from kvoffload.tiers import Tier, TierNamespace

__all__ = [
    "BUILTIN_HARNESSES",
    "NS",
    "OTHER_NS",
    "RB",
    "Opener",
    "harness",
    "harness_names",
    "parametrize_harnesses",
    "pytest_generate_tests",
    "records",
    "run",
    "settle",
    "store",
]

BUILTIN_HARNESSES = ("redis", "redis-cluster", "disk")
NS = TierNamespace("conformance/model@1", "float16", "float16", "flash_attn", (2, 16, 4, 64), 16)
OTHER_NS = TierNamespace("conformance/other-model@1", "float16", "float16", "flash_attn", (2, 16, 4, 64), 16)
RB = 2 * 4096 + 77  # record bytes: odd on purpose


def harness_names(config: pytest.Config) -> list[str]:
    """The harnesses chosen by option, environment, or default (every built-in)."""
    try:
        values = config.getoption("--kvoffload-tier")
    except ValueError:  # plugin not loaded
        values = None
    if values:
        return [v for v in values if v]
    raw = os.environ.get("KVOFFLOAD_TIER", "").strip()
    if raw:
        return [v.strip() for v in raw.split(",") if v.strip()]
    return list(BUILTIN_HARNESSES)


def parametrize_harnesses(metafunc: pytest.Metafunc, names: list[str]) -> None:
    """Parametrize ``harness_name`` over ``names`` (one pytest usage error for any unusable one)."""
    if "harness_name" not in metafunc.fixturenames:
        return
    bad = []
    for name in names:
        try:
            harness_class(name)
        except Exception as exc:  # noqa: BLE001 - collected into one usage error
            bad.append(f"{name!r}: {exc}")
    if bad:
        raise pytest.UsageError("unusable tier harness(es): " + "; ".join(bad))
    metafunc.parametrize("harness_name", names, scope="module")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_harnesses(metafunc, harness_names(metafunc.config))


@pytest.fixture(scope="module")
def harness(harness_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TierHarness]:
    cls = HARNESSES.get(harness_name)
    if cls.__module__ == "kvoffload.testing.tier_harness" and harness_name.startswith("redis"):
        problem = redis_binaries_problem()
        if problem is not None:
            if os.environ.get("KVOFFLOAD_REQUIRE_REDIS") == "1":
                pytest.fail(f"KVOFFLOAD_REQUIRE_REDIS=1 but {problem}")
            pytest.skip(problem)
    h = cls()
    h.setup(tmp_path_factory.mktemp(f"tier-{harness_name.replace(':', '-')}"))
    yield h
    h.teardown()


@pytest.fixture
def store(harness: TierHarness) -> Iterator[Opener]:
    harness.reset()
    opener = Opener(harness)
    yield opener
    opener.close_all()


class Opener:
    """Opens tiers on the harness's store and closes them after the test."""

    def __init__(self, harness: TierHarness) -> None:
        self.harness = harness
        self.tiers: list[Tier] = []

    def __call__(self, records: np.ndarray, namespace: TierNamespace = NS, **options: object) -> Tier:
        tier = self.harness.open(records, namespace, **options)
        self.tiers.append(tier)
        return tier

    def close_all(self) -> None:
        self.harness.resume() if self.harness.can_stall else None
        for t in self.tiers:
            t.close()


def records(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, RB), dtype=np.uint8)


#: the suite's waits are longer than kvoffload's own tier tests': a third-party store may be slower
settle = partial(_settle, timeout=20.0)
run = partial(run_job, drain_timeout=60.0)
