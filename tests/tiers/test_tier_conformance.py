"""The shipped tier conformance suite (:mod:`kvoffload.testing.test_tier_conformance`) on Redis,
Redis Cluster, disk, and an out-of-tree toy tier found by module path and by entry point."""

from __future__ import annotations

import pytest

from kvoffload.testing.test_tier_conformance import (
    BUILTIN_HARNESSES,
    harness,
    parametrize_harnesses,
    store,
    test_back_pressure_drops_stores_beyond_the_write_budget,
    test_concurrent_writers_of_one_key,
    test_drain_and_close,
    test_integrity_rejection,
    test_lookup_verdicts_retry_then_hit_or_miss,
    test_namespace_rejection,
    test_one_round_trip_per_step_whatever_the_keys,
    test_partial_success_per_key,
    test_records_outside_jobs_never_change,
    test_store_goes_away_and_comes_back,
    test_store_load_round_trip_bytes_exact,
)

__all__ = [
    "harness",
    "store",
    "test_back_pressure_drops_stores_beyond_the_write_budget",
    "test_concurrent_writers_of_one_key",
    "test_drain_and_close",
    "test_integrity_rejection",
    "test_lookup_verdicts_retry_then_hit_or_miss",
    "test_namespace_rejection",
    "test_one_round_trip_per_step_whatever_the_keys",
    "test_partial_success_per_key",
    "test_records_outside_jobs_never_change",
    "test_store_goes_away_and_comes_back",
    "test_store_load_round_trip_bytes_exact",
]

TOY = ("tests.tiers.toy_tier:ToyModulePathHarness", "tests.tiers.toy_tier:ToyEntryPointHarness")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_harnesses(metafunc, [*BUILTIN_HARNESSES, *TOY])
